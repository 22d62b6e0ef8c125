"""The shape functions of every registered op (cc/ops/*.cc), through the raw ops with symbolic shapes in a
tf.function: the static shapes they infer, and the malformed static shapes they reject while the graph is built."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from embedding_test_util import make_config

import tf_embed_ops

DIMS = (3, 5)  # table 0, table 1


@pytest.fixture(scope="module")
def ops():
    return tf_embed_ops.ops


@pytest.fixture(scope="module")
def setup():
    # Feature 0 reads table 0 (dim 3), feature 1 reads table 1 (dim 5).
    config = make_config(
        [{"name": "a", "vocab": 10, "dim": DIMS[0]}, {"name": "b", "vocab": 10, "dim": DIMS[1]}],
        [("f0", 0, [4]), ("f1", 1, [2, 3])],
    ).SerializeToString()
    tables = [tf.Variable(np.zeros((10, d), np.float32)) for d in DIMS]
    return config, tables


def _trace(fn, *signature):
    """Traces fn under the input signature (nothing runs) and returns what fn returned while tracing."""
    seen = {}

    @tf.function(input_signature=list(signature))
    def traced(*args):
        seen["out"] = fn(*args)
        return 0

    traced.get_concrete_function()
    return seen["out"]


def _activations(ops, config, tables, splits, ids, weights, sample_shapes):
    return ops.tf_embed_embedding_activations(
        sample_indices_or_row_splits=splits,
        embedding_indices=ids,
        aggregation_weights=weights,
        sample_shapes=sample_shapes,
        tables=[t.handle for t in tables],
        config=config,
    )


def _empty(dtype):
    return tf.zeros([0], dtype)


def _dense_activations(ops, setup, ids, sample_shapes):
    """Both features' activations for dense ids (no row splits, no weights)."""
    config, tables = setup
    return _activations(ops, config, tables, [_empty(tf.int64)] * 2, ids, [_empty(tf.float32)] * 2, sample_shapes)


def test_activations_shape_is_sample_shape_plus_each_tables_dim(ops, setup):
    def lookup(ids0, ids1):
        acts = _dense_activations(ops, setup, [ids0, ids1], [tf.constant([4], tf.int64), tf.constant([2, 3], tf.int64)])
        return [a.shape.as_list() for a in acts]

    spec = tf.TensorSpec([None], tf.int64)
    assert _trace(lookup, spec, spec) == [[4, DIMS[0]], [2, 3, DIMS[1]]]


def test_activations_with_symbolic_sample_shapes(ops, setup):
    def lookup(ids, shape_of_known_rank, shape_of_unknown_length):
        acts = _dense_activations(ops, setup, [ids, ids], [shape_of_known_rank, shape_of_unknown_length])
        return [a.shape for a in acts]

    known, unknown = _trace(
        lookup,
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([2], tf.int64),  # a rank-2 sample shape whose values are not known
        tf.TensorSpec([None], tf.int64),  # a sample shape of unknown rank
    )
    assert known.as_list() == [None, None, DIMS[0]]
    assert known.rank == 3
    assert unknown.rank is None


@pytest.mark.parametrize(
    "bad, pattern",
    [
        ("ids_rank", "rank 1"),
        ("weights_rank", "rank 1"),
        ("sample_shapes_rank", "rank 1"),
        ("too_many_features", "2 feature descriptors but the op has more features"),
    ],
)
def test_activations_reject_malformed_static_shapes(ops, setup, bad, pattern):
    config, tables = setup
    n = 3 if bad == "too_many_features" else 2

    def lookup(ids):
        ids_list = [tf.reshape(ids, [-1, 1]) if bad == "ids_rank" else ids] + [ids] * (n - 1)
        weights = [tf.zeros([1, 1]) if bad == "weights_rank" else _empty(tf.float32)] + [_empty(tf.float32)] * (n - 1)
        shapes = [tf.constant([[4]], tf.int64) if bad == "sample_shapes_rank" else tf.constant([4], tf.int64)]
        shapes += [tf.constant([2, 3], tf.int64)] * (n - 1)
        return _activations(ops, config, tables, [_empty(tf.int64)] * n, ids_list, weights, shapes)

    with pytest.raises(ValueError, match=pattern):
        _trace(lookup, tf.TensorSpec([None], tf.int64))


def _send(ops, config, tables, gradients, learning_rates, sample_shapes):
    return ops.tf_embed_send_tpu_embedding_gradients(
        inputs=gradients,
        learning_rates=learning_rates,
        sample_indices_or_row_splits=[_empty(tf.int64)] * 2,
        embedding_indices=[_empty(tf.int64)] * 2,
        aggregation_weights=[_empty(tf.float32)] * 2,
        sample_shapes=sample_shapes,
        tables=[t.handle for t in tables],
        slots=[],
        config=config,
    )


