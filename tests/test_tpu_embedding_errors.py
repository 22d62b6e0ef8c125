"""Misuse of the mid-level API: every rejected call raises a named error and leaves tables and slots unchanged."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from embedding_test_util import assert_embedding_unchanged, embedding_state

import tf_embed_ops

emb_api = tf.tpu.experimental.embedding


def _emb(optimizer=None, **table_kwargs):
    table = emb_api.TableConfig(6, 2, name="t", combiner="sum", **table_kwargs)
    fc = {"a": emb_api.FeatureConfig(table=table), "b": emb_api.FeatureConfig(table=table)}
    emb = tf_embed_ops.TPUEmbedding(fc, optimizer if optimizer is not None else emb_api.Adagrad(0.1))
    emb.build()
    return emb


def test_constructor_rejects_bad_configs():
    t = emb_api.TableConfig(6, 2, name="same")
    u = emb_api.TableConfig(6, 2, name="same")
    with pytest.raises(ValueError, match="unique name"):
        tf_embed_ops.TPUEmbedding({"a": emb_api.FeatureConfig(t), "b": emb_api.FeatureConfig(u)}, emb_api.SGD(0.1))
    with pytest.raises(ValueError, match="unsupported optimizer"):
        tf_embed_ops.TPUEmbedding(emb_api.FeatureConfig(emb_api.TableConfig(6, 2)), keras.optimizers.RMSprop(0.1))
    with pytest.raises(ValueError, match="FeatureConfig"):
        tf_embed_ops.TPUEmbedding({"a": emb_api.TableConfig(6, 2)}, emb_api.SGD(0.1))
    with pytest.raises(ValueError, match="at least one"):
        tf_embed_ops.TPUEmbedding({}, emb_api.SGD(0.1))


def test_unnamed_tables_get_tensorflows_names():
    t0, t1 = emb_api.TableConfig(6, 2), emb_api.TableConfig(6, 2)
    emb = tf_embed_ops.TPUEmbedding({"z": emb_api.FeatureConfig(t0), "a": emb_api.FeatureConfig(t1)}, None)
    # dict keys sort: "a" (t1) comes first in nest.flatten, so it is table_0
    assert (t1.name, t0.name) == ("table_0", "table_1")
    assert [t.name for t in emb.embedding_tables] == ["table_0", "table_1"]


@pytest.mark.parametrize(
    "features, weights, match",
    [
        ({"a": tf.constant([1], tf.int64)}, None, "structure"),
        (
            {"a": tf.constant([1], tf.int64), "b": tf.constant([2], tf.int64)},
            {"a": tf.constant([1.0]), "b": None},
            "Weight specified for a, but input is dense",
        ),
        ({"a": tf.constant([[1, 2]], tf.int64), "b": tf.constant([2], tf.int64)}, None, "a"),
        (
            {"a": tf.ragged.constant([[1]], dtype=tf.int64), "b": tf.constant([2], tf.int64)},
            {"a": tf.ragged.constant([[1.0]]).to_sparse(), "b": None},
            "does not match",
        ),
    ],
)
def test_enqueue_rejects_bad_inputs_and_changes_nothing(features, weights, match):
    emb = _emb()
    before = embedding_state(emb)
    with pytest.raises(ValueError, match=match):
        emb.enqueue(features, weights=weights)
    assert_embedding_unchanged(emb, before)


def test_apply_gradients_misuse():
    emb = tf_embed_ops.TPUEmbedding({"a": emb_api.FeatureConfig(emb_api.TableConfig(6, 2, name="t"))}, emb_api.SGD(1.0))
    with pytest.raises(RuntimeError, match="unbuilt"):
        emb.apply_gradients({"a": tf.zeros([1, 2])})
    with pytest.raises(RuntimeError, match="unbuilt"):
        emb.dequeue()
    emb.build()
    with pytest.raises(RuntimeError, match="before enqueue"):
        emb.apply_gradients({"a": tf.zeros([1, 2])})

    emb = _emb()
    emb.enqueue({"a": tf.constant([1, 2], tf.int64), "b": tf.constant([3, 4], tf.int64)})
    before = embedding_state(emb)
    with pytest.raises(ValueError, match="Expected shape"):
        emb.apply_gradients({"a": tf.zeros([2, 3]), "b": tf.zeros([2, 2])})
    with pytest.raises(ValueError, match="non-tensor"):
        emb.apply_gradients({"a": np.zeros([2, 2], np.float32), "b": tf.zeros([2, 2])})
    with pytest.raises(ValueError, match="structure"):
        emb.apply_gradients({"a": tf.zeros([2, 2])})
    assert_embedding_unchanged(emb, before)

    emb.enqueue({"a": tf.constant([1, 2], tf.int64), "b": tf.constant([3, 4], tf.int64)}, training=False)
    with pytest.raises(RuntimeError, match="training=False"):
        emb.apply_gradients({"a": tf.ones([2, 2]), "b": tf.ones([2, 2])})
    assert_embedding_unchanged(emb, before)


def test_out_of_range_id_is_rejected_by_the_kernel_without_writes():
    emb = _emb()
    emb.enqueue({"a": tf.constant([1, 6], tf.int64), "b": tf.constant([3, 4], tf.int64)})
    before = embedding_state(emb)
    with pytest.raises(tf.errors.InvalidArgumentError, match="6"):
        emb.dequeue()
    with pytest.raises(tf.errors.InvalidArgumentError, match="6"):
        emb.apply_gradients({"a": tf.ones([2, 2]), "b": tf.ones([2, 2])})
    assert_embedding_unchanged(emb, before)


def test_table_without_optimizer_looks_up_but_cannot_train():
    table = emb_api.TableConfig(6, 2, name="t")
    emb = tf_embed_ops.TPUEmbedding({"a": emb_api.FeatureConfig(table)}, None)
    assert emb.slot_variables == {table: {}}
    out = emb({"a": tf.constant([0, 5], tf.int64)})["a"]
    np.testing.assert_array_equal(out.numpy(), emb.embedding_tables[table].numpy()[[0, 5]])
    emb.enqueue({"a": tf.constant([0], tf.int64)})
    with pytest.raises(RuntimeError, match="no optimizer"):
        emb.apply_gradients({"a": tf.ones([1, 2])})


def test_dequeue_in_another_function_than_enqueue_is_a_clear_error():
    emb = _emb()

    @tf.function
    def enqueue():
        emb.enqueue({"a": tf.constant([1], tf.int64), "b": tf.constant([2], tf.int64)})

    @tf.function
    def dequeue():
        return emb.dequeue()

    enqueue()
    with pytest.raises(RuntimeError, match="same tf.function"):
        dequeue()
