"""Tiered dynamic tables in the Keras layer: `fit`, `model.save`/`load_model`, `tf.train.Checkpoint` and
`te.keras.export_for_serving` (streamed).

Reference: the same model with the dynamic table in memory, trained on the same batches (a tiered dynamic table
trains bitwise like it); its table's content, its outputs, and its export by the same exporter are compared bitwise,
in this process and (slow tier) in an interpreter in which `tf_embed_ops` cannot be imported.
"""

from __future__ import annotations

import os
import zipfile

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf
from tiered_support import cache_bytes_for, keras_model

import tf_embed_ops as te
from tests.serving_support import serve_many_without_plugin
from tf_embed_ops import keras as te_keras

_emb = tf.tpu.experimental.embedding
DIM, CACHE_ROWS, CHUNK_ROWS = 4, 16, 5
SIGNATURE = {"f": tf.TensorSpec([None], tf.int64)}
_RNG = np.random.default_rng(1)
X = {"f": _RNG.integers(0, 40, size=64).astype(np.int64) * 7919}  # about 31 distinct keys through 16 cached rows
Y = _RNG.normal(size=(64, 2)).astype(np.float32)
IDS = np.concatenate([np.unique(X["f"]), [0, 5, 1 << 45]]).astype(np.int64)  # trained keys, then unknown ones
_CONTENT = ("keys", "weights", "slots", "counts", "last_steps", "pending_keys", "pending_counts", "pending_last_steps")


def _config(directory, **options):
    """The DynamicTableConfig "t", tiered in `directory` (a cache of CACHE_ROWS rows, chunks of CHUNK_ROWS rows)
    or, with `directory=None`, in memory."""
    optimizer = te.optimizers.Adagrad(0.1)
    storage = None
    if directory is not None:
        cache = cache_bytes_for(CACHE_ROWS, optimizer, DIM)
        storage = te.Tiered(cache_bytes=cache, directory=str(directory), chunk_bytes=CHUNK_ROWS * 4 * 2 * DIM)
    return te.DynamicTableConfig("t", DIM, optimizer=optimizer, seed=11, storage=storage, **options)


def _model(directory, **options):
    return keras_model(_config(directory, **options))


def _table(model):
    return next(iter(model.get_layer("embedding").dynamic_tables.values()))


def _content(model) -> dict:
    table = _table(model)
    out = {k: v.numpy() for k, v in table.export().items()}
    out["step"] = table.step.numpy()
    return out


def _assert_same(a: dict, b: dict) -> None:
    for name in (*_CONTENT, "step"):
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _pair(tmp_path, **options):
    """(in-memory model, tiered model), trained alike; their tables are equal."""
    models = [_model(None, **options), _model(tmp_path / "rows", **options)]
    for model in models:
        model.fit(X, Y, batch_size=8, shuffle=False, verbose=0)
    assert int(_table(models[1]).cache_stats()["evictions"]) > 0  # the rows went through the file
    _assert_same(_content(models[1]), _content(models[0]))
    return models


def _predict(model):
    return model.predict(X, batch_size=16, verbose=0)  # at most 16 distinct keys a batch: the cache holds them


def _serve_here(path):
    return tf.saved_model.load(path).signatures["serving_default"](f=tf.constant(IDS))["output_0"].numpy()


def test_fit_trains_bitwise_like_the_table_in_memory(tmp_path):
    memory, tiered = _pair(tmp_path)
    np.testing.assert_array_equal(_predict(tiered), _predict(memory))
    memory.fit(X, Y, batch_size=16, shuffle=False, verbose=0)  # and on, with other batches
    tiered.fit(X, Y, batch_size=16, shuffle=False, verbose=0)
    _assert_same(_content(tiered), _content(memory))


