"""Semantics of tf_embed_ops.SparseConditionalAccumulator (docs/sparse_accumulator.md), eagerly, in tf.function
and in a TF1 graph/session.  Expected values are worked by hand from those semantics or come from the numpy reference in
sparse_accumulator_support.py, never from the kernels."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import tensorflow as tf
from sparse_accumulator_support import RUNNERS, ReferenceAccumulator

from tf_embed_ops import _loader
from tf_embed_ops.sparse_accumulator import SparseConditionalAccumulator

IA = tf.errors.InvalidArgumentError


@pytest.fixture(params=sorted(RUNNERS))
def runner(request):
    r = RUNNERS[request.param]()
    yield r
    r.close()


def count(runner, acc) -> int:
    return int(runner.run(lambda: acc.num_accumulated()))


def take(runner, acc, n=1):
    return runner.run(lambda: tuple(acc.take_grad(n, timeout=30.0)))


def apply(runner, acc, indices, values, grad_shape=None, local_step=0):
    return runner.run(lambda: acc.apply_grad(indices, values, grad_shape=grad_shape, local_step=local_step))


def assert_take(result, indices, values, shape):
    got_indices, got_values, got_shape = result
    np.testing.assert_array_equal(got_indices, np.asarray(indices, np.int64))
    np.testing.assert_allclose(got_values, np.asarray(values, got_values.dtype), rtol=1e-6)
    np.testing.assert_array_equal(got_shape, np.asarray(shape, np.int64))


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
