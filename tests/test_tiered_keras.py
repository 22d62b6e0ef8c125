"""Tiered tables in the Keras layer: `model.fit`, get_config/from_config, `model.save`/`load_model`, checkpoints.

Reference: the same Keras model with the table in memory (same initial rows, same data, same optimizers), whose
fused update is the one the tiered table's cache runs; every comparison is bitwise.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from tiered_support import table_pair

import tf_embed_ops as te
from tf_embed_ops import keras as te_keras

_emb = tf.tpu.experimental.embedding
V, DIM, CACHE_ROWS, BATCH = 64, 4, 8, 8


def _model(table, second=None):
    """A functional model: feature "f" over `table` (and "g" over `second`, in memory), a Dense head."""
    features = {"f": _emb.FeatureConfig(table, name="f")}
    inputs = {"f": keras.Input(shape=(), dtype="int64", name="f")}
    if second is not None:
        features["g"] = _emb.FeatureConfig(second, name="g")
        inputs["g"] = keras.Input(shape=(), dtype="int64", name="g")
    layer = te_keras.TPUEmbedding(features, name="embedding")
    acts = layer(inputs)
    x = keras.layers.Concatenate()(list(acts.values())) if second is not None else acts["f"]
    head = keras.layers.Dense(1, kernel_initializer=keras.initializers.RandomNormal(seed=7), name="head")
    model = keras.Model(inputs, head(x))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model, layer


def _data(n=48, seed=0, keys=("f",)):
    rng = np.random.default_rng(seed)
    # Every batch of 8 has at most 8 distinct rows: the cache's capacity. The first and last ids are used.
    x = {k: rng.integers(0, V, size=n).astype(np.int64) for k in keys}
    for k in keys:
        x[k][:2] = [0, V - 1]
    y = rng.normal(size=(n, 1)).astype(np.float32)
    return x, y


def _state_of_memory(layer, table):
    values = tf.cast(layer.embedding_tables[table], tf.float32).numpy()
    return values, {k: tf.cast(v, tf.float32).numpy() for k, v in layer.slot_variables[table].items()}


def _assert_state(tiered, memory):
    np.testing.assert_array_equal(tiered[0], memory[0])
    assert sorted(tiered[1]) == sorted(memory[1])
    for name in tiered[1]:
        np.testing.assert_array_equal(tiered[1][name], memory[1][name], err_msg=name)


@pytest.mark.parametrize(
    "optimizer, options",
    [
        (lambda: te.optimizers.Adagrad(0.1), {}),
        pytest.param(
            lambda: te.optimizers.Adam(0.05),
            {"storage_dtype": tf.bfloat16, "rounding": "stochastic"},
            marks=pytest.mark.slow,  # the fast tier keeps one optimizer
        ),
    ],
    ids=["adagrad-fp32", "adam-bf16-stochastic"],
)
def test_fit_trains_a_tiered_table_bitwise_as_in_memory(tmp_path, optimizer, options):
    memory, tiered = table_pair(tmp_path, optimizer(), V, DIM, CACHE_ROWS, **options)
    model_m, layer_m = _model(memory)
    model_t, layer_t = _model(tiered)
    x, y = _data()
    for model in (model_m, model_t):
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    table = layer_t.tiered_tables[tiered]
    assert table.stats()["evictions"].numpy() > 0  # the table is 8x the cache: rows went to disk and came back
    _assert_state(table.read_all(), _state_of_memory(layer_m, memory))
    np.testing.assert_array_equal(model_t.get_layer("head").kernel.numpy(), model_m.get_layer("head").kernel.numpy())
    np.testing.assert_array_equal(
        model_t.predict(x, batch_size=BATCH, verbose=0), model_m.predict(x, batch_size=BATCH, verbose=0)
    )


def test_a_step_the_tiered_update_refuses_changes_no_table(tmp_path):
    """One batch with more distinct rows than the cache holds: fit fails, and neither the tiered table nor the
    in-memory table of the same layer changed."""
    tiered_cfg = table_pair(tmp_path, te.optimizers.Adagrad(0.1), V, DIM, CACHE_ROWS)[1]
    other = te.TableConfig(V, DIM, name="other", optimizer=te.optimizers.Adagrad(0.1))
    model, layer = _model(tiered_cfg, other)
    table = layer.tiered_tables[tiered_cfg]
    before = table.read_all(), _state_of_memory(layer, other)
    x = {"f": np.arange(16, dtype=np.int64), "g": np.arange(16, dtype=np.int64)}
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"cache of table 't' holds 8 rows"):
        model.fit(x, np.zeros([16, 1], np.float32), batch_size=16, epochs=1, verbose=0)
    _assert_state(table.read_all(), before[0])
    _assert_state(_state_of_memory(layer, other), before[1])


def test_save_and_load_model_keep_the_storage_and_the_rows(tmp_path):
    _, tiered = table_pair(tmp_path / "rows", te.optimizers.Adagrad(0.1), V, DIM, CACHE_ROWS)
    model, layer = _model(tiered)
    x, y = _data()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    saved = layer.tiered_tables[tiered].read_all()
    path = str(tmp_path / "model.keras")
    model.save(path)

    # The saved config keeps te.Tiered; its mode="create" refuses the row file the saved model still uses.
    with pytest.raises((ValueError, TypeError), match="already exists"):
        keras.models.load_model(path)
    moved = tmp_path / "loaded"
    with te_keras.tiered_storage(lambda name, old: te.Tiered(**{**old.get_config(), "directory": str(moved)})):
        loaded = keras.models.load_model(path)
    loaded_layer = loaded.get_layer("embedding")
    (loaded_config,) = loaded_layer.tiered_tables
    assert loaded_config.storage == te.Tiered(**{**tiered.storage.get_config(), "directory": str(moved)})
    assert os.path.exists(os.path.join(str(moved), "t.rows"))
    _assert_state(loaded_layer.tiered_tables[loaded_config].read_all(), saved)
    np.testing.assert_array_equal(
        loaded.predict(x, batch_size=BATCH, verbose=0), model.predict(x, batch_size=BATCH, verbose=0)
    )

    # mode="restore": load_model's weights write every row once, over a row file created without initial rows.
    with te_keras.tiered_storage(
        lambda name, old: te.Tiered(**{**old.get_config(), "directory": str(tmp_path / "restored"), "mode": "restore"})
    ):
        restored = keras.models.load_model(path)
    restored_table = next(iter(restored.get_layer("embedding").tiered_tables.values()))
    assert int(restored_table.stats()["rows_written"]) == V
    _assert_state(restored_table.read_all(), saved)

    # from_config alone (no weights): the storage survives the config round trip.
    config = layer.get_config()
    with te_keras.tiered_storage({"t": te.Tiered(cache_bytes=4096, directory=str(tmp_path / "fresh"))}):
        rebuilt = te_keras.TPUEmbedding.from_config(config)
    assert next(iter(rebuilt.tiered_tables)).storage.get_config()["cache_bytes"] == 4096
    with pytest.raises((ValueError, TypeError), match=r"'t'.*must be a te\.Tiered"):  # Keras may wrap it
        with te_keras.tiered_storage({"t": None}):
            te_keras.TPUEmbedding.from_config(config)


def _small_chunks(table, rows_per_chunk=7):
    """`table` with chunks of `rows_per_chunk` rows (64 rows: 10 chunks, the last one of 1 row)."""
    floats = DIM * (1 + len(te.config.slot_shapes(table.optimizer, 1, DIM)))
    table.storage = te.Tiered(**{**table.storage.get_config(), "chunk_bytes": rows_per_chunk * 4 * floats})
    return table


def test_the_layer_weights_round_trip_chunk_by_chunk_and_bad_ones_change_nothing(tmp_path):
    _, tiered = table_pair(tmp_path / "a", te.optimizers.Adagrad(0.1), V, DIM, CACHE_ROWS)
    model, layer = _model(_small_chunks(tiered))
    x, y = _data()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    store = {}
    layer.save_own_variables(store)
    assert sorted(k for k in store if k.startswith("tiered.t.") and k.endswith(".values"))[-1] == "tiered.t.9.values"
    assert store["tiered.t.9.values"].shape == (1, DIM)  # 64 rows in chunks of 7: the tenth holds one row
    saved = layer.tiered_tables[tiered].read_all()

    _, same = table_pair(tmp_path / "b", te.optimizers.Adagrad(0.1), V, DIM, CACHE_ROWS)
    _, same_layer = _model(same)
    target = same_layer.tiered_tables[same]
    before = target.read_all()
    bad = {k: v for k, v in store.items() if k != "tiered.t.4.values"}
    with pytest.raises(ValueError, match=r"tiered table 't'.*tiered\.t\.4\.values"):
        same_layer.load_own_variables(bad)
    bad = dict(store, **{"tiered.t.9.slot0": np.zeros([2, DIM], np.float32)})
    with pytest.raises(ValueError, match=r"tiered\.t\.9\.slot0 has shape \[2, 4\]"):
        same_layer.load_own_variables(bad)
    _assert_state(target.read_all(), before)  # nothing written by the refused loads (chunk 0 included)
    same_layer.load_own_variables(store)
    _assert_state(target.read_all(), saved)

    _, wider = table_pair(tmp_path / "c", te.optimizers.Adagrad(0.1), V, DIM + 1, CACHE_ROWS)
    _, wider_layer = _model(wider)
    before = wider_layer.tiered_tables[wider].read_all()
    with pytest.raises(ValueError, match=r"tiered table 't'.*dim 4.*dim 5"):
        wider_layer.load_own_variables(store)
    _assert_state(wider_layer.tiered_tables[wider].read_all(), before)


def test_a_checkpoint_of_the_model_streams_the_tiered_table(tmp_path):
    _, tiered = table_pair(tmp_path / "a", te.optimizers.Adam(0.05), V, DIM, CACHE_ROWS)
    model, layer = _model(tiered)
    x, y = _data()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    table = layer.tiered_tables[tiered]
    saved = table.read_all()
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt" / "c"))
    assert any(k.endswith("/t/part-0") for k, _ in tf.train.list_variables(path))
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert not np.array_equal(table.read_all()[0], saved[0])
    tf.train.Checkpoint(model=model).read(path).assert_existing_objects_matched()
    _assert_state(table.read_all(), saved)


@pytest.mark.slow
def test_fit_with_a_dynamic_table_beside_the_tiered_one_is_bitwise_as_in_memory(tmp_path):
    """The layer's one update runs the dynamic group between the tiered checks and the tiered update."""
    memory, tiered = table_pair(tmp_path, te.optimizers.Adagrad(0.1), V, DIM, CACHE_ROWS)
    models = []
    for table in (memory, tiered):
        dynamic = te.DynamicTableConfig("d", DIM, optimizer=te.optimizers.Adagrad(0.1), seed=3)
        models.append(_model(table, dynamic))
    x, y = _data(keys=("f", "g"))
    x["g"] = x["g"] * 1000 + 7  # arbitrary keys
    for model, _ in models:
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    (model_m, layer_m), (model_t, layer_t) = models
    _assert_state(layer_t.tiered_tables[tiered].read_all(), _state_of_memory(layer_m, memory))
    exported = [next(iter(layer.dynamic_tables.values())).export() for layer in (layer_m, layer_t)]
    assert sorted(exported[0]) == sorted(exported[1])
    for name in exported[0]:
        np.testing.assert_array_equal(exported[0][name].numpy(), exported[1][name].numpy(), err_msg=name)
    np.testing.assert_array_equal(
        model_t.predict(x, batch_size=BATCH, verbose=0), model_m.predict(x, batch_size=BATCH, verbose=0)
    )
