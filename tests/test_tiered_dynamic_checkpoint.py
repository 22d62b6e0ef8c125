"""The streamed checkpoint of tiered dynamic tables (tf_embed_ops/dynamic/tiered_checkpoint.py).

A tiered dynamic table's checkpoint holds the in-memory dynamic table's tensors, the rows and slots written as row
slices one chunk at a time. The reference is the same dynamic table trained in memory: a save and restore in
either direction (tiered -> tiered, tiered -> in memory, in memory -> tiered) gives bitwise its keys, rows, slots,
counts and steps, in float32, bfloat16 and float16, with a cache much smaller than the key set, and training goes
on bitwise. The save reads no more than a chunk of rows at a time and the restore writes no more; a refused restore
(another dim, another optimizer, a corrupted chunk) changes nothing; a corrupted row file stops the save with an
error naming the table, the row, its key and the path, and no checkpoint is written.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
import tensorflow as tf
from tiered_support import (
    DYNAMIC_BATCHES,
    chunked_dynamic_pair,
    corrupt_every_record,
    kill_child_after_lines,
    record_bytes,
    run_json_child,
    step,
)
from tiered_support import (
    embedding as _embedding,
)

import tf_embed_ops as te
from tf_embed_ops.dynamic import ops as dynamic_ops
from tf_embed_ops.dynamic import tiered_checkpoint

_emb = tf.tpu.experimental.embedding
DIM, CACHE_ROWS, CHUNK_ROWS = 4, 8, 5
BATCHES = DYNAMIC_BATCHES  # 21 keys through a cache of 8 rows, in chunks of 5 rows
_STATS = ("size", "inserts", "refused", "evictions")


def _configs(directory, optimizer, dim=DIM, storage_dtype=tf.float32, **options):
    """The same DynamicTableConfig in memory and tiered (a cache of CACHE_ROWS rows, chunks of CHUNK_ROWS rows)."""
    return chunked_dynamic_pair(
        directory, optimizer, dim, CACHE_ROWS, CHUNK_ROWS, storage_dtype=storage_dtype, **options
    )


def _state(emb: te.TPUEmbedding, table) -> dict:
    """Everything a restore sets: the content, the policies' state, the step and the counters."""
    t = emb.dynamic_tables[table]
    out = {k: v.numpy() for k, v in t.export().items()}
    out.update({f"policy_{k}": v.numpy() for k, v in t.export_policy_state().items()})
    out["step"] = t.step.numpy()
    out.update({f"stat_{k}": t.stats()[k].numpy() for k in _STATS})
    return out


def _assert_same(a: dict, b: dict, names=None) -> None:
    names = sorted(a) if names is None else names
    for name in names:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


_CONTENT = ("keys", "weights", "slots", "counts", "last_steps", "pending_keys", "pending_counts", "step")


def _train(emb, batches) -> None:
    for ids in batches:
        step(emb, {"f": tf.constant(ids, tf.int64)})


