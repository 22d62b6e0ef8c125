"""DistributedEmbedding where keras-rs 0.4.0's TensorFlow backend decides: a rank-1 dense batch for a feature
declared `(batch, 1)` (keras-rs embeds it as one id per sample; its own tests feed exactly that), and
`update_stats=True` (keras-rs's TensorFlow layer raises `ValueError`). Compared with keras-rs's own layer."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_embed_ops import keras as te_keras

keras_rs = pytest.importorskip("keras_rs")
B, VOCAB, DIM = 6, 20, 3


def _configs(combiner, declared=(B, 1)):
    table = keras_rs.layers.TableConfig(
        name="t",
        vocabulary_size=VOCAB,
        embedding_dim=DIM,
        initializer=keras.initializers.RandomUniform(-1.0, 1.0, seed=5),
        optimizer="adagrad",
        combiner=combiner,
    )
    return {"f": keras_rs.layers.FeatureConfig(name="f", table=table, input_shape=declared, output_shape=(B, DIM))}


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("declared", [(B, 1), (B, 4), (None, 1)])
def test_rank_1_batch_for_a_feature_declared_batch_by_n_is_one_id_per_sample_as_keras_rs(combiner, declared):
    configs = _configs(combiner, declared)
    theirs = keras_rs.layers.DistributedEmbedding(configs)
    ours = te_keras.DistributedEmbedding(configs)
    ids = tf.constant([3, 0, 19, 3, 7, 11], tf.int64)
    weights = tf.constant([0.5, 2.0, -1.0, 0.0, 1.0, 3.0], tf.float32)
    expected = theirs({"f": ids})
    values = theirs.get_embedding_tables()["t"]
    next(iter(ours.embedding_tables.values())).assign(values)
    table = np.asarray(values)
    np.testing.assert_allclose(ours({"f": ids})["f"].numpy(), table[ids.numpy()], rtol=0, atol=0)
    np.testing.assert_allclose(ours({"f": ids})["f"].numpy(), expected["f"].numpy(), rtol=1e-6, atol=1e-7)
    # Weighted: keras-rs applies a one-id sample's weight under "sum" only.
    got = ours({"f": ids}, {"f": weights})["f"].numpy()
    np.testing.assert_allclose(got, theirs({"f": ids}, {"f": weights})["f"].numpy(), rtol=1e-6, atol=1e-7)
    scale = weights.numpy()[:, None] if combiner == "sum" else 1.0
    np.testing.assert_allclose(got, table[ids.numpy()] * scale, rtol=1e-6, atol=1e-7)
    # The same ids as a (batch, 1) batch give the same activations.
    if declared[1] == 1:
        np.testing.assert_array_equal(ours({"f": ids[:, None]})["f"].numpy(), ours({"f": ids})["f"].numpy())


def test_a_rank_1_batch_trains_in_fit():
    configs = _configs("mean")
    ours = te_keras.DistributedEmbedding(configs, name="embedding")
    inp = {"f": keras.Input(shape=(), batch_size=B, dtype="int64", name="f")}
    model = keras.Model(inp, keras.layers.Dense(1)(ours(inp)["f"]))
    model.compile(optimizer="sgd", loss="mse")
    before = next(iter(ours.embedding_tables.values())).numpy()
    ids = np.array([3, 0, 19, 3, 7, 11])
    model.fit({"f": ids}, np.ones((B, 1), np.float32), batch_size=B, epochs=1, verbose=0)
    after = next(iter(ours.embedding_tables.values())).numpy()
    changed = np.flatnonzero(np.any(after != before, axis=1))
    np.testing.assert_array_equal(changed, np.unique(ids))


def test_a_rank_2_batch_for_a_rank_1_declaration_is_refused_naming_the_feature():
    # keras-rs's default-device layer would sum/average such a bag; a feature declared with one id per sample
    # refuses it here (docs/keras.md).
    table = keras_rs.layers.TableConfig(name="t", vocabulary_size=VOCAB, embedding_dim=DIM, optimizer="sgd")
    configs = {"f": keras_rs.layers.FeatureConfig(name="f", table=table, input_shape=(B,), output_shape=(B, DIM))}
    with pytest.raises(ValueError, match=r"Feature 'f': input of shape \(6, 2\) does not match"):
        te_keras.DistributedEmbedding(configs)({"f": tf.zeros((B, 2), tf.int64)})


@pytest.mark.parametrize("update_stats", [True, 1, "yes"])
def test_update_stats_true_raises_where_keras_rs_raises(update_stats):
    configs = _configs("sum")
    with pytest.raises(ValueError) as theirs:
        keras_rs.layers.DistributedEmbedding(configs, update_stats=update_stats)
    with pytest.raises(ValueError) as ours:
        te_keras.DistributedEmbedding(configs, update_stats=update_stats)
    assert str(ours.value) == str(theirs.value)
    # First thing in the constructor, before the configs are read: even bad configs give this error in both.
    for layer_cls in (keras_rs.layers.DistributedEmbedding, te_keras.DistributedEmbedding):
        with pytest.raises(ValueError, match="`update_stats` cannot be True"):
            layer_cls({}, update_stats=update_stats)


@pytest.mark.parametrize("update_stats", [False, 0, None])
def test_a_false_update_stats_is_accepted_as_by_keras_rs(update_stats):
    configs = _configs("sum")
    keras_rs.layers.DistributedEmbedding(configs, update_stats=update_stats)
    layer = te_keras.DistributedEmbedding(configs, update_stats=update_stats)
    restored = te_keras.DistributedEmbedding.from_config(layer.get_config())
    assert restored.get_config()["update_stats"] == update_stats
