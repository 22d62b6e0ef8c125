"""te.TPUEmbeddingV2 refuses malformed ragged row splits and weights that do not follow their ids with an error
naming the feature and the value (eager: ValueError; inside tf.function: InvalidArgumentError from the graph),
and nothing changes; the preprocessing never sees them."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te

api = tf.tpu.experimental.embedding


def _emb():
    t = api.TableConfig(64, 2, name="t", optimizer=api.SGD(1.0))
    emb = te.TPUEmbeddingV2({"video": api.FeatureConfig(table=t, output_shape=[4])})
    emb.build()
    return emb


def _ragged(splits, values=(1, 2, 3, 4)):
    return tf.RaggedTensor.from_row_splits(tf.constant(values, tf.int64), tf.constant(splits, tf.int64), validate=False)


BAD_SPLITS = [
    ([0, 2, 1, 3, 4], r"row_splits decreases at position 2 \(2 then 1\): row_splits = \[0, 2, 1, 3, 4\]"),
    ([0, 2, 3, 4, 9], r"row_splits ends at 9 but there are 4 values: row_splits = \[0, 2, 3, 4, 9\]"),
    ([1, 2, 3, 4, 4], r"row_splits\[0\] is 1, not 0: row_splits = \[1, 2, 3, 4, 4\]"),
    ([0, 2, 3, 4, 3], r"row_splits decreases at position 4 \(4 then 3\)"),
]


def _train(emb, features, weights=None):
    with tf.GradientTape() as tape:
        acts, batch = emb(features, weights)
        tape.watch(acts)
        loss = tf.reduce_sum(acts["video"])
    emb.apply_gradients(tape.gradient(loss, acts), batch)


@pytest.mark.parametrize("splits,match", BAD_SPLITS)
def test_bad_row_splits_are_refused_naming_the_feature_and_the_splits(splits, match):
    emb = _emb()
    before = emb.variables["t"]["parameters"].numpy()
    with pytest.raises(ValueError, match=rf"Feature video: bad row_splits of the input: {match}"):
        _train(emb, {"video": _ragged(splits)})
    np.testing.assert_array_equal(emb.variables["t"]["parameters"].numpy(), before)


def test_bad_row_splits_inside_tf_function_fail_in_the_graph_naming_the_feature():
    emb = _emb()
    before = emb.variables["t"]["parameters"].numpy()
    spec = tf.RaggedTensorSpec([None, None], tf.int64, row_splits_dtype=tf.int64)

    @tf.function(input_signature=[spec])
    def lookup(r):
        return emb({"video": r})[0]["video"]

    np.testing.assert_array_equal(lookup(_ragged([0, 1, 2, 3, 4])).shape, (4, 2))
    for splits, _ in BAD_SPLITS:
        with pytest.raises(
            tf.errors.InvalidArgumentError, match="Feature video: row_splits of the input must start at 0"
        ):
            lookup(_ragged(splits))
    np.testing.assert_array_equal(emb.variables["t"]["parameters"].numpy(), before)


def test_weights_with_other_row_splits_or_indices_are_refused_naming_the_feature():
    emb = _emb()
    before = emb.variables["t"]["parameters"].numpy()
    ids = _ragged([0, 1, 2, 3, 4])
    weights = tf.RaggedTensor.from_row_splits(tf.ones([4]), tf.constant([0, 2, 2, 3, 4], tf.int64))
    with pytest.raises(ValueError, match=r"Feature video: the weights' row_splits \[0, 2, 2, 3, 4\] differ"):
        _train(emb, {"video": ids}, {"video": weights})
    bad = _ragged([0, 1, 2, 3, 9])
    with pytest.raises(ValueError, match=r"Feature video: bad row_splits of the weights: row_splits ends at 9"):
        _train(emb, {"video": ids}, {"video": bad.with_values(tf.ones([4]))})
    sparse = ids.to_sparse()
    w = tf.SparseTensor(tf.constant([[0, 0], [1, 0], [2, 0], [3, 1]], tf.int64), tf.ones([4]), sparse.dense_shape)
    with pytest.raises(ValueError, match=r"Feature video: the weights' indices .* differ from the ids'"):
        _train(emb, {"video": sparse}, {"video": w})
    np.testing.assert_array_equal(emb.variables["t"]["parameters"].numpy(), before)
