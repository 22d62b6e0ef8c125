"""Semantics of tf_embed_ops.SparseConditionalAccumulator (docs/sparse_accumulator.md), eagerly, in tf.function
and in a TF1 graph/session.  Expected values are worked by hand from those semantics or come from the numpy reference in
sparse_accumulator_support.py, never from the kernels."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from sparse_accumulator_support import (
    IA,
    ReferenceAccumulator,
    apply,
    assert_take,
    count,
    runner_fixture,  # noqa: F401 (the `runner` fixture)
    take,
)

from tf_embed_ops.sparse_accumulator import SparseConditionalAccumulator

# --- construction ------------------------------------------------------------------------------------------


def test_graph_constructor_attrs():
    with tf.Graph().as_default():
        acc = SparseConditionalAccumulator(tf.float32, name="Q")
        assert acc.accumulator_handle.dtype == tf.resource
        attrs = acc.accumulator_handle.op.node_def.attr
        assert attrs["dtype"].type == tf.float32.as_datatype_enum
        assert attrs["shape"].shape.unknown_rank
        assert attrs["container"].s == b"" and attrs["shared_name"].s == b""
        assert attrs["reduction_type"].s == b"MEAN"
        assert acc.name == "Q"
        shaped = SparseConditionalAccumulator(tf.float32, shape=[1, 5, 2, 8], name="Q")
        assert [d.size for d in shaped.accumulator_handle.op.node_def.attr["shape"].shape.dim] == [1, 5, 2, 8]
        assert shaped.name == "Q_1"


@pytest.mark.parametrize("reduction_type", ["Invalid", "sum", "mean", ""])
def test_invalid_reduction_type_is_value_error(reduction_type):
    with pytest.raises(ValueError, match="reduction_type"):
        SparseConditionalAccumulator(tf.float32, reduction_type=reduction_type)


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64, tf.complex64, tf.string])
def test_unsupported_dtype_is_value_error(dtype):
    with pytest.raises(ValueError, match="dtype"):
        SparseConditionalAccumulator(dtype)


def test_new_accumulator_is_empty_and_set_global_step_runs(runner):
    acc = runner.make(tf.float32)
    assert count(runner, acc) == 0
    runner.run(lambda: acc.set_global_step(1))
    assert count(runner, acc) == 0


def test_apply_indexed_slices_without_dense_shape(runner):
    acc = runner.make(tf.float32)
    runner.run(lambda: acc.apply_indexed_slices_grad(tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([0]))))
    assert count(runner, acc) == 1


def test_graph_num_accumulated_default_name():
    with tf.Graph().as_default():
        acc = SparseConditionalAccumulator(tf.float32, name="Q")
        assert acc.num_accumulated().op.name == "Q_NumAccumulated"


# --- dtypes ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_dtypes_mean_of_two(runner, dtype):
    acc = runner.make(dtype, shape=[3, 3])
    apply(runner, acc, [1], [[0.0, 1.0, 0.0]], grad_shape=[3, 3])
    apply(runner, acc, [1], [[0.0, 2.0, 0.0]], grad_shape=[3, 3])
    indices, values, shape = take(runner, acc)
    assert values.dtype == dtype.as_numpy_dtype
    assert_take((indices, values.astype(np.float64), shape), [1], [[0.0, 1.5, 0.0]], [3, 3])


def test_float16_mean_rounds_like_tensorflow(runner):
    acc = runner.make(tf.float16)
    for v in (1.0, 2.0, 4.0):
        apply(runner, acc, [0], [[v]])
    _, values, _ = take(runner, acc)
    # 7/3 in half precision: the count is converted to half, then the half division rounds.
    assert values[0, 0] == np.float16(7) / np.float16(3)
    assert abs(float(values[0, 0]) - 2.334) < 1e-3


def test_multiple_accumulators_with_one_name_are_independent(runner):
    accs = [runner.make(dt, name="Q") for dt in (tf.float16, tf.float16, tf.float32, tf.float32)]
    for i, acc in enumerate(accs):
        apply(runner, acc, [0], [[float(i + 1)]])
    for i, acc in enumerate(accs):
        assert count(runner, acc) == 1
        assert_take(take(runner, acc), [0], [[i + 1]], [-1, 1])


# --- aggregation (MEAN is per row) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reduction_type,expected",
    [
        ("MEAN", [[0.5, 0.5], [0, 2], [3, 0]]),
        ("SUM", [[1, 1], [0, 2], [3, 0]]),
    ],
)
def test_take_grad_mean_and_sum(runner, reduction_type, expected):
    acc = runner.make(tf.float32, shape=(), reduction_type=reduction_type)
    apply(runner, acc, [0, 1], [[1.0, 0.0], [0.0, 2.0]], grad_shape=[3, 2])
    apply(runner, acc, [0, 2], [[0.0, 1.0], [3.0, 0.0]], grad_shape=[3, 2])
    assert count(runner, acc) == 2
    assert_take(take(runner, acc), [0, 1, 2], expected, [-1, 2])
    assert count(runner, acc) == 0


def test_repeated_take(runner):
    acc = runner.make(tf.float32, shape=())
    apply(runner, acc, [0, 1], [[1.0, 0.0], [0.0, 2.0]], local_step=0)
    apply(runner, acc, [0, 2], [[0.0, 1.0], [3.0, 0.0]], local_step=0)
    take(runner, acc)
    apply(runner, acc, [0, 1], [[10.0, 0.0], [0.0, 20.0]], local_step=1)
    apply(runner, acc, [0, 2], [[0.0, 10.0], [30.0, 0.0]], local_step=1)
    assert_take(take(runner, acc), [0, 1, 2], [[5, 5], [0, 20], [30, 0]], [-1, 2])


def test_per_row_mean_counts(runner):
    acc = runner.make(tf.float32)
    apply(runner, acc, [0, 3], [[1.0], [3.0]])
    apply(runner, acc, [1, 3], [[5.0], [5.0]])
    apply(runner, acc, [3], [[7.0]])
    assert_take(take(runner, acc), [0, 1, 3], [[1], [5], [5]], [-1, 1])


@pytest.mark.parametrize("mean", [True, False])
def test_random_mix_matches_reference(runner, mean):
    rng = np.random.default_rng(7)
    acc = runner.make(tf.float64, shape=[20, 3], reduction_type="MEAN" if mean else "SUM")
    ref = ReferenceAccumulator(mean=mean, dim0=20)
    for step in range(2):
        for _ in range(7):
            nnz = int(rng.integers(0, 12))
            indices = rng.integers(0, 20, size=nnz)  # unsorted, with duplicates
            values = rng.normal(size=(nnz, 3))
            apply(runner, acc, indices, values, grad_shape=[20, 3], local_step=step)
            ref.apply(indices, values, local_step=step)
        got = take(runner, acc)
        want = ref.take()
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
        np.testing.assert_array_equal(got[2], want[2])


@pytest.mark.parametrize("mean", [True, False])
def test_large_gradients_match_reference_bitwise(mean):
    # Big enough for the row arithmetic to be split over the intra-op threads, over several rounds of one
    # accumulator (its row memory is reused; the row width changes in the last round): the sums must be
    # bitwise those of a float32 reference adding each row's contributions in gradient order.
    rng = np.random.default_rng(11)
    acc = SparseConditionalAccumulator(tf.float32, reduction_type="MEAN" if mean else "SUM")
    ref = ReferenceAccumulator(mean=mean, dtype=np.float32)
    for step, width in enumerate((64, 64, 8)):
        gradients = [np.sort(rng.choice(20_000, size=12_000, replace=False)) for _ in range(4)]
        gradients.append(rng.integers(0, 20_000, size=6_000))  # unsorted, with duplicates
        gradients.append(np.arange(30_000 + step, 30_000 + step + 9_000))  # all beyond the held rows
        for indices in gradients:
            values = rng.standard_normal((indices.size, width), dtype=np.float32)
            acc.apply_grad(tf.constant(indices, tf.int64), tf.constant(values), local_step=step)
            ref.apply(indices, values, local_step=step)
        got = acc.take_grad(len(gradients))
        want = ref.take()
        np.testing.assert_array_equal(got.indices.numpy(), want[0])
        assert got.values.numpy().tobytes() == want[1].tobytes()


def test_take_returns_all_held_gradients(runner):
    acc = runner.make(tf.float32)
    for v in (1.0, 2.0, 6.0):
        apply(runner, acc, [0], [[v]])
    assert_take(take(runner, acc, 1), [0], [[3.0]], [-1, 1])
    assert count(runner, acc) == 0


def test_sum_never_divides_and_take_increments_step(runner):
    acc = runner.make(tf.float32, reduction_type="SUM")
    apply(runner, acc, [0], [[2.0]])
    apply(runner, acc, [0], [[4.0]])
    assert_take(take(runner, acc), [0], [[6.0]], [-1, 1])
    apply(runner, acc, [0], [[1.0]], local_step=0)  # stale now: the take advanced the step to 1
    assert count(runner, acc) == 0


def test_stale_rule(runner):
    acc = runner.make(tf.float32)
    apply(runner, acc, [0], [[1.0]], local_step=0)
    take(runner, acc)  # step 1
    apply(runner, acc, [0], [[100.0]], local_step=0)
    assert count(runner, acc) == 0
    apply(runner, acc, [0], [[1.0]], local_step=1)
    apply(runner, acc, [0], [[3.0]], local_step=7)
    assert count(runner, acc) == 2
    assert_take(take(runner, acc), [0], [[2.0]], [-1, 1])  # step 2
    apply(runner, acc, [0], [[100.0]], local_step=1)
    assert count(runner, acc) == 0
    apply(runner, acc, [0], [[5.0]], local_step=2)
    assert_take(take(runner, acc), [0], [[5.0]], [-1, 1])


def test_returned_values_are_not_mutated_by_later_applies(runner):
    acc = runner.make(tf.float32, reduction_type="SUM")
    apply(runner, acc, [0], [[1.0]])
    first = take(runner, acc)
    apply(runner, acc, [0], [[50.0]], local_step=1)
    assert_take(first, [0], [[1.0]], [-1, 1])


def test_nan_and_inf_propagate(runner):
    acc = runner.make(tf.float32)
    apply(runner, acc, [0, 1], [[np.nan], [np.inf]])
    apply(runner, acc, [1], [[1.0]])
    _, values, _ = take(runner, acc)
    assert np.isnan(values[0, 0]) and values[1, 0] == np.inf


# --- canonical mode (ours differs from TensorFlow here: docs/sparse_accumulator.md) -------------------------


def test_canonical_unsorted_single_gradient_is_sorted(runner):
    acc = runner.make(tf.float32, reduction_type="SUM")
    apply(runner, acc, [2, 0], [[20.0], [0.5]])
    assert_take(take(runner, acc), [0, 2], [[0.5], [20.0]], [-1, 1])


@pytest.mark.parametrize("reduction_type,expected", [("SUM", [[1.5], [22.0]]), ("MEAN", [[0.75], [11.0]])])
def test_canonical_merge_of_unsorted_gradients(runner, reduction_type, expected):
    acc = runner.make(tf.float32, reduction_type=reduction_type)
    apply(runner, acc, [2, 0], [[20.0], [0.5]])
    apply(runner, acc, [0, 2], [[1.0], [2.0]])
    assert_take(take(runner, acc), [0, 2], expected, [-1, 1])


def test_canonical_duplicates_count_once_per_gradient(runner):
    acc = runner.make(tf.float32)
    apply(runner, acc, [1, 1], [[2.0], [4.0]])
    apply(runner, acc, [1], [[10.0]])
    # (2 + 4) + 10 over 2 gradients; TensorFlow's merge gives rows [6, 4] here.
    assert_take(take(runner, acc), [1], [[8.0]], [-1, 1])


def test_canonical_duplicates_in_first_gradient_only(runner):
    acc = runner.make(tf.float32)
    apply(runner, acc, [3, 1, 3, 3], [[1.0], [2.0], [3.0], [4.0]])
    assert_take(take(runner, acc), [1, 3], [[2.0], [8.0]], [-1, 1])


# --- shapes (the accumulator shape is a minimum rank) -------------------------------------------------------


@pytest.mark.parametrize(
    "shape,values_shape,expected_dense",
    [
        ([5], (1, 3), [5, 3]),
        ([5, 2], (1, 2, 4), [5, 2, 4]),
        ([2, None], (1, 2, 2, 2), [2, 2, 2, 2]),
        ([None, 2], (1, 2, 2, 3), [-1, 2, 2, 3]),
        ((), (1, 4), [-1, 4]),
        (None, (1, 4), [-1, 4]),
    ],
)
def test_shape_is_a_minimum_rank_and_output_shape_rule(runner, shape, values_shape, expected_dense):
    acc = runner.make(tf.float32, shape=shape)
    values = np.ones(values_shape, np.float32)
    apply(runner, acc, [1], values)
    assert_take(take(runner, acc), [1], values, expected_dense)


def test_output_shape_ignores_grad_shape(runner):
    acc = runner.make(tf.float32, shape=[None, 2])
    apply(runner, acc, [0], [[1.0, 1.0]], grad_shape=[3, 2])
    apply(runner, acc, [10], [[1.0, 1.0]], grad_shape=[7, 2, 9])  # index 10 beyond grad_shape: never compared
    assert_take(take(runner, acc), [0, 10], [[1, 1], [1, 1]], [-1, 2])


def test_grad_shape_longer_than_rank_and_values_mismatch_accepted(runner):
    acc = runner.make(tf.float32, shape=[5, 2])
    apply(runner, acc, [0], [[1.0, 2.0]], grad_shape=[5, 2, 7])
    apply(runner, acc, [1], [[1.0, 2.0]], grad_shape=[5, 2])
    assert count(runner, acc) == 2


@pytest.mark.parametrize("shape,index", [([3, 2], 2), ([None, 2], 1000), ((), 10**12), (None, 10**12)])
def test_index_within_range_accepted(runner, shape, index):
    acc = runner.make(tf.float32, shape=shape)
    apply(runner, acc, [index], [[1.0, 2.0]])
    assert_take(take(runner, acc), [index], [[1.0, 2.0]], [shape[0] if shape and shape[0] else -1, 2])


def test_rank1_values(runner):
    acc = runner.make(tf.float32)
    apply(runner, acc, [0, 1], [2.0, 4.0])
    apply(runner, acc, [1], [8.0])
    assert_take(take(runner, acc), [0, 1], [2.0, 6.0], [-1])


def test_zero_width_rows(runner):
    acc = runner.make(tf.float32)
    apply(runner, acc, [0, 4], np.zeros((2, 0), np.float32))
    apply(runner, acc, [4], np.zeros((1, 0), np.float32))
    indices, values, shape = take(runner, acc)
    np.testing.assert_array_equal(indices, [0, 4])
    assert values.shape == (2, 0)
    np.testing.assert_array_equal(shape, [-1, 0])


def test_empty_gradient_counts(runner):
    acc = runner.make(tf.float32, shape=[None, 2])
    apply(runner, acc, np.zeros([0], np.int64), np.zeros((0, 2), np.float32))
    assert count(runner, acc) == 1
    indices, values, shape = take(runner, acc)
    assert indices.shape == (0,) and values.shape == (0, 2)
    np.testing.assert_array_equal(shape, [-1, 2])
    apply(runner, acc, np.zeros([0], np.int64), np.zeros((0, 2), np.float32), local_step=1)
    apply(runner, acc, [1], [[4.0, 6.0]], local_step=1)
    assert count(runner, acc) == 2
    # The empty gradient counts for num_accumulated, not for row 1's count: undivided.
    assert_take(take(runner, acc), [1], [[4.0, 6.0]], [-1, 2])


def test_empty_shape_apply(runner):
    acc = runner.make(tf.float32, shape=[])
    for grad_shape in (None, []):
        with pytest.raises(IA, match="Input indices should be vector"):
            apply(runner, acc, 0, [1.0], grad_shape=grad_shape)
        with pytest.raises(IA, match="Values cannot be 0-dimensional"):
            apply(runner, acc, [0], 1.0, grad_shape=grad_shape)
        apply(runner, acc, [0], [1.0], grad_shape=grad_shape)
    assert count(runner, acc) == 2


def test_validate_shape_sequence(runner):
    """TensorFlow's testValidateShape, plus: every rejection leaves the count and the held rows unchanged."""
    acc = runner.make(tf.float32, shape=[2, 2, None])
    ones = lambda *s: np.ones(s, np.float32)
    rejected = [
        (dict(indices=[0], values=ones(1, 2, 1), grad_shape=[2, 2]), "expected shape rank at least 3, got 2"),
        (dict(indices=[0], values=ones(1, 2, 1), grad_shape=[2, 3, 1]), "expected shape dim 1 to be 2, got 3"),
        (dict(indices=[3], values=ones(1, 2, 1), grad_shape=[2, 2, 1]), "index of slice 0 exceeded limits of shape"),
        (dict(indices=[0], values=ones(1, 2), grad_shape=[2, 2, 1]), "expected values rank at least 3, got 2"),
        (dict(indices=[0], values=ones(1, 3, 1), grad_shape=[2, 2, 1]), "expected values dim 1 to be 2, got 3"),
    ]
    for kwargs, message in rejected:
        with pytest.raises(IA, match=message):
            apply(runner, acc, **kwargs)
        assert count(runner, acc) == 0
    apply(runner, acc, [0], ones(1, 2, 2, 2), grad_shape=[2, 2, 2])
    with pytest.raises(IA, match="expected values rank 4, got 3"):
        apply(runner, acc, [0], ones(1, 2, 2), grad_shape=[2, 2, 2])
    with pytest.raises(IA, match="expected values dim 3 to be 2, got 3"):
        apply(runner, acc, [0], ones(1, 2, 2, 3), grad_shape=[2, 2, 2])
    assert count(runner, acc) == 1
    assert_take(take(runner, acc), [0], ones(1, 2, 2, 2), [2, 2, 2, 2])
    apply(runner, acc, [1], ones(1, 2, 2, 3), grad_shape=[2, 2, 2], local_step=1)  # constraints reset by the take
    with pytest.raises(IA, match="expected values dim 3 to be 3, got 2"):
        apply(runner, acc, [1], ones(1, 2, 2, 2), grad_shape=[2, 2, 2], local_step=1)
    assert_take(take(runner, acc), [1], ones(1, 2, 2, 3), [2, 2, 2, 3])


