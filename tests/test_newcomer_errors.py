"""Errors a new user meets first: a misspelled or missing feature key, an id outside the table, a synchronous
take that times out.  Each names what is wrong and what to do, and a rejected call changes nothing."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from embedding_test_util import embedding_state

import tf_embed_ops
from tf_embed_ops import keras as te_keras

emb_api = tf.tpu.experimental.embedding


def _feature_config():
    video = emb_api.TableConfig(6, 2, name="video", combiner="sum")
    user = emb_api.TableConfig(4, 2, name="user", combiner="sum")
    return {
        "watched": emb_api.FeatureConfig(video),
        "liked": emb_api.FeatureConfig(video),
        "user": emb_api.FeatureConfig(user),
    }


def _emb():
    emb = tf_embed_ops.TPUEmbedding(_feature_config(), emb_api.Adagrad(0.1))
    emb.build()
    return emb


def _ids(*values):
    return tf.constant(values, tf.int64)


def test_misspelled_key_names_the_missing_and_unexpected_keys_and_the_expected_ones():
    emb = _emb()
    before = embedding_state(emb)
    features = {"watched": _ids(1, 2), "liked": _ids(3, 4), "usr": _ids(0, 1)}
    with pytest.raises(ValueError) as e:
        emb.enqueue(features, training=True)
    assert str(e.value) == (
        "Argument `features` does not have the structure of `feature_config`: missing 'user'; unexpected 'usr' "
        "(did you mean 'user'?). Expected keys: 'liked', 'user', 'watched'."
    )
    # A lookup may name only some features (as TensorFlow's serving class): there the misspelled key is unknown.
    with pytest.raises(
        ValueError, match=r"not a subset of feature_config.*Unknown keys: 'usr' \(did you mean 'user'\?\)"
    ):
        emb(features)  # embedding_lookup / __call__
    for key, value in embedding_state(emb).items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)


def test_missing_key_alone_and_extra_key_alone():
    emb = _emb()
    with pytest.raises(ValueError, match=r"missing 'liked', 'user'\. Expected keys: 'liked', 'user', 'watched'"):
        emb.enqueue({"watched": _ids(1, 2)}, training=True)
    with pytest.raises(ValueError, match=r": unexpected 'clicked'\. Expected keys"):
        emb.enqueue({"watched": _ids(1), "liked": _ids(2), "user": _ids(3), "clicked": _ids(0)}, training=True)


def test_weights_dict_keys_are_checked_too():
    emb = _emb()
    x = tf.ragged.constant([[1], [2]], dtype=tf.int64)
    w = tf.ragged.constant([[1.0], [2.0]])
    features = {"watched": x, "liked": x, "user": x}
    with pytest.raises(
        ValueError,
        match=r"Argument `weights` does not have the structure .*unexpected 'likd' "
        r"\(did you mean 'liked'\?\)",
    ):
        emb.enqueue(features, weights={"watched": w, "likd": w, "user": w}, training=True)


def test_keras_layer_names_the_keys():
    layer = te_keras.TPUEmbedding(_feature_config(), emb_api.SGD(0.1))
    with pytest.raises(ValueError, match="missing 'user'; unexpected 'usr'"):
        layer({"watched": _ids(1, 2), "liked": _ids(3, 4), "usr": _ids(0, 1)})


def test_keras_functional_model_with_a_misspelled_input_names_it():
    layer = te_keras.TPUEmbedding(_feature_config(), emb_api.SGD(0.1))
    inputs = {k: keras.Input((), dtype="int64", name=k) for k in ("watched", "liked", "user_id")}
    with pytest.raises(ValueError, match="missing 'user'; unexpected 'user_id'"):
        layer(inputs)


def test_out_of_range_id_says_what_to_do_and_changes_nothing():
    emb = _emb()
    before = embedding_state(emb)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        emb.enqueue({"watched": _ids(1, 6), "liked": _ids(0, 1), "user": _ids(0, 1)}, training=True)
        with tf.GradientTape() as tape:
            acts = emb.dequeue()
            tape.watch(acts)
        emb.apply_gradients(tape.gradient(tf.add_n([tf.reduce_sum(a) for a in acts.values()]), acts))
    message = str(e.value)
    assert "ids[1] = 6 is not in [0, 6) (vocabulary_size of table 'video')" in message
    assert "raise the table's vocabulary_size, or hash the ids into range" in message
    assert "te.DynamicTableConfig" in message
    for key, value in embedding_state(emb).items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)


def test_timed_out_take_says_that_no_gradient_arrived_and_how_many_did():
    acc = tf_embed_ops.SparseConditionalAccumulator(tf.float32, shape=[4, 2], reduction_type="SUM")
    with pytest.raises(
        tf.errors.DeadlineExceededError,
        match=r"timed out after 0.1 seconds: 0 of the 2 gradients it waits for arrived "
        r"\(no gradient arrived: none was applied, or all were stale\); the accumulator",
    ):
        acc.take_grad(2, timeout=0.1)
    acc.apply_grad([1], tf.ones([1, 2]), local_step=0)
    with pytest.raises(tf.errors.DeadlineExceededError, match=r"1 of the 2 gradients it waits for arrived;") as e:
        acc.take_grad(2, timeout=0.1)
    assert "no gradient arrived" not in str(e.value)
    assert int(acc.num_accumulated()) == 1  # the timed-out take changed nothing
