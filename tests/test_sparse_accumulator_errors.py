"""tf_embed_ops.SparseConditionalAccumulator refusing bad input (docs/sparse_accumulator.md), eagerly, in tf.function
and in a TF1 graph/session: bad gradients, counts, steps, dtypes and timeouts, each refused with its message and the
accumulator unchanged."""

from __future__ import annotations

import pytest
import tensorflow as tf
from sparse_accumulator_support import (
    IA,
    apply,
    assert_take,
    count,
    runner_fixture,  # noqa: F401 (the `runner` fixture)
    take,
)

from tf_embed_ops import _loader
from tf_embed_ops.sparse_accumulator import SparseConditionalAccumulator

# --- gradients ---------------------------------------------------------------------------------------------


BAD_GRADIENTS = [
    # (accumulator shape, kwargs, message) — each after one valid gradient [[1, 2]] at row 0 is held.
    ([3, 2], dict(indices=[[0]], values=[[1.0, 1.0]]), r"Input indices should be vector but received shape: \[1,1\]"),
    ([3, 2], dict(indices=[0], values=1.0), "Values cannot be 0-dimensional"),
    ([3, 2], dict(indices=[0, 1], values=[[1.0, 1.0]]), "Expected 2 non-empty input values, got 1"),
    ([3, 2], dict(indices=[0], values=[[1.0, 1.0]], grad_shape=[3]), "expected shape rank at least 2, got 1"),
    ([3, 2], dict(indices=[0], values=[[1.0, 1.0]], grad_shape=[]), "expected shape rank at least 2, got 0"),
    ([3, 2], dict(indices=[0], values=[[1.0, 1.0]], grad_shape=[-1, 2]), "expected shape dim 0 to be 3, got -1"),
    ([3, 2], dict(indices=[1, 3], values=[[1.0, 1.0]] * 2), "index of slice 1 exceeded limits of shape; index is 3"),
    ([3, 2], dict(indices=[1, -5], values=[[1.0, 1.0]] * 2), r"gradient_indices\[1\] = -5 is negative"),
    (None, dict(indices=[-1], values=[[1.0, 1.0]]), r"gradient_indices\[0\] = -1 is negative"),
    ([3, 2], dict(indices=[1], values=[[1.0]]), "expected values dim 1 to be 2, got 1"),
    ([3, 2], dict(indices=[1], values=[1.0]), "expected values rank 2, got 1"),
    # The first failing check wins: nnz before range, grad_shape before range, range before values dims.
    ([3, 2], dict(indices=[5, 6], values=[[1.0, 1.0]]), "Expected 2 non-empty input values"),
    ([3, 2], dict(indices=[5], values=[[1.0]], grad_shape=[4, 2]), "expected shape dim 0 to be 3, got 4"),
    ([3, 2], dict(indices=[5], values=[[1.0]]), "index of slice 0 exceeded limits"),
]


@pytest.mark.parametrize("shape,kwargs,message", BAD_GRADIENTS)
@pytest.mark.parametrize("local_step", [0, -1])
def test_bad_gradient_is_rejected_without_side_effect(runner, shape, kwargs, message, local_step):
    """Also when stale (local_step -1 < global step 0): ours validates before the stale check."""
    acc = runner.make(tf.float32, shape=shape)
    apply(runner, acc, [0], [[1.0, 2.0]])
    with pytest.raises(IA, match=message):
        apply(runner, acc, local_step=local_step, **kwargs)
    assert count(runner, acc) == 1
    assert_take(take(runner, acc), [0], [[1.0, 2.0]], [shape[0] if shape else -1, 2])
    # The step advanced exactly once (by the take): local_step 1 is accepted, 0 is stale.
    apply(runner, acc, [0], [[9.0, 9.0]], local_step=0)
    apply(runner, acc, [0], [[3.0, 4.0]], local_step=1)
    assert_take(take(runner, acc), [0], [[3.0, 4.0]], [shape[0] if shape else -1, 2])


def test_stale_valid_gradient_is_dropped_silently(runner):
    acc = runner.make(tf.float32)
    runner.run(lambda: acc.set_global_step(5))
    apply(runner, acc, [0], [[1.0]], local_step=4)
    assert count(runner, acc) == 0


