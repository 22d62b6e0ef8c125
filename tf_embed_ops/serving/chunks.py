"""The servable's one pass over a delta's bytes: check all of it, then write its rows, a chunk at a time.

`apply_delta` (`servable`) checks the header and the segments' bounds first; then this pass reads, in order, the
checksum pieces, every table's rows (each row checked finite, each chunk's keys checked) and every table's rows
again, and writes the last ones chunk by chunk, each segment's short chunk first (`delta_reader.records`;
`scatter_update`; a dynamic table's chunk of keys inserted after its rows, their new slots marked used); last, each
dynamic table's evicted keys, chunk by chunk (removed, their slots marked released). Before the first write a
barrier asserts everything the pass checked (the checksum, the rows' finiteness, the keys: strictly ascending,
static ids in range, a dynamic table's keys not evicted and its new keys within its free slots; `content`, what the
servable checked itself), so a refused delta writes nothing, whichever chunk holds the fault; after the pass the
same checks gate what follows (a delta without rows).

Every operation on a delta's keys is one chunk's (a hash-table lookup, insert or removal, a search among the evicted
keys): a lookup that runs beside the apply waits for one chunk's operation at most, never for one over all the keys
(an operation over 100,000 keys takes milliseconds, and a concurrent lookup waited for all of it). Strictly
ascending keys make uniqueness and the evicted-key check chunk-local.

It is one `Dataset.scan` for all tables and all three parts, each table's part a branch of the step, because every
function in `apply_delta`'s graph costs memory to trace and save in each full version (a loop per table cost
several MB; a branch's functions are small). Memory while applying: one record (CHECKSUM_PIECE or
APPLY_CHUNK_BYTES) at a time.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_embed_ops.serving import delta_format as fmt
from tf_embed_ops.serving import delta_reader as reader

__all__ = ["SLOT_FREE", "SLOT_RELEASED", "SLOT_USED", "apply"]

# A dynamic table's slot states (`servable.MutableRowTable.state`, int8): a released slot's key was evicted; new
# keys take free and released slots alike, from the delta after the eviction on (new keys take the slots free when
# their delta starts).
SLOT_FREE, SLOT_USED, SLOT_RELEASED = 0, 1, 2

# Rows of the scan's per-table findings ([len(_FOUND), tables] int64): first positions (-1: none) and counts.
_FOUND = ("bad_row", "bad_order", "bad_id", "overlap", "new", "placed")
_ROW = {name: i for i, name in enumerate(_FOUND)}


def apply(path: Any, size: Any, length: Any, check: Any, plans: list, content: list, fail: Any) -> list:
    """Checks and writes the rows of a delta whose header and segments' bounds were checked.

    Args:
      path, size: the file and its size (checked).
      length: bytes after the preamble (the checksummed ones); check: the preamble's checksum.
      plans: one dict a table (`servable._check_table`), in the delta's order: name, kind ("static" or
        "dynamic"), rows_at, n, dim (>= 1), encoding, var, chunk_rows, keys (int64 [n]); a static table's vocab; a
        dynamic table's index, state (its slot-state variable), capacity, m, evicted (int64 [m]), evicted_at (their
        offset in the file), free (its free slots, in the order new keys take them) and available (their count).
      content: [(ok, message parts)]: checks that hold only for an intact file (asserted once the checksum holds).
      fail: `servable._fail`.

    Returns:
      The assertions of every check over the whole file (control dependencies of what the apply writes next).
    """
    segments = [reader.records(path, size, fmt.PREAMBLE, length, fmt.CHECKSUM_PIECE)]
    counts = [(length + fmt.CHECKSUM_PIECE - 1) // fmt.CHECKSUM_PIECE]
    for _ in ("check", "write"):
        for p in plans:
            row_bytes = p["dim"] * p["encoding"].size
            segments.append(reader.records(path, size, p["rows_at"], p["n"] * row_bytes, p["chunk_rows"] * row_bytes))
            counts.append((p["n"] + p["chunk_rows"] - 1) // p["chunk_rows"])
    for p in plans:  # a dynamic table's evicted keys, chunk_rows at a time, once every table's rows are written
        if p["kind"] == "dynamic":
            segments.append(reader.records(path, size, p["evicted_at"], p["m"] * 8, p["chunk_rows"] * 8))
            counts.append((p["m"] + p["chunk_rows"] - 1) // p["chunk_rows"])
        else:
            counts.append(0)
    counts = tf.stack([tf.cast(c, tf.int64) for c in counts])
    ends = tf.cumsum(counts)
    starts = ends - counts
    records = segments[0]
    for segment in segments[1:]:
        records = records.concatenate(segment)
    num = len(plans)

    def verdicts(summed_ok, found):
        """The assertions of every check (the checksum's alone when it fails)."""
        intact = tf.logical_not(summed_ok)
        out = [fail(summed_ok, path, "checksum mismatch (the file is corrupted)")]
        checks = list(content)
        for t, p in enumerate(plans):
            checks += _table_checks(p, found[:, t])
        for ok, message in checks:
            out.append(fail(tf.logical_or(intact, ok), path, *message))
        return out

    def barrier(summed_ok, found, first_write):
        """The verdicts, asserted at the first step that writes (the check part is over: later steps write past
        it); elsewhere a no-op. A branch, so that the other steps skip building their messages."""

        def asserted():
            with tf.control_dependencies(verdicts(summed_ok, found)):
                return tf.constant(True)

        return tf.cond(first_write, asserted, lambda: tf.constant(True))

    def first_row(p, local):
        """The first row of a table's record `local`: a short record (the rows' remainder modulo chunk_rows) comes
        first (`reader.records`), so record `local` starts `pad` rows short of `local` full chunks."""
        pad = (p["chunk_rows"] - p["n"] % p["chunk_rows"]) % p["chunk_rows"]
        return tf.maximum(local * p["chunk_rows"] - pad, 0)

    def step(state, element):
        digests, found = state
        i, record = element
        segment = tf.searchsorted(ends, tf.reshape(i, [1]), side="right", out_type=tf.int64)[0]
        local = i - tf.gather(starts, segment)
        piece = tf.equal(segment, 0)
        empty = tf.constant(b"")
        digest = reader.bytes_of(tf.fingerprint(tf.reshape(tf.where(piece, record, empty), [1]), "farmhash64")[0])
        digests = tf.where(piece, tf.strings.join([digests, digest]), digests)
        summed = tf.bitcast(tf.fingerprint(tf.reshape(digests, [1]), "farmhash64"), tf.int64)[0]
        # Each table's part of the step runs only in its own segment (a branch: the other tables' ops would cost
        # every step several microseconds each).
        checked = []
        for t, p in enumerate(plans):

            def check_part(p=p, t=t):
                rows = tf.reshape(tf.io.decode_raw(record, p["encoding"]), [-1, p["dim"]])
                return _check_chunk(p, first_row(p, local), rows, found[:, t])

            checked.append(tf.cond(tf.equal(segment, 1 + t), check_part, lambda t=t: found[:, t]))
        found = tf.stack(checked, axis=1) if plans else found
        summed_ok = tf.equal(summed, check)
        placed = []
        with tf.control_dependencies([barrier(summed_ok, found, tf.equal(i, ends[num]))]):
            for t, p in enumerate(plans):

                def write_part(p=p, t=t):
                    rows = tf.reshape(tf.io.decode_raw(record, p["var"].dtype), [-1, p["dim"]])
                    return _write_chunk(p, first_row(p, local), rows, found[_ROW["placed"], t])

                def evict_part(p=p):
                    return _evict_chunk(p, tf.io.decode_raw(record, tf.int64))

                new = tf.cond(tf.equal(segment, 1 + num + t), write_part, lambda: tf.constant(0, tf.int64))
                if p["kind"] == "dynamic":
                    new += tf.cond(tf.equal(segment, 1 + 2 * num + t), evict_part, lambda: tf.constant(0, tf.int64))
                placed.append(found[_ROW["placed"], t] + new)
        if plans:
            found = tf.tensor_scatter_nd_update(found, [[_ROW["placed"], t] for t in range(num)], tf.stack(placed))
        out = tf.concat([[tf.cast(summed_ok, tf.int64)], tf.reshape(found, [-1])], 0)
        return (digests, found), out

    initial = [tf.constant(-1, tf.int64) if name.startswith("bad") else tf.constant(0, tf.int64) for name in _FOUND]
    initial = (tf.constant(b""), tf.tile(tf.reshape(tf.stack(initial), [-1, 1]), [1, num]))
    outs = reader.scan_records(records, initial, step, tf.zeros([0, 1 + len(_FOUND) * num], tf.int64))
    last = outs[-1]  # the first record is a checksum piece: there is always one
    found = tf.reshape(last[1:], [len(_FOUND), num])
    return verdicts(tf.equal(last[0], 1), found)


def _first(bad: tf.Tensor) -> tf.Tensor:
    """The index of the first True of a bool vector, -1 when there is none."""
    at = tf.argmax(tf.concat([tf.cast(bad, tf.int32), [1]], 0), output_type=tf.int64)
    return tf.where(at < tf.size(bad, out_type=tf.int64), at, -1)


def _keep_first(known: tf.Tensor, offset: tf.Tensor, at: tf.Tensor) -> tf.Tensor:
    """A first position found so far (`known`, -1: none), or this chunk's (`offset + at`, when `at` >= 0)."""
    return tf.where(tf.logical_and(known < 0, at >= 0), offset + at, known)


def _check_chunk(p: dict, start: tf.Tensor, rows: tf.Tensor, found: tf.Tensor) -> tf.Tensor:
    """One record's checks for its table (its rows and their keys): the table's column of findings, updated."""
    r = tf.shape(rows, out_type=tf.int64)[0]
    keys = p["keys"][start : start + r]
    bad_row = _keep_first(
        found[_ROW["bad_row"]], start, _first(tf.logical_not(tf.reduce_all(tf.math.is_finite(rows), 1)))
    )
    # Strictly ascending, with the key before the chunk: unique keys, and the evicted keys' search below.
    before = tf.maximum(start - 1, 0)
    window = p["keys"][before : start + r]
    bad_order = _keep_first(found[_ROW["bad_order"]], before + 1, _first(window[1:] <= window[:-1]))
    bad_id, overlap, new = found[_ROW["bad_id"]], found[_ROW["overlap"]], found[_ROW["new"]]
    if p["kind"] == "static":
        bad_id = _keep_first(bad_id, start, _first(tf.logical_or(keys < 0, keys >= p["vocab"])))
    else:
        evicted = p["evicted"]
        at = tf.searchsorted(evicted, keys, side="left", out_type=tf.int64)
        inside = at < tf.size(evicted, out_type=tf.int64)  # gathered alone: the evicted keys are never copied
        hits = tf.equal(tf.gather(evicted, tf.boolean_mask(at, inside)), tf.boolean_mask(keys, inside))
        overlap += tf.reduce_sum(tf.cast(hits, tf.int64))
        new += tf.reduce_sum(tf.cast(tf.equal(p["index"].lookup(keys), p["capacity"]), tf.int64))
    return tf.stack([bad_row, bad_order, bad_id, overlap, new, found[_ROW["placed"]]])


def _write_chunk(p: dict, start: tf.Tensor, rows: tf.Tensor, placed: tf.Tensor) -> tf.Tensor:
    """Writes one record's rows; returns the number of new keys it inserted, once written. A dynamic table's new
    keys take the next free slots, in the keys' order; its keys are inserted once their rows are in place."""
    r = tf.shape(rows, out_type=tf.int64)[0]
    keys = p["keys"][start : start + r]
    if p["kind"] == "static":
        with tf.control_dependencies([p["var"].scatter_update(tf.IndexedSlices(rows, keys))]):
            return tf.constant(0, tf.int64)
    existing = p["index"].lookup(keys)
    is_new = tf.equal(existing, p["capacity"])
    # The new keys' ranks among the delta's new keys index the free slots (in bounds: the checks passed).
    rank = placed + tf.cumsum(tf.cast(is_new, tf.int64), exclusive=True)
    new_at = tf.where(is_new)
    at = tf.tensor_scatter_nd_update(existing, new_at, tf.gather(p["free"], tf.gather_nd(rank, new_at)))
    done = p["var"].scatter_update(tf.IndexedSlices(rows, at))
    with tf.control_dependencies([done]):  # the chunk's rows are in place before its keys appear
        done = p["index"].insert(keys, at)
    with tf.control_dependencies([done]):
        taken = tf.gather_nd(at, new_at)
        done = p["state"].scatter_nd_update(
            taken[:, tf.newaxis], tf.fill(tf.shape(taken), tf.constant(SLOT_USED, tf.int8))
        )
    with tf.control_dependencies([done]):
        return tf.size(taken, out_type=tf.int64)


def _evict_chunk(p: dict, evicted: tf.Tensor) -> tf.Tensor:
    """Removes one record's evicted keys and marks their slots released (free from the next delta on: a lookup that
    found a key an instant before its removal still reads its row); returns 0 (new keys), once done."""
    gone = tf.reshape(p["index"].lookup(evicted), [-1])
    with tf.control_dependencies([gone]):
        removed = p["index"].remove(evicted)
    released = tf.boolean_mask(gone, tf.not_equal(gone, p["capacity"]))  # keys the table did not hold: ignored
    with tf.control_dependencies([removed]):
        marked = p["state"].scatter_nd_update(
            released[:, tf.newaxis], tf.fill(tf.shape(released), tf.constant(SLOT_RELEASED, tf.int8))
        )
    with tf.control_dependencies([marked]):
        return tf.constant(0, tf.int64)


def _key_at(keys: tf.Tensor, i: tf.Tensor) -> tf.Tensor:
    """keys[i] for a message (0 when i is outside the keys): a slice, never a copy of the keys (checked each step)."""
    return tf.concat([keys[tf.maximum(i, 0) : tf.maximum(i, 0) + 1], [0]], 0)[0]


def _table_checks(p: dict, found: tf.Tensor) -> list:
    """A table's content checks from its column of findings: [(ok, message parts)]."""
    name, keys = p["name"], p["keys"]
    what = "row ids" if p["kind"] == "static" else "keys"
    order = found[_ROW["bad_order"]]
    checks = [
        (
            order < 0,
            [
                f"table {name}: {what} not strictly ascending: ",
                _key_at(keys, order),
                " at ",
                order,
                " (0-based) after ",
                _key_at(keys, order - 1),
            ],
        ),
        (
            found[_ROW["bad_row"]] < 0,
            [
                f"table {name}: row ",
                found[_ROW["bad_row"]],
                " of the delta (0-based, in the delta's order) is not finite (NaN or infinity)",
            ],
        ),
    ]
    if p["kind"] == "static":
        bad = found[_ROW["bad_id"]]
        checks.append((bad < 0, [f"table {name}: row id ", _key_at(keys, bad), f" outside [0, {p['vocab']})"]))
        return checks
    overlap, new = found[_ROW["overlap"]], found[_ROW["new"]]
    checks += [
        (tf.equal(overlap, 0), [f"table {name}: ", overlap, " keys are both written and evicted"]),
        (
            new <= p["available"],
            [
                f"table {name}: ",
                new,
                " new keys, only ",
                p["available"],
                f" free slots of {p['capacity']} (publish a full version)",
            ],
        ),
    ]
    return checks
