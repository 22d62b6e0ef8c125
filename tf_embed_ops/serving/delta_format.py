"""The delta file: the rows a training run changed since the previous version, as stock TensorFlow reads them.

A delta is one file, read by the servable range by range with `tf.data.FixedLengthRecordDataset`,
`tf.io.decode_raw` and `tf.fingerprint` only (no JSON, no proto parser; `delta_reader`), so that a process without
`tf_embed_ops` validates and applies it. All integers are little-endian.

    offset  size  field
    0       8     magic  b"TFEDELTA"
    8       8     int64  format version (FORMAT_VERSION)
    16      8     int64  H, the header's size in bytes (a multiple of 8)
    24      8     int64  B, the payload's size in bytes
    32      8     int64  checksum (see `checksum`) of the H + B bytes that follow
    40      H     int64[H / 8] header (below)
    40 + H  B     payload: raw segments addressed by the header (offsets relative to the payload's start)

The header, in int64 words:

    0 model id       fingerprint of the chain's model id (a delta of another model is refused)
    1 layout id      fingerprint of the servable's table and dense-variable layout (`layout_id`)
    2 version        the version this delta makes
    3 base version   the version it applies to (the servable must serve exactly that one)
    4 step           the training step it was taken at (informative)
    5 T              number of tables (the servable's, in its order)
    6 D              number of dense variables carried (0, or all of the servable's)
    7 + 8 t ...      per table t: dim, row encoding, rows n, evicted m, keys offset, rows offset, evicted offset,
                     rows bytes
    7 + 8 T + 2 d    per dense variable d: offset, bytes

A table's segments: keys int64[n] (a static table's row ids, a dynamic table's keys), rows [n, dim] in the row
encoding (ROW_ENCODINGS: the table's storage dtype; a quantized encoding would add its per-row scale/offset
segment here), evicted keys int64[m] (dynamic tables only). A dense variable's segment is its whole value in its
dtype. The header addresses every segment; `write_delta` puts every table's keys and evicted keys first, then the
dense weights, then the tables' rows (format version 1 wrote each table's keys, rows and evicted keys together).

The checksum is TensorFlow's farmhash64 (`tf.fingerprint`, stable across platforms and releases) of the
concatenated farmhash64 values of consecutive pieces: the first one the H + B bytes' remainder modulo
CHECKSUM_PIECE (when not 0), then CHECKSUM_PIECE-byte pieces to the end. The servable verifies it piece by piece so
that checking a delta never copies it whole; the short piece comes first because a stock record reader reaches an
offset by reading every byte before it, so a short piece at the end of the file would cost a pass over the file.
(Format version 1 had the short piece last.)
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops.formats import atomic_write

__all__ = [
    "CHECKSUM_PIECE",
    "FORMAT_VERSION",
    "HEADER_FIXED",
    "MAGIC",
    "PREAMBLE",
    "ROW_ENCODINGS",
    "TABLE_FIELDS",
    "TableDelta",
    "checksum",
    "fingerprint64",
    "read_delta",
    "write_delta",
]

MAGIC = b"TFEDELTA"
FORMAT_VERSION = 2
PREAMBLE = 40
HEADER_FIXED = 7
TABLE_FIELDS = 8
DENSE_FIELDS = 2
CHECKSUM_PIECE = 1 << 20
# Row encoding codes: the storage dtype of a table's rows in the delta. Quantized encodings (int8/int4 with a
# per-row scale) take the next codes; the servable refuses a code it was not exported with.
ROW_ENCODINGS = {"float32": 0, "bfloat16": 1, "float16": 2}


def fingerprint64(text: str) -> int:
    """farmhash64 of a UTF-8 string as a signed int64 (the header's model and layout ids)."""
    value = tf.fingerprint(tf.constant([text.encode()]), "farmhash64")
    return int(tf.bitcast(value, tf.int64).numpy()[0])


def checksum(data: bytes) -> int:
    """The delta checksum of `data` (see the module docstring), as a signed int64."""
    head = len(data) % CHECKSUM_PIECE
    pieces = ([data[:head]] if head else []) + [
        data[i : i + CHECKSUM_PIECE] for i in range(head, len(data), CHECKSUM_PIECE)
    ]
    pieces = pieces or [b""]
    digests = tf.fingerprint(tf.constant(pieces), "farmhash64")  # [p, 8] uint8, one farmhash64 per piece
    joined = tf.reshape(digests, [-1]).numpy().tobytes()
    return int(tf.bitcast(tf.fingerprint(tf.constant([joined]), "farmhash64"), tf.int64).numpy()[0])


class TableDelta:
    """One table's part of a delta: keys int64[n], rows [n, dim] in the encoding's dtype, evicted int64[m]."""

    def __init__(self, keys: Any, rows: Any, evicted: Any = None, encoding: str = "float32", dim: int | None = None):
        if encoding not in ROW_ENCODINGS:
            raise ValueError(f"encoding: {encoding!r} is not one of {sorted(ROW_ENCODINGS)}")
        self.encoding = encoding
        self.keys = np.ascontiguousarray(np.asarray(keys, np.int64).reshape([-1]))
        rows = np.asarray(rows)
        if dim is None:
            dim = int(rows.shape[-1])
        # No copy when the rows already have the encoding's dtype (np.asarray, not astype).
        self.rows = np.ascontiguousarray(np.asarray(rows, tf.as_dtype(encoding).as_numpy_dtype).reshape([-1, dim]))
        self.dim = int(dim)
        self.evicted = np.ascontiguousarray(np.asarray([] if evicted is None else evicted, np.int64).reshape([-1]))
        if self.rows.shape[0] != self.keys.shape[0]:
            raise ValueError(f"rows: {self.rows.shape[0]} rows for {self.keys.shape[0]} keys")


def _segments(tables: list[TableDelta], dense: list[np.ndarray] | None) -> tuple[list[int], list[bytes]]:
    # The small segments first (every table's keys and evicted keys, the dense weights), then the rows: the
    # servable reads the small ones at once and streams the rows, and a range deep in the file costs a read
    # through the bytes before it (module docstring).
    blobs: list[bytes] = []
    offset = 0

    def add(blob: bytes) -> int:
        nonlocal offset
        start = offset
        blobs.append(blob)
        offset += len(blob)
        return start

    keys_at = [(add(t.keys.tobytes()), add(t.evicted.tobytes())) for t in tables]
    dense_fields = []
    for value in dense or []:
        blob = np.ascontiguousarray(value).tobytes()
        dense_fields += [add(blob), len(blob)]
    fields: list[int] = []
    for t, (keys_off, evicted_off) in zip(tables, keys_at, strict=True):
        rows_blob = t.rows.tobytes()
        fields += [
            t.dim,
            ROW_ENCODINGS[t.encoding],
            t.keys.shape[0],
            t.evicted.shape[0],
            keys_off,
            add(rows_blob),
            evicted_off,
            len(rows_blob),
        ]
    return fields + dense_fields, blobs


def write_delta(
    path: str,
    *,
    model_id: int,
    layout_id: int,
    version: int,
    base_version: int,
    step: int,
    tables: list[TableDelta],
    dense: list[np.ndarray] | None = None,
) -> int:
    """Writes a delta file atomically (`tf_embed_ops.formats.atomic_write`: a temporary name in the same directory,
    fsync, rename, directory fsync).

    Args:
      path: the final path.
      model_id, layout_id: the servable's ids (`fingerprint64` values).
      version, base_version: the version this delta makes and the one it applies to.
      step: the training step.
      tables: one `TableDelta` per servable table, in the servable's order.
      dense: every dense variable's value in the servable's order, or None to leave them as they are.

    Returns:
      The file's size in bytes.

    Raises:
      tf.errors.ResourceExhaustedError: a full disk, naming `path`; OSError: another write failure, naming it. No
        temporary is left and `path` is as it was.
    """
    fields, blobs = _segments(tables, dense)
    header = np.array(
        [model_id, layout_id, version, base_version, step, len(tables), len(dense or [])] + fields, np.int64
    ).tobytes()
    body = header + b"".join(blobs)
    preamble = MAGIC + np.array([FORMAT_VERSION, len(header), len(body) - len(header), checksum(body)], "<i8").tobytes()

    def write(f: Any) -> None:
        f.write(preamble)
        f.write(body)

    return atomic_write.write_file(path, write)


def read_delta(path: str) -> dict:
    """Parses and checks a delta in Python (tools, tests; the servable has its own TensorFlow reader).

    Returns:
      {"model_id", "layout_id", "version", "base_version", "step", "tables": [{"dim", "encoding", "keys", "rows",
      "evicted"}], "dense": [bytes]}.

    Raises:
      ValueError: naming the file, for a truncated, corrupted or foreign file.
    """
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < PREAMBLE or data[:8] != MAGIC:
        raise ValueError(f"delta {path}: not a delta file (too short or bad magic)")
    fmt, h, b, check = np.frombuffer(data[8:PREAMBLE], "<i8").tolist()
    if fmt != FORMAT_VERSION:
        raise ValueError(f"delta {path}: format version {fmt}, this reader reads {FORMAT_VERSION}")
    if len(data) != PREAMBLE + h + b:
        raise ValueError(f"delta {path}: truncated: {len(data)} bytes, the preamble says {PREAMBLE + h + b}")
    if checksum(data[PREAMBLE:]) != check:
        raise ValueError(f"delta {path}: checksum mismatch (the file is corrupted)")
    header = np.frombuffer(data[PREAMBLE : PREAMBLE + h], "<i8").tolist()
    payload = memoryview(data)[PREAMBLE + h :]
    names = {v: k for k, v in ROW_ENCODINGS.items()}
    out = dict(zip(["model_id", "layout_id", "version", "base_version", "step"], header[:5], strict=True))
    num_tables, num_dense = header[5], header[6]
    out["tables"], out["dense"] = [], []
    for t in range(num_tables):
        dim, enc, n, m, k_off, r_off, e_off, r_bytes = header[HEADER_FIXED + TABLE_FIELDS * t :][:TABLE_FIELDS]
        dtype = tf.as_dtype(names[enc]).as_numpy_dtype
        out["tables"].append(
            {
                "dim": dim,
                "encoding": names[enc],
                "keys": np.frombuffer(payload[k_off : k_off + 8 * n], "<i8"),
                "rows": np.frombuffer(payload[r_off : r_off + r_bytes], dtype).reshape([n, dim]),
                "evicted": np.frombuffer(payload[e_off : e_off + 8 * m], "<i8"),
            }
        )
    base = HEADER_FIXED + TABLE_FIELDS * num_tables
    for d in range(num_dense):
        off, size = header[base + DENSE_FIELDS * d :][:DENSE_FIELDS]
        out["dense"].append(bytes(payload[off : off + size]))
    return out


def describe(path: str) -> str:
    """A one-line JSON summary of a delta (version, base, rows per table), for logs."""
    d = read_delta(path)
    return json.dumps(
        {
            "version": d["version"],
            "base_version": d["base_version"],
            "rows": [len(t["keys"]) for t in d["tables"]],
            "evicted": [len(t["evicted"]) for t in d["tables"]],
            "dense": len(d["dense"]),
        }
    )