def test_model_save_stores_the_rows_chunk_by_chunk_and_loads_bitwise(tmp_path):
    memory, tiered = _pair(tmp_path)
    path = str(tmp_path / "tiered.keras")
    tiered.save(path)
    with zipfile.ZipFile(path) as z, z.open("model.weights.h5") as f, open(tmp_path / "w.h5", "wb") as out:
        out.write(f.read())
    with h5py.File(tmp_path / "w.h5") as h5:
        names = []
        h5.visit(names.append)
    n = _content(memory)["keys"].shape[0]
    chunks = [name for name in names if "dynamic.t.weights." in name]
    assert len(chunks) == -(-n // CHUNK_ROWS) and not [name for name in names if name.endswith("dynamic.t.weights")]

    def elsewhere(name, saved):
        return te.Tiered(**{**saved.get_config(), "directory": str(tmp_path / "rows_loaded")})

    with te_keras.tiered_storage(elsewhere):
        loaded = keras.models.load_model(path)
    assert _table(loaded).tiered is not None
    _assert_same(_content(loaded), _content(memory))
    np.testing.assert_array_equal(_predict(loaded), _predict(memory))


def test_the_weights_entries_load_across_kinds_and_a_bad_chunk_changes_nothing(tmp_path):
    memory, tiered = _pair(tmp_path)
    want = _content(memory)
    saved = {}
    for model, kind in ((memory, "memory"), (tiered, "tiered")):
        saved[kind] = {}
        model.get_layer("embedding").save_own_variables(saved[kind])
    assert "dynamic.t.weights" in saved["memory"] and "dynamic.t.weights.0" in saved["tiered"]
    # tiered entries -> a table in memory; in-memory entries -> a tiered table.
    for kind, directory in (("tiered", None), ("memory", tmp_path / "rows2")):
        other = _model(directory)
        other.get_layer("embedding").load_own_variables(saved[kind])
        _assert_same(_content(other), want)
    # A chunk of another shape is refused before any table is written.
    other = _model(tmp_path / "rows3")
    other.fit(X, Y, batch_size=16, shuffle=False, verbose=0)
    before = _content(other)
    bad = dict(saved["tiered"])
    bad["dynamic.t.weights.1"] = bad["dynamic.t.weights.1"][:, :3]
    with pytest.raises(ValueError, match=r"load_model: DynamicTable 't': dynamic\.t\.weights\.1 has shape \[5, 3\]"):
        other.get_layer("embedding").load_own_variables(bad)
    _assert_same(_content(other), before)


def test_checkpoints_restore_across_kinds(tmp_path):
    memory, tiered = _pair(tmp_path)
    saved = tf.train.Checkpoint(model=tiered).write(str(tmp_path / "ckpt" / "c"))
    for directory in (None, tmp_path / "rows2"):
        other = _model(directory)
        tf.train.Checkpoint(model=other).read(saved).expect_partial()
        _assert_same(_content(other), _content(memory))


@pytest.mark.parametrize("mode", [pytest.param(None, marks=pytest.mark.slow), "int8"])
def test_export_for_serving_streams_the_rows_and_serves_what_the_in_memory_export_serves(tmp_path, mode):
    memory, tiered = _pair(tmp_path)
    dirs = {k: str(tmp_path / k) for k in ("memory", "tiered")}
    te_keras.export_for_serving(memory, dirs["memory"], SIGNATURE, quantization=mode)
    stats = _table(tiered).cache_stats()
    te_keras.export_for_serving(tiered, dirs["tiered"], SIGNATURE, quantization=mode)
    assert int(_table(tiered).cache_stats()["misses"]) == int(stats["misses"])  # read around the cache
    np.testing.assert_array_equal(_serve_here(dirs["tiered"]), _serve_here(dirs["memory"]))
    data = [f for f in os.listdir(os.path.join(dirs["tiered"], "variables")) if ".data-" in f]
    n = _content(memory)["keys"].shape[0]
    assert len(data) == 1 + -(-n // CHUNK_ROWS) + 1  # the SavedModel's own, one per chunk, the default row
    meta = te.serving.read_export_metadata(dirs["tiered"])["t"]
    assert meta == te.serving.read_export_metadata(dirs["memory"])["t"]


@pytest.mark.slow
def test_export_for_serving_prunes_a_tiered_dynamic_table_as_in_memory(tmp_path):
    memory, tiered = _pair(tmp_path)
    dirs = {k: str(tmp_path / k) for k in ("memory", "tiered")}
    prune = {"t": te.serving.Prune(min_count=3, max_rows=6, score="recency")}
    for model, path in ((memory, dirs["memory"]), (tiered, dirs["tiered"])):
        te_keras.export_for_serving(model, path, SIGNATURE, quantization="int4", prune=prune)
    meta = te.serving.read_export_metadata(dirs["tiered"])["t"]
    assert 0 < meta["rows_exported"] < meta["rows_trained"]
    assert meta == te.serving.read_export_metadata(dirs["memory"])["t"]
    np.testing.assert_array_equal(_serve_here(dirs["tiered"]), _serve_here(dirs["memory"]))


@pytest.mark.slow
def test_the_keras_export_serves_bitwise_in_plain_tensorflow(tmp_path):
    memory, tiered = _pair(tmp_path)
    dirs = []
    for mode in (None, "int8", "int4", "float16", "bfloat16"):
        for model, kind in ((tiered, "tiered"), (memory, "memory")):
            dirs.append(str(tmp_path / f"{kind}_{mode}"))
            te_keras.export_for_serving(model, dirs[-1], SIGNATURE, quantization=mode)
    served = serve_many_without_plugin(dirs, {"f": tf.constant(IDS)}, cwd=str(tmp_path))
    for i in range(0, len(dirs), 2):
        np.testing.assert_array_equal(served[i], served[i + 1], err_msg=dirs[i])
        np.testing.assert_array_equal(served[i], _serve_here(dirs[i]), err_msg=dirs[i])


def test_an_incremental_checkpoint_chain_of_a_keras_model_restores_bitwise(tmp_path, monkeypatch):
    """The tiered table inside a Keras model: the manager finds its streamed full checkpoint by the model's object
    path and applies the deltas chunk by chunk (never through the table's whole export)."""
    from tf_embed_ops.dynamic import tiered_chain_restore

    memory, tiered = _pair(tmp_path)
    managers = [
        te.checkpoint.IncrementalCheckpointManager(tf.train.Checkpoint(model=m), str(tmp_path / k))
        for m, k in ((memory, "m"), (tiered, "t"))
    ]
    for manager in managers:
        manager.save()
    for model in (memory, tiered):
        model.fit({"f": X["f"][:32] + 1}, Y[:32], batch_size=8, shuffle=False, verbose=0)  # new keys too
    for manager in managers:
        manager.save()
    assert [e["kind"] for e in managers[1].chain] == ["full", "delta"]
    want = _content(memory)
    for model in (memory, tiered):
        model.fit(X, Y, batch_size=8, shuffle=False, verbose=0)
    applied = []
    apply = tiered_chain_restore.TieredDynamicRestore.apply
    monkeypatch.setattr(tiered_chain_restore.TieredDynamicRestore, "apply", lambda self: applied.append(apply(self)))
    monkeypatch.setattr(_table(tiered), "export", lambda: pytest.fail("the whole table was read"))
    assert [manager.restore() for manager in managers] == [2, 2]
    assert len(applied) == 1
    monkeypatch.undo()
    _assert_same(_content(tiered), want)
    _assert_same(_content(memory), want)
    np.testing.assert_array_equal(_predict(tiered), _predict(memory))
