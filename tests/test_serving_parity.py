"""Lookups against TensorFlow's own `TPUEmbeddingForServing` on CPU: subsets of the features, `output_shape`
sequence lookups, and the serving class's error wording. Same tables (copied), same inputs, same outputs."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops
from tf_embed_ops import _tf_compat

emb_api = tf.tpu.experimental.embedding
# TensorFlow's serving class looks up a part of the features only from this minor on (_tf_compat): the tests whose
# reference lookup is such a part are skipped before it, naming the minor.
SUBSET_REFERENCE = "TensorFlow's TPUEmbeddingForServing lookup of a subset of the features"


def _configs(output_shape=None, combiner="mean"):
    video = emb_api.TableConfig(12, 4, name="video", combiner=combiner)
    user = emb_api.TableConfig(7, 3, name="user", combiner=combiner)
    return {
        "watched": emb_api.FeatureConfig(table=video, output_shape=output_shape),
        "liked": emb_api.FeatureConfig(table=video),
        "user": emb_api.FeatureConfig(table=user),
    }


def _pair(output_shape=None, combiner="mean", optimizer=None):
    """(ours, TF's serving class) with identical random tables."""
    ours = tf_embed_ops.TPUEmbedding(_configs(output_shape, combiner), optimizer or emb_api.SGD(0.1))
    theirs = emb_api.TPUEmbeddingForServing(_configs(output_shape, combiner), emb_api.SGD(0.1))
    ours.build()
    theirs.build()
    rng = np.random.default_rng(7)
    for name in ("video", "user"):
        value = rng.normal(size=ours.variables[name]["parameters"].shape).astype(np.float32)
        ours.variables[name]["parameters"].assign(value)
        theirs.variables[name]["parameters"].assign(value)
    return ours, theirs


def _ragged(rows):
    return tf.ragged.constant(rows, dtype=tf.int64)


def _assert_nests_equal(got, want):
    tf.nest.assert_same_structure(got, want)
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want), strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("eager", [True, False])
def test_subset_lookup_matches_serving(eager):
    _tf_compat.require_reference(SUBSET_REFERENCE)
    ours, theirs = _pair()
    features = {"user": _ragged([[1, 2], [6], [0, 0, 3]]), "liked": _ragged([[11], [], [2, 5]])}
    weights = {"user": tf.ragged.constant([[0.5, 2.0], [1.0], [1.0, 3.0, -1.0]]), "liked": None}
    call = ours if eager else tf.function(ours)
    got = call(features, weights)
    assert set(got) == {"user", "liked"}
    _assert_nests_equal(got, theirs(features, weights))


def test_subset_lookup_single_feature_and_list_nest():
    video = emb_api.TableConfig(5, 2, name="video", combiner="sum")
    fc = [emb_api.FeatureConfig(table=video), emb_api.FeatureConfig(table=video)]
    ours = tf_embed_ops.TPUEmbedding(fc, emb_api.SGD(0.1))
    ours.build()
    ours.variables["video"]["parameters"].assign(np.arange(10, dtype=np.float32).reshape(5, 2))
    # A one-element list is the subset holding the first feature (key path "0").
    got = ours([tf.constant([4, 1], tf.int64)])
    np.testing.assert_array_equal(got[0].numpy(), [[8, 9], [2, 3]])


def test_subset_lookup_does_not_fix_other_shapes():
    ours, _ = _pair()
    ours({"user": tf.constant([1, 2], tf.int64)})
    shapes = [list(f.input_shape) for f in ours.config_proto.feature_descriptor]
    # Feature order: liked, user, watched (sorted dict keys); only "user" has a shape.
    assert shapes == [[], [2], []]


def test_unknown_key_raises_serving_message():
    ours, theirs = _pair()
    with pytest.raises(ValueError, match="Inputs are not a subset of feature_config") as e:
        ours({"nope": tf.constant([1], tf.int64)})
    assert "nope" in str(e.value)
    _tf_compat.require_reference(SUBSET_REFERENCE)
    with pytest.raises(ValueError, match="Inputs are not a subset of feature_config"):
        theirs({"nope": tf.constant([1], tf.int64)})