def test_send_accepts_gradients_compatible_with_the_activations(ops, setup):
    config, tables = setup

    def send(g0, g1, lr):
        op = _send(ops, config, tables, [g0, g1], [lr], [tf.constant([4], tf.int64), tf.constant([2, 3], tf.int64)])
        return op.type

    # Unknown leading dims merge with the known sample shapes.
    assert (
        _trace(
            send,
            tf.TensorSpec([None, DIMS[0]], tf.float32),
            tf.TensorSpec([2, None, None], tf.float32),
            tf.TensorSpec([], tf.float32),
        )
        == "TfEmbed>SendTPUEmbeddingGradients"
    )


@pytest.mark.parametrize(
    "g0_shape, lr_shape, pattern",
    [
        ([4, DIMS[0] + 1], [], "Dimension 1 in both shapes must be equal"),  # the wrong embedding dim
        ([5, DIMS[0]], [], "Dimension 0 in both shapes must be equal"),  # the wrong sample count
        ([4], [], "incompatible|rank"),  # no embedding dim
        ([4, DIMS[0]], [1], "rank 0"),  # a learning rate that is not a scalar
    ],
)
def test_send_rejects_malformed_static_shapes(ops, setup, g0_shape, lr_shape, pattern):
    config, tables = setup

    def send(g0, g1, lr):
        return _send(ops, config, tables, [g0, g1], [lr], [tf.constant([4], tf.int64), tf.constant([2, 3], tf.int64)])

    with pytest.raises(ValueError, match=pattern):
        _trace(
            send,
            tf.TensorSpec(g0_shape, tf.float32),
            tf.TensorSpec([2, 3, DIMS[1]], tf.float32),
            tf.TensorSpec(lr_shape, tf.float32),
        )


def test_sparse_accumulator_shapes(ops):
    def build(indices, values, step):
        handle = ops.tf_embed_anonymous_sparse_accumulator(dtype=tf.float32, shape=[None, 3])
        named = ops.tf_embed_sparse_accumulator(dtype=tf.float32, shape=[None, 3], shared_name="shape_fn_test")
        ops.tf_embed_sparse_accumulator_apply_gradient(
            handle=handle,
            local_step=step,
            gradient_indices=indices,
            gradient_values=values,
            gradient_shape=tf.constant([10, 3], tf.int64),
            has_known_shape=True,
        )
        taken = ops.tf_embed_sparse_accumulator_take_gradient(
            handle=handle, num_required=1, timeout_seconds=-1.0, dtype=tf.float32
        )
        count = ops.tf_embed_sparse_accumulator_num_accumulated(handle=handle)
        ops.tf_embed_sparse_accumulator_set_global_step(handle=handle, new_global_step=step)
        return handle.shape, named.shape, [t.shape for t in taken], count.shape

    handle, named, taken, count = _trace(
        build,
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None, 3], tf.float32),
        tf.TensorSpec([], tf.int64),
    )
    assert handle.as_list() == [] and named.as_list() == [] and count.as_list() == []
    indices, values, dense_shape = taken
    assert indices.as_list() == [None]
    assert values.rank is None  # the held values' rank is known only at run time
    assert dense_shape.as_list() == [None]


@pytest.mark.parametrize("which", ["apply_step", "take_num_required", "take_timeout", "set_step", "handle"])
def test_sparse_accumulator_ops_reject_non_scalar_arguments(ops, which):
    def build(vector):
        handle = ops.tf_embed_anonymous_sparse_accumulator(dtype=tf.float32, shape=[None, 3])
        if which == "handle":
            return ops.tf_embed_sparse_accumulator_num_accumulated(handle=tf.stack([handle, handle]))
        if which == "apply_step":
            return ops.tf_embed_sparse_accumulator_apply_gradient(
                handle=handle,
                local_step=vector,
                gradient_indices=_empty(tf.int64),
                gradient_values=tf.zeros([0, 3]),
                gradient_shape=_empty(tf.int64),
                has_known_shape=False,
            )
        if which == "set_step":
            return ops.tf_embed_sparse_accumulator_set_global_step(handle=handle, new_global_step=vector)
        num_required = tf.cast(vector, tf.int32) if which == "take_num_required" else 1
        timeout = tf.cast(vector, tf.float32) if which == "take_timeout" else -1.0
        return ops.tf_embed_sparse_accumulator_take_gradient(
            handle=handle, num_required=num_required, timeout_seconds=timeout, dtype=tf.float32
        )

    with pytest.raises(ValueError, match="rank 0|must be rank 0|Shape must be rank"):
        _trace(build, tf.TensorSpec([2], tf.int64))
