"""ShardedEmbeddingLayer (Keras 3) on one machine: tape-driven training against the numpy reference, and
`model.fit` against the single-machine `tf_embed_ops.keras.TPUEmbedding` layer."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops.keras
from tests.numpy_reference import RefFeature, RefTable
from tests.numpy_reference import ref_activations as activations
from tests.numpy_reference import ref_row_gradients as row_gradients
from tf_embed_ops.distribute.keras_layer import ShardedEmbeddingLayer

emb_api = tf.tpu.experimental.embedding
INIT = np.linspace(-1.0, 1.0, 11 * 3, dtype=np.float32).reshape(11, 3)


def _feature_config():
    table = emb_api.TableConfig(11, 3, name="video", combiner="sqrtn", initializer=tf.constant_initializer(0.0))
    return {"watched": emb_api.FeatureConfig(table)}


def _set_table(layer, values: np.ndarray) -> None:
    ((table, var),) = layer.embedding_tables.items()
    if isinstance(layer, ShardedEmbeddingLayer):
        bounds = layer.embedding.shard_boundaries[table]
        for p, shard in enumerate(var.variables):
            shard.assign(values[bounds[p] : bounds[p + 1]])
    else:
        var.assign(values)


def _table(layer) -> np.ndarray:
    (var,) = layer.embedding_tables.values()
    return tf.convert_to_tensor(var).numpy()


@pytest.mark.parametrize("use_function", [False, True])
def test_backward_pass_updates_the_shards_like_the_reference(use_function):
    layer = ShardedEmbeddingLayer(_feature_config(), emb_api.Adagrad(0.3), num_shards=3)
    _set_table(layer, INIT)
    (table_config,) = layer.embedding_tables
    ref = RefTable(INIT, table_config.optimizer)

    def step(ids):
        with tf.GradientTape() as tape:
            acts = layer({"watched": ids}, training=True)
            loss = 0.5 * tf.reduce_sum(acts["watched"] ** 2)
        # The update hangs on the trigger's gradient, as in model.fit.
        tape.gradient(loss, layer.trainable_variables)

    step_fn = tf.function(step) if use_function else step
    for rows in ([[1, 5, 5], [10], []], [[0, 4], [7, 8, 9], [3]]):
        feature = RefFeature("video", rows)
        act = activations(feature, ref.params, "sqrtn")
        grads = {}
        row_gradients(feature, act, "sqrtn", grads)
        step_fn(tf.ragged.constant(rows, tf.int64, ragged_rank=1))
        ref.apply(grads, 0.3)
    np.testing.assert_allclose(_table(layer), ref.params, rtol=2e-5, atol=2e-6)
    inference = layer({"watched": tf.ragged.constant([[2, 3]], tf.int64)}, training=False)["watched"].numpy()
    expected = activations(RefFeature("video", [[2, 3]]), ref.params, "sqrtn")
    np.testing.assert_allclose(inference, expected, rtol=2e-5, atol=2e-6)


def _fit(layer) -> tuple:
    keras.utils.set_random_seed(3)
    ids = keras.Input(shape=(), dtype="int64", name="watched")
    acts = layer({"watched": ids})
    out = keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros")(acts["watched"])
    model = keras.Model(ids, out)
    model.compile(keras.optimizers.Adam(0.05), "mse")  # Adam: Grappler pruned a bare control edge here
    rng = np.random.default_rng(4)
    x = rng.integers(11, size=64).astype(np.int64)
    y = rng.normal(size=(64, 1)).astype(np.float32)
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return _table(layer), model.layers[-1].get_weights(), history.history["loss"]


@pytest.mark.slow
def test_model_fit_matches_the_single_machine_layer():
    sharded = ShardedEmbeddingLayer(_feature_config(), emb_api.Adagrad(0.1), num_shards=3)
    _set_table(sharded, INIT)
    single = tf_embed_ops.keras.TPUEmbedding(_feature_config(), emb_api.Adagrad(0.1))
    _set_table(single, INIT)
    table_s, dense_s, loss_s = _fit(sharded)
    table_1, dense_1, loss_1 = _fit(single)
    assert not np.allclose(table_s, INIT)
    np.testing.assert_allclose(table_s, table_1, rtol=1e-6, atol=1e-7)
    for a, b in zip(dense_s, dense_1, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(loss_s, loss_1, rtol=1e-6)