# --- set_global_step ---------------------------------------------------------------------------------------


def test_set_global_step_raise_lower_negative_and_keeps_held(runner):
    acc = runner.make(tf.float32, reduction_type="SUM")
    apply(runner, acc, [0], [[1.0]], local_step=0)
    runner.run(lambda: acc.set_global_step(10))
    assert count(runner, acc) == 1  # held gradients stay
    apply(runner, acc, [0], [[100.0]], local_step=9)
    apply(runner, acc, [0], [[2.0]], local_step=10)
    runner.run(lambda: acc.set_global_step(-4))  # lowering takes effect (with a warning)
    apply(runner, acc, [0], [[4.0]], local_step=-4)
    assert_take(take(runner, acc), [0], [[7.0]], [-1, 1])
    apply(runner, acc, [0], [[100.0]], local_step=-4)  # step is -3 after the take
    assert count(runner, acc) == 0
    runner.run(lambda: acc.set_global_step(7.9))  # cast like TensorFlow: 7
    apply(runner, acc, [0], [[8.0]], local_step=7)
    assert count(runner, acc) == 1


# --- Python conversion and robustness ----------------------------------------------------------------------


def test_python_lists_and_ints_convert_to_dtype(runner):
    acc = runner.make(tf.float64)
    apply(runner, acc, [0, 2], [[1, 2], [3, 4]], grad_shape=[3, 2])
    apply(runner, acc, np.array([2], np.int32), np.array([[1.0, 1.0]], np.float32))
    assert_take(take(runner, acc), [0, 2], [[1, 2], [2, 2.5]], [-1, 2])