def test_enqueue_still_needs_every_feature():
    ours, _ = _pair()
    with pytest.raises(ValueError, match="structure of `feature_config`"):
        ours.enqueue({"user": tf.constant([1], tf.int64)})


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("output_shape", [[3, 4], [12], [6, 2]])
def test_output_shape_sequence_ragged_matches_serving(output_shape, combiner):
    # Batch 3: prod 12 = 4 positions per sample (padding the short rows, truncating the long one).
    ours, theirs = _pair(output_shape=output_shape, combiner=combiner)
    features = {
        "watched": _ragged([[1, 2, 3, 4, 5, 6], [7], []]),
        "liked": _ragged([[1], [2], [3]]),
        "user": _ragged([[1], [2, 3], [4]]),
    }
    weights = {"watched": tf.ragged.constant([[2.0] * 6, [3.0], []]), "liked": None, "user": None}
    got = ours(features, weights)
    assert got["watched"].shape == output_shape + [4]
    _assert_nests_equal(got, theirs(features, weights))


def test_output_shape_sequence_sparse_and_dense_match_the_ragged_form():
    _tf_compat.require_reference(SUBSET_REFERENCE)
    ours, theirs = _pair(output_shape=[3, 2])
    rows = [[5, 6, 7], [], [8]]
    ragged = _ragged(rows)
    want = theirs({"watched": ragged})["watched"]
    np.testing.assert_allclose(ours({"watched": ragged.to_sparse()})["watched"].numpy(), want.numpy())
    dense = tf.constant([5, 11, 8], tf.int64)
    want_dense = theirs({"watched": tf.RaggedTensor.from_tensor(dense[:, None])})["watched"]
    np.testing.assert_allclose(ours({"watched": dense})["watched"].numpy(), want_dense.numpy())
    np.testing.assert_allclose(ours({"watched": dense[:, None]})["watched"].numpy(), want_dense.numpy())


@pytest.mark.parametrize("output_shape", [[5], [2], [7, 1]])
def test_output_shape_neither_factor_nor_multiple_raises_tf_message(output_shape):
    ours, theirs = _pair(output_shape=output_shape)
    features = {"watched": _ragged([[1], [2, 3], [4]])}
    message = "Output shape set in the FeatureConfig should be the factor of the input data batch size"
    before = ours.variables["video"]["parameters"].numpy()
    with pytest.raises(ValueError, match=message):
        ours(features)
    full = dict(features, liked=_ragged([[1], [2], [3]]), user=_ragged([[1], [2], [3]]))
    with pytest.raises(ValueError, match=message):
        ours.enqueue(full)
    np.testing.assert_array_equal(ours.variables["video"]["parameters"].numpy(), before)
    _tf_compat.require_reference(SUBSET_REFERENCE)
    with pytest.raises(ValueError, match=message):
        theirs(features)


def test_output_shape_sequence_trains_like_the_numpy_reference():
    """SGD on a [B*L] sequence lookup: each kept position's gradient lands on its row, padding on none."""
    ours, _ = _pair(output_shape=[2, 3], optimizer=emb_api.SGD(0.5))
    table = ours.variables["video"]["parameters"].numpy()
    features = {"watched": _ragged([[1, 2, 3, 9], [4]]), "liked": _ragged([[1], [2]]), "user": _ragged([[1], [2]])}
    ours.enqueue(features)
    acts = ours.dequeue()
    assert acts["watched"].shape == [2, 3, 4]
    rng = np.random.default_rng(3)
    grads = {k: tf.constant(rng.normal(size=v.shape).astype(np.float32)) for k, v in acts.items()}
    ours.apply_gradients(grads)
    want = table.copy()
    g = grads["watched"].numpy()
    for row, (b, p) in zip([1, 2, 3, 4], [(0, 0), (0, 1), (0, 2), (1, 0)], strict=True):  # id 9 truncated
        want[row] -= 0.5 * g[b, p]
    for key in ("liked",):  # mean combiner, one id per sample
        for b, row in enumerate([1, 2]):
            want[row] -= 0.5 * grads[key].numpy()[b]
    np.testing.assert_allclose(ours.variables["video"]["parameters"].numpy(), want, rtol=1e-6, atol=1e-6)


