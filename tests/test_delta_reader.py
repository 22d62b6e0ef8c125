"""te.serving.delta_reader: byte ranges, the size probe and the stateful scan, read with stock ops (record datasets).

Reference: Python slicing of the file's bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_embed_ops.serving import delta_format
from tf_embed_ops.serving import delta_reader as reader


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
def test_records_are_the_range_in_order_the_first_one_shorter(tmp_path, start, length, record):
    path, data = _file(tmp_path, 100)
    ds = reader.records(tf.constant(path), len(data), start, length, record)
    got = [r.numpy() for r in ds]
    head = length % record
    want = ([data[start : start + head]] if head else []) + [
        data[i : i + record] for i in range(start + head, start + length, record)
    ]
    assert got == want
    assert reader.read(tf.constant(path), len(data), start, length).numpy() == data[start : start + length]


def test_the_size_probe_says_shorter_exact_or_longer(tmp_path):
    path, data = _file(tmp_path, 100)
    for size, want in [(1, 1), (99, 1), (100, 0), (101, -1), (2**61, -1)]:
        assert int(reader.size_matches(tf.constant(path), tf.constant(size, tf.int64))) == want, size


def test_head_reads_the_first_bytes_or_all_of_a_shorter_file(tmp_path):
    path, data = _file(tmp_path, 100)
    assert reader.head(tf.constant(path), 40).numpy() == data[:40]
    short, data = _file(tmp_path, 20)
    assert reader.head(tf.constant(short), 40).numpy() == data


def test_scan_records_runs_in_order_with_state_and_stacks_the_outputs(tmp_path):
    path, data = _file(tmp_path, 100)

    def step(total, element):
        i, record = element
        total = total + tf.cast(tf.strings.length(record), tf.int64)
        return total, tf.stack([i, total])

    got = reader.scan_records(
        reader.records(tf.constant(path), 100, 10, 45, 20), tf.constant(0, tf.int64), step, tf.zeros([0, 2], tf.int64)
    )
    np.testing.assert_array_equal(got.numpy(), [[0, 5], [1, 25], [2, 45]])
    empty = reader.scan_records(
        reader.records(tf.constant(path), 100, 10, 0, 20), tf.constant(0, tf.int64), step, tf.zeros([0, 2], tf.int64)
    )
    assert empty.shape == (0, 2)


@pytest.mark.parametrize("size", [0, 1, delta_format.CHECKSUM_PIECE, 2 * delta_format.CHECKSUM_PIECE + 3])
def test_checksum_hashes_the_short_piece_first(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    head = size % delta_format.CHECKSUM_PIECE
    cuts = (
        [0, *range(head, size + 1, delta_format.CHECKSUM_PIECE)]
        if head
        else [*range(0, size + 1, delta_format.CHECKSUM_PIECE)]
    )
    pieces = [data[a:b] for a, b in zip(cuts, cuts[1:], strict=False)] or [b""]
    assert b"".join(pieces) == data and all(len(p) == delta_format.CHECKSUM_PIECE for p in pieces[1:])
    digests = tf.reshape(tf.fingerprint(tf.constant(pieces), "farmhash64"), [-1]).numpy().tobytes()
    want = int(tf.bitcast(tf.fingerprint(tf.constant([digests]), "farmhash64"), tf.int64).numpy()[0])
    assert delta_format.checksum(data) == want


def test_the_rows_come_after_every_small_segment(tmp_path):
    # The servable reads keys, evicted keys and dense weights whole and streams the rows: nothing it reads whole
    # may sit past a rows segment (a range deep in the file costs a read through the bytes before it).
    rng = np.random.default_rng(0)
    tables = [
        delta_format.TableDelta(np.arange(5), rng.normal(size=(5, 3)).astype(np.float32), evicted=[7, 8]),
        delta_format.TableDelta(np.arange(4), rng.normal(size=(4, 2)).astype(np.float32), evicted=[9]),
    ]
    dense = [rng.normal(size=(3, 3)).astype(np.float32)]
    path = str(tmp_path / "d.delta")
    delta_format.write_delta(
        path, model_id=1, layout_id=2, version=2, base_version=1, step=0, tables=tables, dense=dense
    )
    parsed = delta_format.read_delta(path)
    with open(path, "rb") as f:
        data = f.read()
    h = int(np.frombuffer(data[16:24], "<i8")[0])
    header = np.frombuffer(data[delta_format.PREAMBLE : delta_format.PREAMBLE + h], "<i8")
    fields = header[delta_format.HEADER_FIXED :].reshape(-1)
    per_table = fields[: delta_format.TABLE_FIELDS * 2].reshape(2, delta_format.TABLE_FIELDS)
    small = [*per_table[:, 4], *per_table[:, 6], fields[delta_format.TABLE_FIELDS * 2]]
    assert min(per_table[:, 5]) > max(small)
    for t, want in zip(parsed["tables"], tables, strict=True):
        np.testing.assert_array_equal(t["rows"], want.rows)
        np.testing.assert_array_equal(t["evicted"], want.evicted)