@pytest.mark.parametrize(
    ("storage_dtype", "optimizer", "options"),
    [
        (tf.float32, te.optimizers.Adam(0.05), {}),
        (tf.bfloat16, te.optimizers.Adagrad(0.1), {}),
        (tf.float16, te.optimizers.Adagrad(0.1), {"rounding": "nearest"}),
    ],
    ids=["float32-adam", "bfloat16-adagrad", "float16-adagrad"],
)
def test_streamed_checkpoints_restore_bitwise_across_in_memory_and_tiered(tmp_path, storage_dtype, optimizer, options):
    memory, tiered = _configs(tmp_path / "rows", optimizer, storage_dtype=storage_dtype, **options)
    emb_m, emb_t = _embedding(memory), _embedding(tiered)
    _train(emb_m, BATCHES[:4])
    _train(emb_t, BATCHES[:4])
    want = _state(emb_m, memory)
    _assert_same(_state(emb_t, tiered), want, _CONTENT)
    assert int(emb_t.dynamic_tables[tiered].cache_stats()["evictions"]) > 0  # the rows went through the file
    saved_t = tf.train.Checkpoint(embedding=emb_t).write(str(tmp_path / "tiered" / "ckpt"))
    saved_m = tf.train.Checkpoint(embedding=emb_m).write(str(tmp_path / "memory" / "ckpt"))

    # The streamed checkpoint holds the in-memory format's tensors, the rows as slices of one chunk each.
    reader = tf.train.load_checkpoint(saved_t)
    key = tiered_checkpoint.checkpoint_key("embedding/t", "weights")
    n = want["keys"].shape[0]
    assert reader.get_variable_to_shape_map()[key] == [n, DIM]
    np.testing.assert_array_equal(reader.get_tensor(key), want["weights"])
    manifest = reader.get_tensor(tiered_checkpoint.manifest_key("embedding/t"))
    assert list(manifest) == [tiered_checkpoint.FORMAT_VERSION, CHUNK_ROWS] and n >= 3 * CHUNK_ROWS
    assert len(glob.glob(saved_t + ".data-*")) > n // CHUNK_ROWS  # one data file per chunk, merged

    # tiered -> tiered (streamed), tiered -> in memory, in memory -> tiered.
    memory2, tiered2 = _configs(tmp_path / "rows2", optimizer, storage_dtype=storage_dtype, **options)
    memory3, tiered3 = _configs(tmp_path / "rows3", optimizer, storage_dtype=storage_dtype, **options)
    emb_t2, emb_m2, emb_t3 = _embedding(tiered2), _embedding(memory2), _embedding(tiered3)
    tf.train.Checkpoint(embedding=emb_t2).read(saved_t).assert_consumed()
    tf.train.Checkpoint(embedding=emb_m2).read(saved_t).assert_consumed()
    tf.train.Checkpoint(embedding=emb_t3).read(saved_m).assert_consumed()
    for emb, table in ((emb_t2, tiered2), (emb_m2, memory2), (emb_t3, tiered3)):
        _assert_same(_state(emb, table), want, _CONTENT)
    # Training goes on bitwise from every restored table.
    for ids in BATCHES[4:]:
        ids = tf.constant(ids, tf.int64)
        acts = [step(e, {"f": ids})["f"].numpy() for e in (emb_m, emb_t, emb_t2, emb_m2, emb_t3)]
        for a in acts[1:]:
            np.testing.assert_array_equal(a, acts[0])
    want = _state(emb_m, memory)
    for emb, table in ((emb_t, tiered), (emb_t2, tiered2), (emb_m2, memory2), (emb_t3, tiered3)):
        _assert_same(_state(emb, table), want, _CONTENT)


def test_mode_restore_is_overwrite_for_a_dynamic_table(tmp_path):
    """A dynamic table writes no row at creation, so te.Tiered(mode="restore") replaces an existing row file and
    the restore writes the rows, as "overwrite" does."""
    optimizer = te.optimizers.Adagrad(0.1)
    memory, _ = _configs(tmp_path / "rows", optimizer)
    emb_m = _embedding(memory)
    _train(emb_m, BATCHES[:4])
    saved = tf.train.Checkpoint(embedding=emb_m).write(str(tmp_path / "memory" / "ckpt"))
    _, tiered = _configs(tmp_path / "rows2", optimizer)
    storage = te.Tiered(**{**tiered.storage.get_config(), "mode": "restore"})
    os.makedirs(storage.directory)
    with open(storage.path("t"), "wb") as f:
        f.write(b"a crashed run's rows")
    tiered = te.DynamicTableConfig("t", DIM, optimizer=optimizer, seed=11, storage=storage)
    emb_t = _embedding(tiered)
    tf.train.Checkpoint(embedding=emb_t).read(saved).assert_consumed()
    _assert_same(_state(emb_t, tiered), _state(emb_m, memory), _CONTENT)


def test_admission_counters_and_decayed_counts_go_through_the_streamed_checkpoint(tmp_path):
    options = dict(
        admission=te.dynamic.FrequencyAdmission(2, max_pending_keys=64), eviction=te.dynamic.DecayedLFU(14, decay=0.5)
    )
    memory, tiered = _configs(tmp_path / "rows", te.optimizers.Adagrad(0.1), **options)
    emb_m, emb_t = _embedding(memory), _embedding(tiered)
    batches = [*BATCHES, [500, 501, 3]]  # keys seen once stay pending (admission at 2)
    _train(emb_m, batches)
    _train(emb_t, batches)
    want = _state(emb_m, memory)
    assert want["pending_keys"].size and want["keys"].size > CHUNK_ROWS
    saved = tf.train.Checkpoint(embedding=emb_t).write(str(tmp_path / "ckpt" / "ckpt"))
    memory2, tiered2 = _configs(tmp_path / "rows2", te.optimizers.Adagrad(0.1), **options)
    emb_t2, emb_m2 = _embedding(tiered2), _embedding(memory2)
    tf.train.Checkpoint(embedding=emb_t2).read(saved).assert_consumed()
    tf.train.Checkpoint(embedding=emb_m2).read(saved).assert_consumed()
    names = [*_CONTENT, "pending_last_steps", "policy_decayed_keys", "policy_decayed_counts"]
    _assert_same(_state(emb_t2, tiered2), want, names)
    _assert_same(_state(emb_m2, memory2), want, names)


