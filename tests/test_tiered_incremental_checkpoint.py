"""`te.checkpoint.IncrementalCheckpointManager` over static tiered tables (docs/checkpoints.md, docs/tracking.md).

Reference: the same chain of saves of the same table in memory, trained on the same ids.  A chain's full
checkpoint streams the tiered table (tf.train.Checkpoint's registered saver); a delta holds the rows the tracker
reports changed, read from the tier; a tiered table changed whole (non-lazy Adam, a restore) makes the save a full
(streamed) checkpoint instead of a delta of every row.  A restore gives bitwise the in-memory chain's restored
state, and a restored table's next delta holds only the rows trained after the restore.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tiered_support import assert_same_state, embedding, keras_model, memory_state, step, table_pair, tiered_state

import tf_embed_ops as te
from tf_embed_ops.checkpoint import _format

_emb = tf.tpu.experimental.embedding
V, DIM, CACHE_ROWS = 64, 4, 8
BATCHES = [
    np.array([3, 7, 7, 42, 63, 0, 12, 3], np.int64),
    np.array([5, 6, 7, 8, 9, 10, 11, 13, 5], np.int64),
    np.array([42, 1], np.int64),
    np.array([60, 61, 62, 2], np.int64),
]


def _chains(tmp_path, optimizer, **options):
    memory, tiered = table_pair(tmp_path / "rows", optimizer, V, DIM, CACHE_ROWS, **options)
    emb_m, emb_t = embedding(memory), embedding(tiered)
    mgr_m = te.checkpoint.IncrementalCheckpointManager(tf.train.Checkpoint(embedding=emb_m), str(tmp_path / "m"))
    mgr_t = te.checkpoint.IncrementalCheckpointManager(tf.train.Checkpoint(embedding=emb_t), str(tmp_path / "t"))
    return (emb_m, memory, mgr_m), (emb_t, tiered, mgr_t)


def _train(embs, ids):
    for emb in embs:
        step(emb, {"f": tf.constant(ids)})


@pytest.mark.parametrize(
    "optimizer_name, storage_dtype",
    [("adagrad", tf.float32), ("adam", tf.float32), ("adagrad", tf.bfloat16)],  # bfloat16: stochastic rounding
)
def test_a_chain_of_a_tiered_table_restores_like_the_in_memory_chain(tmp_path, optimizer_name, storage_dtype):
    optimizer = {"adagrad": _emb.Adagrad(0.1), "adam": _emb.Adam(0.05, lazy_adam=False)}[optimizer_name]
    (emb_m, memory, mgr_m), (emb_t, tiered, mgr_t) = _chains(tmp_path, optimizer, storage_dtype=storage_dtype)
    for ids in BATCHES[:3]:
        _train([emb_m, emb_t], ids)
        mgr_m.save()
        mgr_t.save()
    kinds_t = [e["kind"] for e in mgr_t.chain]
    if optimizer_name == "adam":  # every row changed at every step: each save streams a full checkpoint
        assert kinds_t == ["full", "full"]  # (max_chains=2: the oldest chain was dropped)
    else:
        assert kinds_t == ["full", "delta", "delta"]
        # The last delta holds the rows of the last batch only.
        assert [e["kind"] for e in mgr_m.chain] == kinds_t
    saved = memory_state(emb_m, memory)
    assert_same_state(tiered_state(emb_t, tiered), saved)
    _train([emb_m, emb_t], BATCHES[3])  # changed after the last save: the restore undoes it
    assert mgr_m.restore() == mgr_t.restore() == 3
    assert_same_state(memory_state(emb_m, memory), saved)
    assert_same_state(tiered_state(emb_t, tiered), saved)
    # Training goes on bitwise, and the next delta (lazy) holds only the rows trained since the restore.
    _train([emb_m, emb_t], BATCHES[3])
    mgr_m.save()
    mgr_t.save()
    assert_same_state(tiered_state(emb_t, tiered), memory_state(emb_m, memory))
    assert mgr_t.chain[-1]["kind"] == ("full" if optimizer_name == "adam" else "delta")
    if optimizer_name != "adam":
        entry = mgr_t.chain[-1]
        _, arrays = _format.read_delta(f"{mgr_t.directory}/{entry['name']}.delta", entry["sha256"])
        np.testing.assert_array_equal(arrays["static/t/rows"], np.unique(BATCHES[3]))
    _train([emb_m, emb_t], BATCHES[0])
    mgr_t.restore()
    mgr_m.restore()
    assert_same_state(tiered_state(emb_t, tiered), memory_state(emb_m, memory))


def test_a_delta_of_a_tiered_table_holds_only_the_changed_rows(tmp_path):
    (emb_m, _, mgr_m), (emb_t, _, mgr_t) = _chains(tmp_path, _emb.Adagrad(0.1))
    mgr_m.save()
    mgr_t.save()
    _train([emb_m, emb_t], BATCHES[2])
    mgr_m.save()
    mgr_t.save()
    deltas = []
    for mgr in (mgr_m, mgr_t):
        entry = mgr.chain[-1]
        assert entry["kind"] == "delta"
        deltas.append(_format.read_delta(f"{mgr.directory}/{entry['name']}.delta", entry["sha256"]))
    (header_m, arrays_m), (header_t, arrays_t) = deltas
    assert header_t["tables"] == header_m["tables"]
    assert header_m["model_id"] == header_t["model_id"]  # the same layout: a chain moves between the two kinds
    np.testing.assert_array_equal(arrays_t["static/t/rows"], np.unique(BATCHES[2]))
    for key in ("static/t/rows", "static/t/parameters", "static/t/accumulators"):
        np.testing.assert_array_equal(arrays_t[key], arrays_m[key], err_msg=key)


def test_every_row_written_makes_the_save_a_full_checkpoint(tmp_path):
    """Rows written over the whole table (what a restore by other means does, without marking the tracker full):
    a full (streamed) checkpoint, not a delta holding every row in memory."""
    _, (emb_t, tiered, mgr_t) = _chains(tmp_path, _emb.Adagrad(0.1))
    mgr_t.save()
    _train([emb_t], BATCHES[0])
    mgr_t.save()
    table = emb_t.tiered_tables[tiered]
    values, slots = table.read_all()
    table.write_rows(0, values, slots)
    mgr_t.save()
    assert [e["kind"] for e in mgr_t.chain] == ["full", "delta", "full"]


def test_a_keras_model_with_a_tiered_table_in_fit(tmp_path):
    rng = np.random.default_rng(1)
    x = [{"f": rng.integers(0, V, size=16).astype(np.int64)} for _ in range(3)]
    y = rng.normal(size=(16, 2)).astype(np.float32)
    models, managers = [], []
    for kind, table in zip("mt", table_pair(tmp_path / "rows", _emb.Adagrad(0.1), V, DIM, CACHE_ROWS), strict=True):
        model = keras_model(table)
        models.append(model)
        managers.append(
            te.checkpoint.IncrementalCheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path / kind))
        )
    for batch in x[:2]:
        for model, mgr in zip(models, managers, strict=True):
            model.fit(batch, y, batch_size=8, shuffle=False, verbose=0)
            mgr.save()
    assert [e["kind"] for e in managers[1].chain] == ["full", "delta"]
    layer_t = models[1].get_layer("embedding")
    tiered_table = next(iter(layer_t.tiered_tables.values()))
    saved = tiered_table.read_all()
    np.testing.assert_array_equal(
        saved[0], next(iter(models[0].get_layer("embedding").embedding_tables.values())).numpy()
    )
    models[1].fit(x[2], y, batch_size=8, shuffle=False, verbose=0)
    managers[1].restore()
    assert_same_state(tiered_table.read_all(), saved)
    for a, b in zip(models[0].get_layer("head").weights, models[1].get_layer("head").weights, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