@pytest.mark.parametrize("num_required", [0, -3])
def test_num_required_must_be_positive(runner, num_required):
    acc = runner.make(tf.float32)
    apply(runner, acc, [0], [[2.0]])
    with pytest.raises(IA, match=f"Argument num_required must be positive, but was {num_required}"):
        runner.run(lambda: acc.take_grad(num_required))
    assert count(runner, acc) == 1
    assert_take(take(runner, acc), [0], [[2.0]], [-1, 1])


# --- dtypes, runtime inputs, timeouts ----------------------------------------------------------------------


@pytest.mark.parametrize("values", [tf.constant([[1, 2]]), tf.constant([[1.0, 2.0]], tf.float64)])
def test_values_tensor_of_other_dtype_is_value_error(values):
    acc = SparseConditionalAccumulator(tf.float32)
    with pytest.raises(ValueError, match="grad_values has dtype"):
        acc.apply_grad([0], values)
    assert int(acc.num_accumulated()) == 0


def test_indices_of_float_dtype_is_value_error():
    acc = SparseConditionalAccumulator(tf.float32)
    with pytest.raises(ValueError, match="grad_indices"):
        acc.apply_grad(tf.constant([0.0]), [[1.0]])


def test_raw_apply_with_mismatched_dtype_is_invalid_argument():
    ops = _loader.load_ops()
    acc = SparseConditionalAccumulator(tf.float32)
    acc.apply_grad([0], [[1.0]])
    with pytest.raises(IA, match="holds float but gradient_values is double"):
        ops.tf_embed_sparse_accumulator_apply_gradient(
            acc.handle,
            tf.constant(0, tf.int64),
            tf.constant([0], tf.int64),
            tf.constant([[5.0]], tf.float64),
            tf.constant([], tf.int64),
            has_known_shape=False,
        )
    assert int(acc.num_accumulated()) == 1
    assert_take(tuple(t.numpy() for t in acc.take_grad(1)), [0], [[1.0]], [-1, 1])


def test_raw_take_with_mismatched_dtype_is_invalid_argument():
    ops = _loader.load_ops()
    acc = SparseConditionalAccumulator(tf.float32)
    acc.apply_grad([0], [[1.0]])
    with pytest.raises(IA, match="holds float but the dtype attr is half"):
        ops.tf_embed_sparse_accumulator_take_gradient(acc.handle, 1, -1.0, dtype=tf.float16)
    assert int(acc.num_accumulated()) == 1
    assert_take(tuple(t.numpy() for t in acc.take_grad(1)), [0], [[1.0]], [-1, 1])


@pytest.mark.parametrize("bad", [[1], [1, 2]])
def test_non_scalar_runtime_inputs_fail_without_side_effect(bad):
    """Fed at run time through placeholders (static shapes unknown), as TensorFlow's crash cases are."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        acc = SparseConditionalAccumulator(tf.float32)
        step = tf.compat.v1.placeholder(tf.int64)
        num = tf.compat.v1.placeholder(tf.int32)
        apply_op = acc.apply_grad([0], [[1.0]], local_step=step)
        take_op = acc.take_grad(num, timeout=5.0)
        set_op = acc.set_global_step(step)
        size = acc.num_accumulated()
        sess.run(apply_op, {step: 0})
        with pytest.raises(IA, match="local_step must be scalar"):
            sess.run(apply_op, {step: bad})
        with pytest.raises(IA, match="num_required must be scalar"):
            sess.run(take_op, {num: bad})
        with pytest.raises(IA, match="new_global_step must be scalar"):
            sess.run(set_op, {step: bad})
        assert sess.run(size) == 1
        assert_take(sess.run(take_op, {num: 1}), [0], [[1.0]], [-1, 1])
        sess.run(apply_op, {step: 1})  # the step is exactly 1: the bad set_global_step changed nothing
        assert sess.run(size) == 1


def test_static_non_scalar_step_is_value_error():
    with tf.Graph().as_default():
        acc = SparseConditionalAccumulator(tf.float32)
        with pytest.raises(ValueError, match="rank 0"):
            acc.apply_grad([0], [[1.0]], local_step=[1, 2])
        with pytest.raises(ValueError, match="rank 0"):
            acc.take_grad([1, 2])


@pytest.mark.parametrize("timeout", [-1.0, float("nan")])
def test_bad_timeout_is_value_error(timeout):
    acc = SparseConditionalAccumulator(tf.float32)
    with pytest.raises(ValueError, match="timeout"):
        acc.take_grad(1, timeout=timeout)
