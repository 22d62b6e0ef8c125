"""te.keras.TPUEmbedding with a dynamic table: model.fit trains it exactly like a static table of the same rows."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te

_emb = tf.tpu.experimental.embedding
V, DIM = 10, 3


def _layer(rows):
    static = _emb.TableConfig(
        V,
        DIM,
        name="static",
        combiner="sum",
        optimizer=te.optimizers.Adagrad(0.2),
        initializer=tf.constant_initializer(rows),
    )
    dynamic = te.DynamicTableConfig("dynamic", DIM, optimizer=te.optimizers.Adagrad(0.2), combiner="sum")
    layer = te.keras.TPUEmbedding({"d": _emb.FeatureConfig(dynamic), "s": _emb.FeatureConfig(static)})
    layer.dynamic_tables[dynamic].import_(tf.range(V, dtype=tf.int64), rows)
    return layer, static, dynamic


def _model(layer):
    ids = keras.Input(shape=(None,), dtype="int64", ragged=True, name="ids")
    acts = layer({"d": ids, "s": ids})
    # The loss sees the sum of both activations: both tables get the same gradients.
    total = keras.layers.Add()([acts["d"], acts["s"]])
    out = keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros")(total)
    return keras.Model(ids, out)


def test_fit_trains_the_dynamic_table_like_the_static_one():
    rows = np.random.default_rng(0).normal(size=(V, DIM)).astype(np.float32)
    layer, static, dynamic = _layer(rows)
    model = _model(layer)
    model.compile(keras.optimizers.Adam(0.05), "mse")  # Adam: the update must be on the gradient's data path
    rng = np.random.default_rng(1)
    lengths = rng.integers(0, 4, size=48)
    ids = tf.RaggedTensor.from_row_lengths(tf.constant(rng.integers(0, V, int(lengths.sum())), tf.int64), lengths)
    y = rng.normal(size=(48, 1)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((ids, y)).batch(8)
    model.fit(ds, epochs=2, shuffle=False, verbose=0)

    table = layer.dynamic_tables[dynamic]
    exported = table.export()
    static_rows = layer.embedding_tables[static].numpy()
    assert not np.allclose(static_rows, rows)
    np.testing.assert_array_equal(exported["keys"].numpy(), np.arange(V))
    np.testing.assert_array_equal(exported["weights"].numpy(), static_rows)
    np.testing.assert_array_equal(exported["slots"].numpy(), layer.slot_variables[static]["accumulators"].numpy())
    assert int(table.step.numpy()) == 12  # 6 batches x 2 epochs


def test_inference_inserts_nothing_and_new_ids_grow_the_table():
    layer, _, dynamic = _layer(np.zeros((V, DIM), np.float32))
    table = layer.dynamic_tables[dynamic]
    fresh = tf.ragged.constant([[100, 101], [102]], tf.int64)
    out = layer({"d": fresh, "s": tf.ragged.constant([[1], [2]], tf.int64)}, training=False)
    np.testing.assert_array_equal(out["d"].numpy(), np.zeros((2, DIM)))
    assert int(table.size()) == V
    with tf.GradientTape() as tape:
        acts = layer({"d": fresh, "s": tf.ragged.constant([[1], [2]], tf.int64)}, training=True)
        loss = tf.reduce_sum(acts["d"]) + tf.reduce_sum(acts["s"])
    tape.gradient(loss, layer.trainable_variables)
    assert int(table.size()) == V + 3


@pytest.mark.parametrize("training", [False, True])
def test_string_table_in_a_functional_model(training):
    table = te.DynamicTableConfig("names", DIM, optimizer=te.optimizers.SGD(0.1), key_dtype=tf.string)
    layer = te.keras.TPUEmbedding({"n": _emb.FeatureConfig(table)})
    names = keras.Input(shape=(), dtype="string", name="n")
    model = keras.Model(names, keras.layers.Dense(1)(layer({"n": names})["n"]))
    x = tf.constant(["a", "b", "a", "c"])
    if training:
        model.compile(keras.optimizers.SGD(0.1), "mse")
        model.fit(x, np.ones((4, 1), np.float32), batch_size=4, verbose=0)
        assert int(layer.dynamic_tables[table].size()) == 3
    else:
        assert model(x).shape == (4, 1)
        assert int(layer.dynamic_tables[table].size()) == 0


def test_get_config_round_trip_keeps_the_dynamic_fields():
    table = te.DynamicTableConfig(
        "users",
        DIM,
        optimizer=te.optimizers.Adagrad(0.2, initial_accumulator_value=0.3),
        combiner="sqrtn",
        initializer=keras.initializers.RandomUniform(-0.1, 0.1),
        key_dtype=tf.string,
        initial_capacity=16,
        max_rows=500,
        admission=te.dynamic.FrequencyAdmission(3, max_pending_keys=99, pending_ttl_steps=4),
        eviction=te.dynamic.TTL(7),
        seed=5,
    )
    static = _emb.TableConfig(V, DIM, name="static", optimizer=te.optimizers.SGD(0.1))
    layer = te.keras.TPUEmbedding({"u": _emb.FeatureConfig(table), "s": _emb.FeatureConfig(static)})
    config = json.loads(json.dumps(layer.get_config()))
    rebuilt = te.keras.TPUEmbedding.from_config(config)
    (copy,) = rebuilt.dynamic_tables
    assert isinstance(copy, te.DynamicTableConfig)
    from tf_embed_ops.dynamic import config as dynamic_config

    assert dynamic_config.handle_attrs(copy) == dynamic_config.handle_attrs(table)
    assert repr(copy) == repr(table).replace(repr(table.optimizer), repr(copy.optimizer))
    assert [t.name for t in rebuilt.embedding_tables] == ["static"]


def test_model_save_and_load_model_keep_the_dynamic_table(tmp_path):
    rows = np.random.default_rng(2).normal(size=(V, DIM)).astype(np.float32)
    layer, static, dynamic = _layer(rows)
    model = _model(layer)
    model.compile(keras.optimizers.Adam(0.05), "mse")
    ids = tf.ragged.constant([[1, 2], [9], [], [7, 7, 9]], tf.int64)
    model.fit(ids, np.ones((4, 1), np.float32), batch_size=4, epochs=2, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    (loaded_layer,) = [x for x in loaded.layers if isinstance(x, te.keras.TPUEmbedding)]
    (copy,) = loaded_layer.dynamic_tables
    a, b = layer.dynamic_tables[dynamic].export(), loaded_layer.dynamic_tables[copy].export()
    for name in a:
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy())
    assert int(loaded_layer.dynamic_tables[copy].step.numpy()) == 2
    np.testing.assert_array_equal(loaded.predict(ids, verbose=0), model.predict(ids, verbose=0))
