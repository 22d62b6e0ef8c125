"""te.serving.delta_reader: byte ranges, the checksum and the size probe, read with stock ops (record datasets).

References: Python slicing of the file's bytes, and `delta_format.checksum` (numpy/TensorFlow on bytes in memory).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_embed_ops.serving import delta_format as fmt
from tf_embed_ops.serving import delta_reader as reader

PIECE = fmt.CHECKSUM_PIECE


def _file(tmp_path, size: int, seed: int = 0) -> tuple[str, bytes]:
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = str(tmp_path / f"f{size}")
    with open(path, "wb") as f:
        f.write(data)
    return path, data


@pytest.mark.parametrize(
    "start,length,record",
    [(0, 100, 100), (0, 100, 7), (13, 87, 29), (13, 87, 1), (40, 0, 16), (99, 1, 64), (0, 100, 1000), (5, 64, 16)],
)
def test_records_are_the_range_in_order_the_last_one_shorter(tmp_path, start, length, record):
    path, data = _file(tmp_path, 100)
    ds = reader.records(tf.constant(path), len(data), start, length, record)
    got = [r.numpy() for r in ds]
    want = [data[i : i + record] for i in range(start, start + length, record)]
    assert got == want
    assert reader.read(tf.constant(path), len(data), start, length).numpy() == data[start : start + length]


@pytest.mark.parametrize("payload", [0, 1, PIECE - 1, PIECE, PIECE + 1, 2 * PIECE + 3])
def test_the_checksum_equals_the_format_s_over_one_piece_or_several(tmp_path, payload):
    path, data = _file(tmp_path, fmt.PREAMBLE + payload, seed=payload)
    got = reader.checksum(tf.constant(path), len(data), tf.constant(payload, tf.int64))
    assert int(got) == fmt.checksum(data[fmt.PREAMBLE :])


def test_the_size_probe_says_shorter_exact_or_longer(tmp_path):
    path, data = _file(tmp_path, 100)
    for size, want in [(1, 1), (99, 1), (100, 0), (101, -1), (2**61, -1)]:
        assert int(reader.size_matches(tf.constant(path), tf.constant(size, tf.int64))) == want, size


def test_head_reads_the_first_bytes_or_all_of_a_shorter_file(tmp_path):
    path, data = _file(tmp_path, 100)
    assert reader.head(tf.constant(path), 40).numpy() == data[:40]
    short, data = _file(tmp_path, 20)
    assert reader.head(tf.constant(short), 40).numpy() == data


@pytest.mark.parametrize("n", [0, 3, 4, 5, 9])
def test_first_non_finite_row_finds_the_first_across_chunks(tmp_path, n):
    rows = np.arange(n * 3, dtype=np.float32).reshape([n, 3])
    bad = {0: -1, 3: 2, 4: 3, 5: 4, 9: 5}[n]  # the last row of a chunk of 4, the row after it, inside the second
    if bad >= 0:
        rows[bad, 1] = np.nan
        if n == 9:
            rows[8, 0] = np.inf  # a later one in the last chunk is not reported
    path = str(tmp_path / "rows")
    with open(path, "wb") as f:
        f.write(b"x" * 8 + rows.tobytes())
    got = reader.first_non_finite_row(tf.constant(path), 8 + rows.nbytes, 8, tf.constant(n, tf.int64), tf.float32, 3, 4)
    assert int(got) == bad