def test_save_and_restore_move_one_chunk_of_rows_at_a_time(tmp_path, monkeypatch):
    _, tiered = _configs(tmp_path / "rows", te.optimizers.Adagrad(0.1))
    emb_t = _embedding(tiered)
    _train(emb_t, BATCHES)
    n = int(emb_t.dynamic_tables[tiered].size())
    read, written, saved_rows = [], [], []

    def refuse_whole(*args, **kwargs):
        raise AssertionError("the whole table was exported or imported")

    def read_rows(table, keys, num_slots=0, name=None):
        read.append(int(keys.shape[0]))
        return real_read(table, keys, num_slots, name)

    def write_rows(table, keys, weights, slots=(), name=None):
        written.append(int(weights.shape[0]))
        return real_write(table, keys, weights, slots, name)

    def save_v2(prefix, tensor_names, shape_and_slices, tensors, name=None):
        saved_rows.extend(int(t.shape[0]) for t in tensors if t.dtype == tf.float32 and t.shape.rank == 2)
        return real_save(prefix=prefix, tensor_names=tensor_names, shape_and_slices=shape_and_slices, tensors=tensors)

    real_read, real_write = dynamic_ops.dynamic_table_tiered_read_rows, dynamic_ops.dynamic_table_tiered_write_rows
    real_save = tf.raw_ops.SaveV2
    monkeypatch.setattr(dynamic_ops, "dynamic_table_export", refuse_whole)
    monkeypatch.setattr(dynamic_ops, "dynamic_table_import", refuse_whole)
    monkeypatch.setattr(dynamic_ops, "dynamic_table_tiered_read_rows", read_rows)
    monkeypatch.setattr(dynamic_ops, "dynamic_table_tiered_write_rows", write_rows)
    monkeypatch.setattr(tf.raw_ops, "SaveV2", save_v2)
    saved = tf.train.Checkpoint(embedding=emb_t).write(str(tmp_path / "ckpt" / "ckpt"))
    chunks = [CHUNK_ROWS] * (n // CHUNK_ROWS) + ([n % CHUNK_ROWS] if n % CHUNK_ROWS else [])
    assert n > 3 * CHUNK_ROWS and read == chunks
    assert max(saved_rows) == CHUNK_ROWS  # no float tensor of more than a chunk of rows was saved
    _, tiered2 = _configs(tmp_path / "rows2", te.optimizers.Adagrad(0.1))
    emb_t2 = _embedding(tiered2)
    tf.train.Checkpoint(embedding=emb_t2).read(saved).assert_consumed()
    assert written == chunks
    monkeypatch.undo()
    _assert_same(_state(emb_t2, tiered2), _state(emb_t, tiered), _CONTENT)


def _flip_chunk_files(path: str, chunk_bytes: int) -> int:
    """Flips a byte in every data file of the checkpoint that holds exactly one full chunk of rows and slots."""
    flipped = 0
    for data in glob.glob(path + ".data-*"):
        if os.path.getsize(data) == chunk_bytes:
            with open(data, "r+b") as f:
                f.seek(chunk_bytes // 2)
                byte = f.read(1)
                f.seek(chunk_bytes // 2)
                f.write(bytes([byte[0] ^ 0x5A]))
            flipped += 1
    return flipped


def test_a_refused_restore_changes_nothing(tmp_path):
    memory, tiered = _configs(tmp_path / "rows", te.optimizers.Adagrad(0.1))
    emb_m, emb_t = _embedding(memory), _embedding(tiered)
    _train(emb_m, BATCHES[:3])
    _train(emb_t, BATCHES[:3])
    before_t, before_m = _state(emb_t, tiered), _state(emb_m, memory)

    # Checkpoints this table must refuse: another dim, another optimizer (other slots), a corrupted chunk.
    _, wide = _configs(tmp_path / "wide", te.optimizers.Adagrad(0.1), dim=8)
    _, sgd = _configs(tmp_path / "sgd", te.optimizers.SGD(0.1))
    _, good = _configs(tmp_path / "good", te.optimizers.Adagrad(0.1))
    bad = {}
    for label, config in (("dim", wide), ("optimizer", sgd), ("corrupted", good)):
        other = _embedding(config)
        _train(other, BATCHES)
        bad[label] = tf.train.Checkpoint(embedding=other).write(str(tmp_path / label / "ckpt"))
    assert _flip_chunk_files(bad["corrupted"], CHUNK_ROWS * 4 * (DIM + DIM)) > 0
    patterns = {
        "dim": r"'t'.*weights has shape \[\d+, 8\], expected \[\d+, 4\].*nothing was changed",
        "optimizer": r"'t'.*slots has shape \[\d+, 0\], expected \[\d+, 4\].*nothing was changed",
        "corrupted": r"'t'.*ckpt.data-.*corrupt: cannot read rows \[\d+, \d+\).*nothing was changed",
    }
    errors = {"dim": ValueError, "optimizer": ValueError, "corrupted": tf.errors.DataLossError}
    for label, pattern in patterns.items():
        for emb, table, before in ((emb_t, tiered, before_t), (emb_m, memory, before_m)):
            with pytest.raises(errors[label], match=pattern):
                tf.train.Checkpoint(embedding=emb).read(bad[label])
            _assert_same(_state(emb, table), before)
    # The tables still train bitwise alike.
    _train(emb_m, BATCHES[3:])
    _train(emb_t, BATCHES[3:])
    _assert_same(_state(emb_t, tiered), _state(emb_m, memory), _CONTENT)


def test_a_checkpoint_of_another_bloom_filter_is_refused_and_changes_nothing(tmp_path):
    """The policies' state is restored after the keys and rows, so it is checked before them."""
    small = te.dynamic.BloomAdmission(min_count=2, num_counters=64, num_hashes=2)
    large = te.dynamic.BloomAdmission(min_count=2, num_counters=128, num_hashes=2)
    _, saving = _configs(tmp_path / "saving", te.optimizers.Adagrad(0.1), admission=small)
    other = _embedding(saving)
    _train(other, BATCHES)
    path = tf.train.Checkpoint(embedding=other).write(str(tmp_path / "ckpt" / "ckpt"))
    memory, tiered = _configs(tmp_path / "rows", te.optimizers.Adagrad(0.1), admission=large)
    for table in (tiered, memory):
        emb = _embedding(table)
        _train(emb, BATCHES[:3])
        before = _state(emb, table)
        assert before["keys"].size and before["policy_bloom_counters"].shape == (1, 128)
        with pytest.raises(ValueError, match=r"'t'.*bloom_counters is uint8 \[1, 64\].*\[parts, 128\]"):
            tf.train.Checkpoint(embedding=emb).read(path)
        _assert_same(_state(emb, table), before)


def test_a_corrupted_record_stops_the_save_naming_the_key_and_writes_no_checkpoint(tmp_path):
    _, tiered = _configs(tmp_path / "rows", te.optimizers.Adagrad(0.1))
    emb = _embedding(tiered)
    _train(emb, BATCHES)
    table = emb.dynamic_tables[tiered]
    first = tf.train.Checkpoint(embedding=emb).write(str(tmp_path / "first" / "ckpt"))  # a good one first
    corrupt_every_record(str(tmp_path / "rows" / "t.rows"), record_bytes(te.optimizers.Adagrad(0.1), DIM))
    before = {k: v.numpy() for k, v in table.stats().items()}
    directory = tmp_path / "ckpt"
    directory.mkdir()
    with pytest.raises(
        tf.errors.DataLossError,
        match=r"DynamicTable 't': checkpoint .*t\.rows.*row \d+ is corrupted.*\[key \d+ \(row \d+\)\].*no checkpoint",
    ):
        tf.train.Checkpoint(embedding=emb).write(str(directory / "ckpt"))
    assert os.listdir(directory) == []  # no checkpoint, and no chunk left behind
    after = {k: v.numpy() for k, v in table.stats().items()}
    _assert_same(after, before)
    assert tf.train.load_checkpoint(first) is not None


@pytest.mark.slow
def test_the_save_and_the_restore_hold_one_chunk_not_the_table(tmp_path):
    """A tiered dynamic table of 128 MiB of rows and slots, checkpointed and restored in chunks of 2 MiB: the
    process's peak RSS grows by a small fraction of the table (its whole export, measured the same way, by more
    than half the table), and the restored rows equal the saved ones."""
    report = run_json_child("tiered_dynamic_checkpoint_memory_child.py", str(tmp_path))
    print(report)
    assert report["table_bytes"] == 131072 * 2 * 128 * 4 and report["restored_equal"], report
    for phase in ("save", "restore"):
        assert report[phase] < report["table_bytes"] / 4, report
    assert report["export_whole"] > report["table_bytes"] / 2, report  # the measure sees a whole-table copy


@pytest.mark.parametrize("case", ["empty", "no_slots", "string_keys"])
def test_edge_tables_round_trip_bitwise(tmp_path, case):
    """An empty table (nothing to slice), a table without optimizer slots (slots [n, 0], saved whole) and a table
    of string keys (rows read and written by their int64 fingerprints) save and restore both ways."""
    optimizer = te.optimizers.SGD(0.1) if case == "no_slots" else te.optimizers.Adagrad(0.1)
    options = {"key_dtype": tf.string} if case == "string_keys" else {}
    memory, tiered = _configs(tmp_path / "rows", optimizer, **options)
    emb_m, emb_t = _embedding(memory), _embedding(tiered)
    batches = [] if case == "empty" else BATCHES[:4]
    if case == "string_keys":
        batches = [[f"id{k}".encode() for k in ids] for ids in batches]
    for emb in (emb_m, emb_t):
        for ids in batches:
            step(emb, {"f": tf.constant(ids)})
    want = _state(emb_m, memory)
    assert want["keys"].shape[0] == (0 if case == "empty" else 15)
    saved = tf.train.Checkpoint(embedding=emb_t).write(str(tmp_path / "ckpt" / "ckpt"))
    memory2, tiered2 = _configs(tmp_path / "rows2", optimizer, **options)
    emb_t2, emb_m2 = _embedding(tiered2), _embedding(memory2)
    tf.train.Checkpoint(embedding=emb_t2).read(saved).assert_consumed()
    tf.train.Checkpoint(embedding=emb_m2).read(saved).assert_consumed()
    _assert_same(_state(emb_t2, tiered2), want, _CONTENT)
    _assert_same(_state(emb_m2, memory2), want, _CONTENT)
    if batches:  # training goes on bitwise
        acts = [step(e, {"f": tf.constant(batches[0])})["f"].numpy() for e in (emb_m, emb_t2, emb_m2)]
        np.testing.assert_array_equal(acts[1], acts[0])
        np.testing.assert_array_equal(acts[2], acts[0])


@pytest.mark.slow
def test_a_save_killed_midway_leaves_the_last_checkpoint_to_restore(tmp_path):
    """A process SIGKILLed in the middle of a streamed save (chunks written, not merged): no checkpoint of that save
    exists, the manager still points at the previous one, and it restores bitwise into a new process's table."""
    kill_child_after_lines("tiered_dynamic_save_kill_child.py", [str(tmp_path)], ["saved", "mid-save"])
    directory = str(tmp_path / "ckpt")
    latest = tf.train.latest_checkpoint(directory)
    assert latest is not None and latest.endswith("ckpt-1"), latest
    assert not os.path.exists(os.path.join(directory, "ckpt-2.index"))
    assert glob.glob(os.path.join(directory, "ckpt-2-*"))  # the killed save's chunks, never merged
    import tiered_dynamic_save_kill_child as child  # pylint: disable=import-outside-toplevel

    table = te.dynamic.DynamicTable(child.config(str(tmp_path / "rows2")))
    tf.train.Checkpoint(table=table).restore(latest).assert_consumed()
    got = {k: v.numpy() for k, v in table.export().items()}
    np.testing.assert_array_equal(got["keys"], child.keys())
    np.testing.assert_array_equal(got["weights"], child.rows(1))
    np.testing.assert_array_equal(got["slots"], child.rows(1) ** 2)
    np.testing.assert_array_equal(got["last_steps"], np.ones(child.KEYS, np.int64))
