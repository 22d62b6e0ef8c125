"""Randomized parity with TensorFlow's own SparseConditionalAccumulator (graph mode) on the well-defined
contract: sorted unique indices (docs/sparse_accumulator.md).  Same gradients, steps and takes go to both; results
must be equal bit for bit (both add the held row and the incoming row, then divide by the per-row count)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_embed_ops.sparse_accumulator import SparseConditionalAccumulator


def _script(seed: int, num_rows: int, width: int, rounds: int):
    """A random sequence of events: ("apply", indices, values_scale, local_step) / ("set", step) / ("take", n)."""
    rng = np.random.default_rng(seed)
    events, step = [], 0
    for _ in range(rounds):
        applied = 0
        for _ in range(int(rng.integers(1, 6))):
            nnz = int(rng.integers(0, num_rows + 1))
            indices = np.sort(rng.choice(num_rows, size=nnz, replace=False)).astype(np.int64)
            values = rng.normal(size=(nnz, width)) * 4.0
            local_step = step + int(rng.integers(-1, 2))  # some stale gradients
            events.append(("apply", indices, values, local_step))
            applied += local_step >= step
        if rng.random() < 0.2:
            step = step + int(rng.integers(-1, 3))
            events.append(("set", step))
        if applied:
            events.append(("take", int(rng.integers(1, applied + 1))))
            step += 1
    return events


@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.float64])
@pytest.mark.parametrize("reduction_type", ["MEAN", "SUM"])
@pytest.mark.parametrize("shape,width", [((), 3), ([16, 3], 3), ([None, 2], 2), (None, 1)])
@pytest.mark.parametrize("seed", [0, 1])
def test_parity_with_tensorflow(dtype, reduction_type, shape, width, seed):
    num_rows = 16
    events = _script(seed, num_rows, width, rounds=4)
    np_dtype = dtype.as_numpy_dtype
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        theirs = tf.compat.v1.SparseConditionalAccumulator(dtype, shape=shape, reduction_type=reduction_type)
        ours = SparseConditionalAccumulator(dtype, shape=shape, reduction_type=reduction_type)
        idx = tf.compat.v1.placeholder(tf.int64, [None])
        vals = tf.compat.v1.placeholder(dtype, [None, width])
        step = tf.compat.v1.placeholder(tf.int64, [])
        num = tf.compat.v1.placeholder(tf.int32, [])
        grad_shape = [num_rows, width]
        both = {
            "apply": [acc.apply_grad(idx, vals, grad_shape=grad_shape, local_step=step) for acc in (theirs, ours)],
            "set": [acc.set_global_step(step) for acc in (theirs, ours)],
            "take": [theirs.take_grad(num), ours.take_grad(num, timeout=30.0)],
            "count": [acc.num_accumulated() for acc in (theirs, ours)],
        }
        for event in events:
            if event[0] == "apply":
                sess.run(both["apply"], {idx: event[1], vals: event[2].astype(np_dtype), step: event[3]})
            elif event[0] == "set":
                sess.run(both["set"], {step: event[1]})
            else:
                count_theirs, count_ours = sess.run(both["count"])
                assert count_theirs == count_ours
                (ti, tv, ts), (oi, ov, os_) = sess.run(both["take"], {num: event[1]})
                np.testing.assert_array_equal(oi, ti)
                np.testing.assert_array_equal(ov, tv)
                np.testing.assert_array_equal(os_, ts)
                assert ov.dtype == tv.dtype


def _run_tf_and_ours(shape, kwargs, prior=None):
    """Applies `prior` then `kwargs` to both accumulators; returns the two outcomes (error message or None)."""
    outcomes = []
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        for cls in (tf.compat.v1.SparseConditionalAccumulator, SparseConditionalAccumulator):
            acc = cls(tf.float32, shape=shape)
            if prior is not None:
                sess.run(acc.apply_grad(**prior))
            try:
                sess.run(acc.apply_grad(**kwargs))
                outcomes.append(None)
            except tf.errors.InvalidArgumentError as e:
                outcomes.append(_kernel_message(e.message))
    return outcomes


def _kernel_message(message: str) -> str:
    # Graph execution errors wrap the kernel's message: it is the line just before the "[[{{node ...}}]]" line.
    lines = message.split("\n")
    node_line = next(i for i, line in enumerate(lines) if line.strip().startswith("[[{{node"))
    return lines[node_line - 1].strip()


@pytest.mark.parametrize(
    "shape,prior,kwargs",
    [
        ([2, 2, None], None, dict(grad_indices=[0], grad_values=np.ones((1, 2, 1), np.float32), grad_shape=[2, 2])),
        ([2, 2, None], None, dict(grad_indices=[0], grad_values=np.ones((1, 2, 1), np.float32), grad_shape=[2, 3, 1])),
        ([2, 2, None], None, dict(grad_indices=[3], grad_values=np.ones((1, 2, 1), np.float32), grad_shape=[2, 2, 1])),
        ([2, 2, None], None, dict(grad_indices=[0], grad_values=np.ones((1, 2), np.float32))),
        ([2, 2, None], None, dict(grad_indices=[0], grad_values=np.ones((1, 3, 1), np.float32))),
        ([None, 2], dict(grad_indices=[0], grad_values=[[1.0, 1.0]]), dict(grad_indices=[1], grad_values=[1.0])),
        (
            [None, 2],
            dict(grad_indices=[0], grad_values=np.ones((1, 2, 2), np.float32)),
            dict(grad_indices=[1], grad_values=np.ones((1, 2, 3), np.float32)),
        ),
        ([3, 2], None, dict(grad_indices=[0, 1], grad_values=[[1.0, 1.0]])),
        ([3, 2], None, dict(grad_indices=[[0]], grad_values=[[1.0, 1.0]])),
        ([3, 2], None, dict(grad_indices=[0], grad_values=1.0)),
        ([3, 2], None, dict(grad_indices=[5], grad_values=[[1.0]], grad_shape=[4, 2])),
    ],
)
def test_same_errors_as_tensorflow(shape, prior, kwargs):
    theirs, ours = _run_tf_and_ours(shape, kwargs, prior)
    assert theirs is not None and ours == theirs


def test_longer_grad_shape_accepted_like_tensorflow():
    kwargs = dict(grad_indices=[0, 2], grad_values=[[1.0, 1.0]] * 2, grad_shape=[3, 2, 5])
    assert _run_tf_and_ours([3, 2], kwargs) == [None, None]


def test_accumulator_ref_is_the_resource_handle_like_tensorflows_property():
    """Drop-in code reads `accumulator_ref` (TensorFlow's public property, a ref-typed handle there): ours is the
    resource handle the ops take, usable directly with the raw op."""
    from tf_embed_ops import _loader

    with tf.Graph().as_default():  # TensorFlow's class is graph-only; its property is the handle tensor
        theirs = tf.compat.v1.SparseConditionalAccumulator(tf.float32, shape=[4, 2])
        assert isinstance(theirs.accumulator_ref, tf.Tensor)
    ours = SparseConditionalAccumulator(tf.float32, shape=[4, 2])
    assert ours.accumulator_ref is ours.accumulator_handle
    assert ours.accumulator_ref.dtype == tf.resource and ours.accumulator_ref.shape.rank == 0
    ours.apply_grad([1, 3], [[1.0, 2.0], [3.0, 4.0]], local_step=0)
    assert int(_loader.load_ops().tf_embed_sparse_accumulator_num_accumulated(ours.accumulator_ref)) == 1

    with tf.Graph().as_default():
        graph_acc = SparseConditionalAccumulator(tf.float32, shape=[4, 2], name="acc")
        assert graph_acc.accumulator_ref.dtype == tf.resource
        assert graph_acc.accumulator_ref.op.name == graph_acc.accumulator_handle.op.name
