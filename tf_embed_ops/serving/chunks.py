"""The servable's one pass over a delta's bytes: check all of it, then write its rows, a chunk at a time.

`apply_delta` (`servable`) checks the header and the segments' bounds first; then this pass reads, in order, the
checksum pieces, every table's rows (each row checked finite) and every table's rows again, and writes the last
ones chunk by chunk, each segment's short chunk first (`delta_reader.records`; `scatter_update`; a dynamic table's
chunk of keys inserted after its rows). Before the first write a barrier asserts everything the pass checked (the
checksum, the rows' finiteness, the content checks the servable computed from keys: ids in range, unique keys,
free slots...), so a refused delta writes nothing, whichever chunk holds the fault; after the pass the same checks
gate what follows (a delta without rows).

It is one `Dataset.scan` for all tables and both halves: each step decodes its record for every table with a
length of zero outside that table's segment (no branch), because every function in `apply_delta`'s graph costs
memory to trace and save in each full version (a loop per table cost several MB). Memory while applying: one
record (CHECKSUM_PIECE or APPLY_CHUNK_BYTES) at a time.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_embed_ops.serving import delta_format as fmt
from tf_embed_ops.serving import delta_reader as reader

__all__ = ["apply"]


def apply(path: Any, size: Any, length: Any, check: Any, plans: list, content: list, fail: Any) -> list:
    """Checks and writes the rows of a delta whose header and segments' bounds were checked.

    Args:
      path, size: the file and its size (checked).
      length: bytes after the preamble (the checksummed ones); check: the preamble's checksum.
      plans: one dict a table (`servable._check_table`): name, rows_at, n, dim, encoding, var, chunk_rows, slots,
        keys and index (dynamic tables), in the delta's order.
      content: [(ok, message parts)]: checks that hold only for an intact file (asserted once the checksum holds).
      fail: `servable._fail`.

    Returns:
      The assertions of every check over the whole file (control dependencies of what the apply writes next).
    """
    tables = [p for p in plans if p["dim"] > 0]
    segments = [reader.records(path, size, fmt.PREAMBLE, length, fmt.CHECKSUM_PIECE)]
    counts = [(length + fmt.CHECKSUM_PIECE - 1) // fmt.CHECKSUM_PIECE]
    for _ in ("check", "write"):
        for p in tables:
            row_bytes = p["dim"] * p["encoding"].size
            segments.append(reader.records(path, size, p["rows_at"], p["n"] * row_bytes, p["chunk_rows"] * row_bytes))
            counts.append((p["n"] + p["chunk_rows"] - 1) // p["chunk_rows"])
    counts = tf.stack([tf.cast(c, tf.int64) for c in counts])
    ends = tf.cumsum(counts)
    starts = ends - counts
    records = segments[0]
    for segment in segments[1:]:
        records = records.concatenate(segment)
    num = len(tables)

    def verdicts(summed_ok, bad, writing):
        """The assertions, vacuous unless `writing` (a row is about to be written, or the pass is over)."""
        idle = tf.logical_not(writing)
        intact = tf.logical_not(summed_ok)  # when the checksum fails, it alone is reported
        out = [fail(tf.logical_or(idle, summed_ok), path, "checksum mismatch (the file is corrupted)")]
        for t, p in enumerate(tables):
            out.append(
                fail(
                    tf.logical_or(tf.logical_or(idle, intact), bad[t] < 0),
                    path,
                    f"table {p['name']}: row ",
                    bad[t],
                    " of the delta (0-based, in the delta's order) is not finite (NaN or infinity)",
                )
            )
        for ok, message in content:
            out.append(fail(tf.logical_or(tf.logical_or(idle, intact), ok), path, *message))
        return out

    def first_row(p, local):
        """The first row of a table's record `local`: a short record (the rows' remainder modulo chunk_rows) comes
        first (`reader.records`), so record `local` starts `pad` rows short of `local` full chunks."""
        pad = (p["chunk_rows"] - p["n"] % p["chunk_rows"]) % p["chunk_rows"]
        return tf.maximum(local * p["chunk_rows"] - pad, 0)

    def step(state, element):
        digests, bad = state
        i, record = element
        segment = tf.searchsorted(ends, tf.reshape(i, [1]), side="right", out_type=tf.int64)[0]
        local = i - tf.gather(starts, segment)
        whole = tf.strings.length(record)

        def part(active):
            return tf.strings.substr(record, 0, tf.where(active, whole, 0))

        piece = tf.equal(segment, 0)
        digest = reader.bytes_of(tf.fingerprint(tf.reshape(part(piece), [1]), "farmhash64")[0])
        digests = tf.where(piece, tf.strings.join([digests, digest]), digests)
        summed = tf.bitcast(tf.fingerprint(tf.reshape(digests, [1]), "farmhash64"), tf.int64)[0]
        found = []
        for t, p in enumerate(tables):
            rows = tf.reshape(tf.io.decode_raw(part(tf.equal(segment, 1 + t)), p["encoding"]), [-1, p["dim"]])
            ok = tf.cast(tf.reduce_all(tf.math.is_finite(rows), axis=1), tf.int32)
            first = tf.argmin(tf.concat([ok, [0]], 0), output_type=tf.int64)
            new = tf.logical_and(bad[t] < 0, first < tf.size(ok, out_type=tf.int64))
            found.append(tf.where(new, first_row(p, local) + first, bad[t]))
        bad = tf.stack(found) if tables else bad
        summed_ok = tf.equal(summed, check)
        writes = []
        with tf.control_dependencies(verdicts(summed_ok, bad, segment > num)):
            for t, p in enumerate(tables):
                var = p["var"]
                rows = tf.reshape(tf.io.decode_raw(part(tf.equal(segment, 1 + num + t)), var.dtype), [-1, p["dim"]])
                start = first_row(p, local)
                at = p["slots"][start : start + tf.shape(rows, out_type=tf.int64)[0]]
                done = var.scatter_update(tf.IndexedSlices(rows, at))
                if p["index"] is not None:  # the chunk's rows are in place before its keys appear
                    with tf.control_dependencies([done]):
                        done = p["index"].insert(p["keys"][start : start + tf.size(at, out_type=tf.int64)], at)
                writes.append(done)
        with tf.control_dependencies(writes):
            out = tf.concat([[tf.cast(summed_ok, tf.int64)], bad], 0)
        return (digests, bad), out

    initial = (tf.constant(b""), tf.fill([num], tf.constant(-1, tf.int64)))
    outs = reader.scan_records(records, initial, step, tf.zeros([0, 1 + num], tf.int64))
    last = outs[-1]  # the first record is a checksum piece: there is always one
    final = verdicts(tf.equal(last[0], 1), last[1:], tf.constant(True))
    # A dynamic table without rows (dim 0): its keys, once everything holds.
    with tf.control_dependencies(final):
        for p in plans:
            if p["dim"] == 0 and p["index"] is not None:
                final.append(p["index"].insert(p["keys"], p["slots"]))
    return final
