"""Tiered dynamic tables (`te.DynamicTableConfig(storage=te.Tiered(...))`) trained by `te.TPUEmbedding`.

The reference is the same dynamic table kept in memory: the same keys, in its own `te.TPUEmbedding`, must give
bitwise the same activations, keys, rows, slots, counts and steps, for every optimizer of the schema, in float32
and in bfloat16 (stochastic rounding keyed by the key), with admission and eviction, and a cache smaller than the
key set (rows are written back to the row file and read again). Checkpoints have the in-memory table's format and
restore across the two kinds. The C++ core is checked the same way, for every optimizer and policy, in
cc/lib/tests/tiered_dynamic_table_test.cc.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from tiered_support import (
    DYNAMIC_BATCHES,
    cache_bytes_for,
    kill_child_after_checkpoint,
    make_optimizer,
    record_bytes,
    schemas,
    step,
)
from tiered_support import (
    embedding as _embedding,
)

import tf_embed_ops as te

_emb = tf.tpu.experimental.embedding
DIM, CACHE_ROWS = 4, 8
BATCHES = DYNAMIC_BATCHES  # at most CACHE_ROWS distinct keys each (tiered_support)


def _pair(tmp_path, optimizer, eviction=None, admission=None, mode="create", **options):
    """The same DynamicTableConfig in memory and tiered (a cache of CACHE_ROWS rows) in `tmp_path`."""
    cache = cache_bytes_for(
        CACHE_ROWS, optimizer, DIM, options.get("storage_dtype", tf.float32), options.get("slot_storage_dtype")
    )
    common = dict(optimizer=optimizer, eviction=eviction, admission=admission, seed=11, **options)
    memory = te.DynamicTableConfig("t", DIM, **common)
    storage = te.Tiered(cache_bytes=cache, directory=str(tmp_path), mode=mode)
    tiered = te.DynamicTableConfig("t", DIM, storage=storage, **common)
    return memory, tiered


def _export(emb: te.TPUEmbedding, table) -> dict:
    return {k: v.numpy() for k, v in emb.dynamic_tables[table].export().items()}


def _assert_same_export(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _train_pair(tmp_path, optimizer, batches=BATCHES, **options):
    memory, tiered = _pair(tmp_path, optimizer, **options)
    emb_m, emb_t = _embedding(memory), _embedding(tiered)
    for ids in batches:
        ids = tf.constant(ids, tf.int64)
        acts_m, acts_t = step(emb_m, {"f": ids}), step(emb_t, {"f": ids})
        np.testing.assert_array_equal(acts_t["f"].numpy(), acts_m["f"].numpy())
    _assert_same_export(_export(emb_t, tiered), _export(emb_m, memory))
    return emb_m, emb_t, memory, tiered


def _every_optimizer_case(schema, dtype):
    return pytest.param(schema, dtype, id=f"{schema.kind}-{tf.as_dtype(dtype).name}")


# The fast tier trains three optimizers (one per kind of walk: lazy with two slots, non-lazy, a per-row slot); the
# slow tier every optimizer of the schema in float32 and bfloat16.
_FAST = ("adagrad", "adam", "rowwise_adagrad")


@pytest.mark.parametrize(
    ("schema", "storage_dtype"),
    [
        _every_optimizer_case(s, d)
        if s.kind in _FAST and d == tf.bfloat16
        else pytest.param(s, d, id=f"{s.kind}-{tf.as_dtype(d).name}", marks=pytest.mark.slow)
        for s in schemas()
        for d in (tf.float32, tf.bfloat16)
    ],
)
def test_every_optimizer_trains_bitwise_as_in_memory(tmp_path, schema, storage_dtype):
    _, emb_t, _, tiered = _train_pair(
        tmp_path, make_optimizer(schema), eviction=te.dynamic.LRU(14), storage_dtype=storage_dtype
    )
    stats = emb_t.dynamic_tables[tiered].cache_stats()
    assert int(stats["capacity_rows"]) == CACHE_ROWS
    assert int(stats["evictions"]) > 0  # 22 keys through an 8-row cache: rows were written back ...
    assert int(stats["misses"]) > 0  # ... and read again
    assert os.path.exists(os.path.join(str(tmp_path), "t.rows"))


def test_non_lazy_adam_admission_and_decayed_lfu_train_bitwise_as_in_memory(tmp_path):
    _train_pair(
        tmp_path,
        te.optimizers.Adam(0.05, lazy_adam=False),  # walks every live row, in windows of the cache's capacity
        admission=te.dynamic.FrequencyAdmission(2, max_pending_keys=64),
        eviction=te.dynamic.DecayedLFU(10, decay=0.5),
        storage_dtype=tf.float16,
        rounding="nearest",
    )


def test_a_score_policy_reads_the_norms_from_the_row_file(tmp_path):
    # Score functions see each row's weight norm: a tiered table computes them from its records.
    def score(count, last_step, norm, current_step):
        del count, current_step
        return norm + 0.01 * last_step

    _train_pair(tmp_path, te.optimizers.Adagrad(0.1), eviction=te.dynamic.Score(score, max_rows=12))


def test_checkpoints_restore_across_in_memory_and_tiered(tmp_path):
    emb_m, emb_t, memory, tiered = _train_pair(tmp_path / "rows", te.optimizers.Adagrad(0.1), batches=BATCHES[:4])
    saved_m = tf.train.Checkpoint(embedding=emb_m).write(str(tmp_path / "memory" / "ckpt"))
    saved_t = tf.train.Checkpoint(embedding=emb_t).write(str(tmp_path / "tiered" / "ckpt"))
    # The in-memory checkpoint into a new tiered table, the tiered one into a new in-memory table.
    memory2, tiered2 = _pair(tmp_path / "rows2", te.optimizers.Adagrad(0.1))
    emb_t2, emb_m2 = _embedding(tiered2), _embedding(memory2)
    tf.train.Checkpoint(embedding=emb_t2).read(saved_m).assert_consumed()
    tf.train.Checkpoint(embedding=emb_m2).read(saved_t).assert_consumed()
    want = _export(emb_m, memory)
    _assert_same_export(_export(emb_t2, tiered2), want)
    _assert_same_export(_export(emb_m2, memory2), want)
    # Training goes on bitwise from the restored tables.
    for ids in BATCHES[4:]:
        ids = tf.constant(ids, tf.int64)
        acts = [step(e, {"f": ids})["f"].numpy() for e in (emb_m, emb_t, emb_t2, emb_m2)]
        for a in acts[1:]:
            np.testing.assert_array_equal(a, acts[0])
    want = _export(emb_m, memory)
    for emb, table in ((emb_t, tiered), (emb_t2, tiered2), (emb_m2, memory2)):
        _assert_same_export(_export(emb, table), want)


def test_a_step_with_more_distinct_keys_than_the_cache_holds_is_refused_and_changes_nothing(tmp_path):
    memory, tiered = _pair(tmp_path, te.optimizers.Adagrad(0.1))
    emb = _embedding(tiered)
    step(emb, {"f": tf.constant(BATCHES[0], tf.int64)})
    before = _export(emb, tiered)
    stats = emb.dynamic_tables[tiered].stats()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'t'.*needs 9 distinct rows.*holds 8 rows"):
        step(emb, {"f": tf.constant(list(range(100, 109)), tf.int64)})
    _assert_same_export(_export(emb, tiered), before)
    after = emb.dynamic_tables[tiered].stats()
    for name in ("size", "inserts", "refused", "evictions"):
        assert int(after[name]) == int(stats[name]), name
    del memory


def test_option_checks_name_the_table(tmp_path):
    storage = te.Tiered(cache_bytes=1 << 20, directory=str(tmp_path))
    with pytest.raises(ValueError, match=r"DynamicTableConfig 'u'.*mode='open'"):
        te.DynamicTableConfig("u", 4, storage=te.Tiered(1 << 20, str(tmp_path), mode="open"))
    with pytest.raises(ValueError, match=r"DynamicTableConfig 'u'.*L2Norm"):
        te.DynamicTableConfig("u", 4, storage=storage, eviction=te.dynamic.L2Norm(0.1))
    with pytest.raises(ValueError, match=r"DynamicTableConfig 'u'.*storage"):
        te.DynamicTableConfig("u", 4, storage="disk")
    table = te.DynamicTableConfig("u", 4, storage=storage, optimizer=te.optimizers.SGD(0.1))
    assert table.storage == storage
    assert "storage=Tiered(" in repr(table)
    # The option survives a saved config (te.keras serialization).
    import json  # pylint: disable=import-outside-toplevel

    from tf_embed_ops.keras import serialization  # pylint: disable=import-outside-toplevel

    rebuilt = serialization.table_from_dict(json.loads(json.dumps(serialization.table_to_dict(table))))
    assert isinstance(rebuilt, te.DynamicTableConfig)
    assert rebuilt.storage == storage
    # (The Keras layer trains it: tests/test_tiered_dynamic_keras.py.)
    features = {"f": _emb.FeatureConfig(table, name="f")}
    with pytest.raises(ValueError, match=r"TPUEmbeddingV2.*'u'"):
        te.TPUEmbeddingV2(features, te.optimizers.SGD(0.1))
    assert not os.path.exists(os.path.join(str(tmp_path), "u.rows"))


def test_the_row_file_is_scratch_space_refused_when_present_and_removed_with_the_table(tmp_path):
    memory, tiered = _pair(tmp_path, te.optimizers.SGD(0.1))
    path = os.path.join(str(tmp_path), "t.rows")
    with open(path, "wb") as f:
        f.write(b"a killed run's rows")
    with pytest.raises(tf.errors.AlreadyExistsError, match=r"t\.rows.*mode 'overwrite'"):
        _embedding(tiered)
    overwrite = te.DynamicTableConfig(
        "t", DIM, optimizer=te.optimizers.SGD(0.1), storage=te.Tiered(1 << 16, str(tmp_path), mode="overwrite")
    )
    emb = _embedding(overwrite)
    step(emb, {"f": tf.constant(BATCHES[0], tf.int64)})
    assert os.path.getsize(path) > 4096
    del emb
    import gc  # pylint: disable=import-outside-toplevel

    gc.collect()
    assert not os.path.exists(path)  # the table's resource went: its row file with it
    del memory


def test_a_corrupted_row_file_is_an_error_naming_the_key_and_the_checkpoint_restores(tmp_path):
    emb_m, emb_t, memory, tiered = _train_pair(tmp_path / "rows", te.optimizers.Adagrad(0.1))
    saved = tf.train.Checkpoint(embedding=emb_t).write(str(tmp_path / "ckpt" / "ckpt"))
    path = str(tmp_path / "rows" / "t.rows")
    size, record = os.path.getsize(path), record_bytes(te.optimizers.Adagrad(0.1), DIM)
    with open(path, "r+b") as f:  # flip a byte of every record (the rows not cached now fail their CRC when read)
        data = bytearray(f.read())
        for at in range(4096 + 1, size, record):
            data[at] ^= 0x5A
        f.seek(0)
        f.write(bytes(data))
    with pytest.raises(tf.errors.DataLossError, match=r"t\.rows.*row \d+ is corrupted.*\[key \d+ \(row \d+\)\]"):
        _export(emb_t, tiered)
    # A restarted job: a new table over the same row file (mode overwrite) restores the last checkpoint.
    _, again = _pair(tmp_path / "rows", te.optimizers.Adagrad(0.1), mode="overwrite")
    del emb_t
    emb_r = _embedding(again)
    tf.train.Checkpoint(embedding=emb_r).read(saved).assert_consumed()
    _assert_same_export(_export(emb_r, again), _export(emb_m, memory))


def test_cache_stats_and_summaries(tmp_path):
    _, emb_t, _, tiered = _train_pair(tmp_path / "rows", te.optimizers.SGD(0.1))
    table = emb_t.dynamic_tables[tiered]
    stats = {k: float(v) for k, v in table.cache_stats().items()}
    assert stats["hits"] + stats["misses"] > 0
    assert stats["bytes_read"] == stats["rows_read"] * record_bytes(te.optimizers.SGD(0.1), DIM)
    assert 0.0 < stats["hit_rate"] < 1.0
    assert stats["resident_rows"] <= stats["capacity_rows"] == CACHE_ROWS
    writer = tf.summary.create_file_writer(str(tmp_path / "logs"))
    with writer.as_default():
        table.write_summaries(step=1)
    writer.flush()
    assert os.listdir(str(tmp_path / "logs"))
    in_memory = te.DynamicTableConfig("m", DIM, optimizer=te.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="kept in memory"):
        _embedding(in_memory).dynamic_tables[in_memory].cache_stats()


@pytest.mark.slow
def test_a_killed_process_restarts_with_overwrite_and_restores_its_checkpoint(tmp_path):
    """A child trains a tiered dynamic table, checkpoints, trains on and is SIGKILLed wherever it is; a new process
    over the same directory (mode overwrite) restores the checkpoint and trains on: its table (every key, row,
    slot, count and step) is bitwise the in-memory table trained on the same batches without interruption."""
    out = kill_child_after_checkpoint(tmp_path, "dynamic")

    import tiered_kill_child as reference  # pylint: disable=import-outside-toplevel

    table = reference.config(None, dynamic=True)
    emb = reference.embedding(table)
    for i in range(reference.STEPS_BEFORE + reference.STEPS_AFTER):
        reference.train_step(emb, i)
    got = dict(np.load(out))
    _assert_same_export(got, _export(emb, table))
