"""tf_embed_ops.SparseConditionalAccumulator's sharing and lifetime (docs/sparse_accumulator.md): independent eager
instances, shared names and containers, a handle in control flow and in a tf.function."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import tensorflow as tf
from sparse_accumulator_support import IA, assert_take

from tf_embed_ops.sparse_accumulator import SparseConditionalAccumulator

# --- sharing and lifetime ----------------------------------------------------------------------------------


def test_eager_instances_are_independent_and_survive_each_other():
    a = SparseConditionalAccumulator(tf.float32)
    b = SparseConditionalAccumulator(tf.float32)
    a.apply_grad([0], [[1.0]])
    assert int(a.num_accumulated()) == 1 and int(b.num_accumulated()) == 0
    del a
    gc.collect()
    c = SparseConditionalAccumulator(tf.float32)
    b.apply_grad([1], [[2.0]])
    c.apply_grad([2], [[3.0]])
    assert_take(tuple(t.numpy() for t in b.take_grad(1)), [1], [[2.0]], [-1, 1])
    assert_take(tuple(t.numpy() for t in c.take_grad(1)), [2], [[3.0]], [-1, 1])


def test_eager_shared_name_shares_and_checks_compatibility():
    a = SparseConditionalAccumulator(tf.float32, shape=[None, 2], shared_name="accum_test_shared")
    b = SparseConditionalAccumulator(tf.float32, shape=[None, 2], shared_name="accum_test_shared")
    a.apply_grad([0], [[1.0, 1.0]])
    assert int(b.num_accumulated()) == 1
    for kwargs in (
        dict(dtype=tf.float64, shape=[None, 2]),
        dict(dtype=tf.float32, shape=[None, 3]),
        dict(dtype=tf.float32, shape=[None, 2], reduction_type="SUM"),
    ):
        with pytest.raises(IA, match="Shared accumulator mismatch"):
            SparseConditionalAccumulator(shared_name="accum_test_shared", **kwargs)
    assert int(a.num_accumulated()) == 1


def test_graph_shared_name_container_and_private_per_session():
    with tf.Graph().as_default() as g:
        a = SparseConditionalAccumulator(tf.float32, shared_name="s")
        b = SparseConditionalAccumulator(tf.float32, shared_name="s")
        private = SparseConditionalAccumulator(tf.float32)
        with g.container("other"):
            c = SparseConditionalAccumulator(tf.float32, shared_name="s")
        apply_a = a.apply_grad([0], [[1.0]])
        apply_private = private.apply_grad([0], [[1.0]])
        sizes = [acc.num_accumulated() for acc in (a, b, c, private)]
        with tf.compat.v1.Session() as sess:
            sess.run([apply_a, apply_private])
            assert sess.run(sizes) == [1, 1, 0, 1]
        with tf.compat.v1.Session() as sess:  # a new session: fresh accumulators
            assert sess.run(sizes) == [0, 0, 0, 0]


def test_graph_shared_name_mismatch_is_invalid_argument():
    with tf.Graph().as_default():
        a = SparseConditionalAccumulator(tf.float32, shared_name="m")
        b = SparseConditionalAccumulator(tf.float64, shared_name="m")
        with tf.compat.v1.Session() as sess:
            sess.run(a.num_accumulated())
            with pytest.raises(IA, match="Shared accumulator mismatch"):
                sess.run(b.num_accumulated())


# --- control flow ------------------------------------------------------------------------------------------


def test_handle_works_inside_cond_and_while_loop():
    acc = SparseConditionalAccumulator(tf.float32, shape=[None, 1], reduction_type="SUM")

    @tf.function
    def step(n):
        def body(i):
            acc.apply_grad(tf.reshape(tf.cast(i, tf.int64), [1]), tf.ones([1, 1]))
            return i + 1

        tf.while_loop(lambda i: i < n, body, [tf.constant(0)])
        return tf.cond(acc.num_accumulated() >= n, lambda: acc.take_grad(n).values, lambda: tf.zeros([0, 1]))

    np.testing.assert_array_equal(step(tf.constant(3)).numpy(), np.ones([3, 1]))
    assert int(acc.num_accumulated()) == 0


def test_function_created_accumulator_persists_across_calls():
    @tf.function
    def make_and_count():
        acc = SparseConditionalAccumulator(tf.float32, reduction_type="SUM")
        acc.apply_grad([0], [[1.0]], local_step=100)
        return acc.num_accumulated()

    assert int(make_and_count()) == 1
    assert int(make_and_count()) == 2  # kernel-private, as TensorFlow's accumulator in a function