def test_weight_for_dense_input_message():
    _tf_compat.require_reference(SUBSET_REFERENCE)
    ours, theirs = _pair()
    features = {"user": tf.constant([1, 2], tf.int64)}
    weights = {"user": tf.constant([1.0, 2.0])}
    with pytest.raises(ValueError, match=r"Weight specified for user, but input is dense\.") as ours_error:
        ours(features, weights)
    with pytest.raises(ValueError, match=r"Weight specified for user, but input is dense\.") as tf_error:
        theirs(features, weights)
    assert str(ours_error.value).startswith(str(tf_error.value))


def test_weight_kind_mismatch_message():
    _tf_compat.require_reference(SUBSET_REFERENCE)
    ours, theirs = _pair()
    features = {"user": _ragged([[1], [2]]).to_sparse()}
    weights = {"user": tf.constant([1.0, 2.0])}
    with pytest.raises(ValueError) as tf_error:
        theirs(features, weights)
    with pytest.raises(ValueError) as ours_error:
        ours(features, weights)
    assert str(ours_error.value).startswith(str(tf_error.value))
    assert "same kind" in str(ours_error.value)


def test_keras_layer_output_shape_sequence_matches_serving():
    from tf_embed_ops import keras as te_keras

    layer = te_keras.TPUEmbedding(_configs(output_shape=[3, 4]), emb_api.SGD(0.1))
    theirs = emb_api.TPUEmbeddingForServing(_configs(output_shape=[3, 4]), emb_api.SGD(0.1))
    theirs.build()
    features = {
        "watched": _ragged([[1, 2, 3, 4, 5], [7], []]),
        "liked": _ragged([[1], [2], [3]]),
        "user": _ragged([[1], [2, 3], [4]]),
    }
    layer(features)
    for table, variable in layer.embedding_tables.items():
        theirs.variables[table.name]["parameters"].assign(np.asarray(variable))
    _assert_nests_equal(layer(features), theirs(features))
    with pytest.raises(ValueError, match="should be the factor of the input data batch size"):
        five = _ragged([[1], [2], [3], [4], [5]])  # 12 samples are no multiple of 5
        layer(dict(features, watched=five, liked=five, user=five))


def test_keras_layer_trains_an_output_shape_sequence_like_numpy():
    """The Keras training path (fused update in the backward pass) with an output_shape sequence: SGD moves each
    kept position's row by lr x its gradient; truncated ids and padding positions move nothing."""
    from tf_embed_ops import keras as te_keras

    video = emb_api.TableConfig(12, 4, name="video", combiner="mean", optimizer=emb_api.SGD(0.5))
    layer = te_keras.TPUEmbedding({"watched": emb_api.FeatureConfig(table=video, output_shape=[2, 3])})
    features = {"watched": _ragged([[1, 2, 3, 9], [4]])}
    layer(features)
    (table_var,) = layer.embedding_tables.values()
    before = np.asarray(table_var).copy()
    coefficients = tf.constant(np.random.default_rng(1).normal(size=(2, 3, 4)).astype(np.float32))
    with tf.GradientTape() as tape:
        out = layer(features, training=True)["watched"]
        loss = tf.reduce_sum(out * coefficients)
    tape.gradient(loss, layer.trainable_variables)  # the backward pass runs the fused update
    want = before.copy()
    for row, (b, p) in zip([1, 2, 3, 4], [(0, 0), (0, 1), (0, 2), (1, 0)], strict=True):  # id 9 truncated
        want[row] -= 0.5 * coefficients.numpy()[b, p]
    np.testing.assert_allclose(np.asarray(table_var), want, rtol=1e-6, atol=1e-6)
