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


# ------------------------------------------------------------------ frozen_tables (as te.keras.TPUEmbedding)


def _two_tables(frozen_optimizer=None, other_optimizer=None) -> dict:
    init = tf.random_uniform_initializer(-1.0, 1.0, seed=4)
    pretrained = emb_api.TableConfig(20, 3, init, frozen_optimizer, combiner="sum", name="pretrained")
    other = emb_api.TableConfig(20, 3, init, other_optimizer, combiner="sum", name="other")
    return {"p": emb_api.FeatureConfig(pretrained), "o": emb_api.FeatureConfig(other)}


def _trained_by_one_step(layer) -> dict:
    """{table name: changed by one tape-driven training step}."""
    before = {t.name: _full_table(v) for t, v in layer.embedding_tables.items()}
    ids = {"p": tf.constant([1, 7, 19], tf.int64), "o": tf.constant([0, 7, 12], tf.int64)}
    with tf.GradientTape() as tape:
        acts = layer(ids, training=True)
        loss = tf.reduce_sum(acts["p"] ** 2) + tf.reduce_sum(acts["o"] ** 2)
    tape.gradient(loss, layer.trainable_variables)
    return {t.name: not np.array_equal(_full_table(v), before[t.name]) for t, v in layer.embedding_tables.items()}


def _full_table(var) -> np.ndarray:
    return tf.convert_to_tensor(var).numpy()


def test_sharded_layer_refuses_a_table_without_an_optimizer_naming_it():
    features = _two_tables(other_optimizer=emb_api.SGD(0.1))
    with pytest.raises(ValueError, match=r"Table 'pretrained' has no optimizer .*frozen_tables=\['pretrained'\]"):
        ShardedEmbeddingLayer(features, num_shards=2)
    assert features["p"].table.optimizer is None and isinstance(features["o"].table.optimizer, emb_api.SGD)


@pytest.mark.parametrize("default_optimizer", [None, "adagrad"])
def test_sharded_layer_frozen_table_is_never_trained_and_the_others_are(default_optimizer):
    if default_optimizer is None:
        features, optimizer = _two_tables(other_optimizer=emb_api.SGD(0.5)), None
    else:
        features, optimizer = _two_tables(), emb_api.Adagrad(0.5)
    layer = ShardedEmbeddingLayer(features, optimizer, num_shards=2, frozen_tables=["pretrained"])
    # The frozen table takes no default optimizer and has no slots; the other one takes the default.
    assert features["p"].table.optimizer is None and features["o"].table.optimizer is not None
    assert {t.name: sorted(s) for t, s in layer.embedding.slot_variables.items()}.get("pretrained", []) == []
    assert _trained_by_one_step(layer) == {"pretrained": False, "other": True}


@pytest.mark.parametrize(
    "frozen, features, message",
    [
        (["nope"], _two_tables(other_optimizer=emb_api.SGD(0.1)), r"frozen_tables: unknown table 'nope'"),
        ("pretrained", _two_tables(other_optimizer=emb_api.SGD(0.1)), r"frozen_tables: expected a list of table"),
        (
            ["pretrained"],
            _two_tables(emb_api.SGD(0.1), emb_api.SGD(0.1)),
            r"table 'pretrained' has its own optimizer \(SGD\)",
        ),
    ],
)
def test_sharded_layer_refuses_bad_frozen_tables(frozen, features, message):
    optimizers = [f.table.optimizer for f in features.values()]
    with pytest.raises(ValueError, match=message):
        ShardedEmbeddingLayer(features, num_shards=2, frozen_tables=frozen)
    assert [f.table.optimizer for f in features.values()] == optimizers
