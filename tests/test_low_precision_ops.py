"""16-bit tables and slots through the ops (docs/low_precision.md): fp32 math then rounding, against numpy.

The references are independent of the C++: the optimizer step is tests/numpy_reference.py (or float32 numpy
arithmetic for SGD, which is then bit-exact), round-to-nearest-even is ml_dtypes' / numpy's cast, and stochastic
rounding is checked by what it must satisfy (one of the two neighbours; unbiased mean) rather than by its bits.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from tests.embedding_test_util import initial_slots, make_config
from tf_embed_ops import embedding_ops as eo

NP_DTYPES = {tf.bfloat16: ml_dtypes.bfloat16, tf.float16: np.float16}
# Spacing of 16-bit values in [1, 2): 2^-7 for bfloat16, 2^-10 for float16.
UNIT = {tf.bfloat16: 2.0**-7, tf.float16: 2.0**-10}


def _round_nearest(x: np.ndarray, dtype: tf.DType) -> np.ndarray:
    return np.asarray(x, np.float32).astype(NP_DTYPES[dtype]).astype(np.float32)


def _neighbours(x: np.ndarray, dtype: tf.DType) -> tuple[np.ndarray, np.ndarray]:
    """The 16-bit values just below and just above each fp32 x (equal when x is representable)."""
    x = np.asarray(x, np.float32)
    n = NP_DTYPES[dtype]
    near = x.astype(n)
    up = np.where(near.astype(np.float32) < x, np.nextafter(near, n(np.inf)), near)
    down = np.where(near.astype(np.float32) > x, np.nextafter(near, n(-np.inf)), near)
    return down.astype(np.float32), up.astype(np.float32)


def _step(config, table, slots, ids, grads, rounding, step=0):
    feats = [eo.normalize_feature(tf.constant(ids, tf.int64))]
    eo.send_tpu_embedding_gradients(
        [tf.constant(grads, tf.float32)], [], feats, [table], [slots], config, rounding=[rounding], rounding_step=step
    )


def _f32(v):
    return tf.cast(v, tf.float32).numpy()


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_sgd_nearest_equals_float32_numpy_then_round_to_nearest_even(dtype):
    rng = np.random.default_rng(1)
    vocab, dim = 64, 24
    config = make_config(
        [{"name": "t", "vocab": vocab, "dim": dim, "opt": {"name": "sgd"}, "lr": 0.37}], [("f", 0, [40])]
    )
    start = _round_nearest(rng.normal(size=(vocab, dim)), dtype)
    table = tf.Variable(tf.constant(start, dtype))
    ids = rng.integers(0, vocab, 40)
    grads = rng.normal(size=(40, dim)).astype(np.float32)
    _step(config, table, [], ids, grads, "nearest")
    # The kernel sums a row's gradients in input order in float32, then w - lr * g: the same float32 operations.
    expected = start.copy()
    for r in np.unique(ids):
        g = np.float32(0)
        g = np.zeros(dim, np.float32)
        for i in np.flatnonzero(ids == r):
            g = g + grads[i]
        expected[r] = _round_nearest(start[r] - np.float32(0.37) * g, dtype)
    np.testing.assert_array_equal(_f32(table), expected)
    assert table.dtype == dtype


OPTIMIZERS = [
    {"name": "adagrad"},
    {"name": "adam"},
    {"name": "ftrl", "l1": 0.01, "l2": 0.001},
    {"name": "adagrad_momentum", "momentum": 0.9},
    {"name": "sgd", "weight_decay": 0.01, "gradient_clip": (-0.5, 0.5), "weight_clip": (-1.5, 1.5)},
]


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: o["name"] + ("_pipeline" if len(o) > 3 else ""))
@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("slot_dtype", ["same", tf.float32])
def test_optimizers_are_fp32_math_then_rounding(opt, dtype, rounding, slot_dtype):
    rng = np.random.default_rng(2)
    vocab, dim, n = 50, 16, 60
    slot_dtype = dtype if slot_dtype == "same" else slot_dtype
    config = make_config([{"name": "t", "vocab": vocab, "dim": dim, "opt": opt, "lr": 0.05}], [("f", 0, [n])])
    start = _round_nearest(rng.normal(size=(vocab, dim)), dtype)
    start_slots = [
        s if slot_dtype == tf.float32 else _round_nearest(s, slot_dtype) for s in initial_slots(opt, vocab, dim, rng)
    ]
    table = tf.Variable(tf.constant(start, dtype))
    slots = [tf.Variable(tf.constant(s, slot_dtype)) for s in start_slots]
    ids = rng.integers(0, vocab, n)
    grads = rng.normal(size=(n, dim)).astype(np.float32)
    _step(config, table, slots, ids, grads, rounding, step=5)

    row_grads = {}
    for i, r in enumerate(ids):
        row_grads[int(r)] = row_grads.get(int(r), 0.0) + grads[i].astype(np.float64)
    want_w, want_slots = ref.apply_step(opt, 0.05, start, start_slots, row_grads)
    got = [(_f32(table), want_w, dtype)] + [(_f32(v), w, slot_dtype) for v, w in zip(slots, want_slots, strict=True)]
    for value, want, storage in got:
        if storage == tf.float32:
            np.testing.assert_allclose(value, want, rtol=2e-6, atol=1e-6)
            continue
        # The reference is float64 math of float32 inputs; the kernel's float32 arithmetic may land on the
        # other side of a rounding boundary, so allow the neighbours of the reference's neighbours.
        down, up = _neighbours(want, storage)
        if rounding == "nearest":
            near = _round_nearest(want, storage)
            assert np.mean(value == near) > 0.98
        lo, _ = _neighbours(np.nextafter(down, np.float32(-np.inf)), storage)
        _, hi = _neighbours(np.nextafter(up, np.float32(np.inf)), storage)
        assert np.all((value >= lo) & (value <= hi)), (value, want)
        if rounding == "stochastic":
            assert np.mean((value == down) | (value == up)) > 0.98
    # Untouched rows are unchanged, bit for bit.
    untouched = np.setdiff1d(np.arange(vocab), ids)
    np.testing.assert_array_equal(_f32(table)[untouched], start[untouched])


@pytest.mark.parametrize(
    "dtype, start, delta",
    [
        (tf.bfloat16, 1.0, 0.3 * 2.0**-7),
        (tf.bfloat16, -3.0, -0.77 * 2.0**-6),
        (tf.float16, 1.0, 0.61 * 2.0**-10),
        (tf.float16, 2.0**-20, 0.42 * 2.0**-24),  # float16 subnormals
    ],
)
def test_stochastic_rounding_is_unbiased(dtype, start, delta):
    # vocab x dim copies of the same value get the same update; the mean of their roundings must be the fp32
    # result within 5 standard deviations of a Bernoulli mean.
    vocab, dim = 4096, 64
    config = make_config(
        [{"name": "t", "vocab": vocab, "dim": dim, "opt": {"name": "sgd"}, "lr": 1.0}], [("f", 0, [vocab])]
    )
    table = tf.Variable(tf.fill([vocab, dim], tf.constant(start, dtype)))
    target = np.float32(start) + np.float32(delta)
    down, up = (float(v[0]) for v in _neighbours(np.array([target]), dtype))
    assert down < target < up
    p = (float(target) - down) / (up - down)
    n = vocab * dim
    means = []
    for step in range(3):
        table.assign(tf.fill([vocab, dim], tf.constant(start, dtype)))
        _step(config, table, [], np.arange(vocab), np.full((vocab, dim), -delta, np.float32), "stochastic", step)
        value = _f32(table)
        assert set(np.unique(value)) <= {down, up}
        means.append(value.mean(dtype=np.float64))
        sigma = (up - down) * np.sqrt(p * (1 - p) / n)
        assert abs(means[-1] - float(target)) < 5 * sigma, (means[-1], float(target), sigma)
    # Each step draws other bits: the three results differ (a repeated step would repeat its bits).
    assert len(set(means)) == 3


def test_stochastic_rounding_is_reproducible_and_keyed_by_step_and_seed():
    vocab, dim = 256, 32
    config = make_config(
        [{"name": "t", "vocab": vocab, "dim": dim, "opt": {"name": "sgd"}, "lr": 1.0}], [("f", 0, [vocab])]
    )
    grads = np.full((vocab, dim), -0.5 * 2.0**-7, np.float32)

    def run(step, seed):
        table = tf.Variable(tf.ones([vocab, dim], tf.bfloat16))
        feats = [eo.normalize_feature(tf.constant(np.arange(vocab), tf.int64))]
        eo.send_tpu_embedding_gradients(
            [grads], [], feats, [table], [[]], config, rounding_step=step, rounding_seed=seed
        )
        return _f32(table)

    np.testing.assert_array_equal(run(7, 0), run(7, 0))
    assert not np.array_equal(run(7, 0), run(8, 0))
    assert not np.array_equal(run(7, 0), run(7, 1))


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_activations_are_float32_of_the_stored_rows(dtype, combiner):
    rng = np.random.default_rng(3)
    vocab, dim = 30, 8
    config = make_config([{"name": "t", "vocab": vocab, "dim": dim}], [("f", 0, [5])])
    stored = _round_nearest(rng.normal(size=(vocab, dim)), dtype)
    rows = [[1, 2, 2], [], [29], [0, 5], [7, 7, 7, 7]]
    weights = [[0.5, 1.0, 2.0], [], [3.0], [1.0, -1.0], [1.0, 2.0, 3.0, 4.0]]
    x = tf.RaggedTensor.from_row_lengths(tf.constant([i for r in rows for i in r], tf.int64), [len(r) for r in rows])
    w = tf.RaggedTensor.from_row_lengths(
        tf.constant([v for r in weights for v in r], tf.float32), [len(r) for r in rows]
    )
    feat = eo.normalize_feature(x, w)
    got = eo.embedding_activations([feat], [tf.Variable(tf.constant(stored, dtype))], config, [combiner])[0]
    want = eo.embedding_activations([feat], [tf.Variable(stored)], config, [combiner])[0]
    assert got.dtype == tf.float32
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_mixed_storage_fp32_slots_with_a_16_bit_table_and_the_reverse():
    rng = np.random.default_rng(4)
    vocab, dim = 20, 8
    opt = {"name": "adagrad"}
    config = make_config([{"name": "t", "vocab": vocab, "dim": dim, "opt": opt, "lr": 0.1}], [("f", 0, [10])])
    ids = rng.integers(0, vocab, 10)
    grads = rng.normal(size=(10, dim)).astype(np.float32)
    start = _round_nearest(rng.normal(size=(vocab, dim)), tf.bfloat16)
    acc = _round_nearest(rng.uniform(0.1, 1, (vocab, dim)), tf.bfloat16)
    results = {}
    for table_dtype, slot_dtype in ((tf.float32, tf.float32), (tf.bfloat16, tf.float32), (tf.float32, tf.bfloat16)):
        table = tf.Variable(tf.constant(start, table_dtype))
        slot = tf.Variable(tf.constant(acc, slot_dtype))
        _step(config, table, [slot], ids, grads, "nearest")
        results[(table_dtype, slot_dtype)] = (_f32(table), _f32(slot))
    w32, a32 = results[(tf.float32, tf.float32)]
    np.testing.assert_array_equal(results[(tf.bfloat16, tf.float32)][0], _round_nearest(w32, tf.bfloat16))
    np.testing.assert_array_equal(results[(tf.bfloat16, tf.float32)][1], a32)
    np.testing.assert_array_equal(results[(tf.float32, tf.bfloat16)][0], w32)
    np.testing.assert_array_equal(results[(tf.float32, tf.bfloat16)][1], _round_nearest(a32, tf.bfloat16))


def test_special_values_round_as_ieee_says():
    # +-inf stay inf, NaN stays NaN, overflow past the largest finite float16 goes to inf (nearest).
    config = make_config([{"name": "t", "vocab": 1, "dim": 6, "opt": {"name": "sgd"}, "lr": 1.0}], [("f", 0, [1])])
    for rounding in ("nearest", "stochastic"):
        table = tf.Variable(tf.constant([[np.inf, -np.inf, np.nan, 65504.0, 1.0, 0.0]], tf.float16))
        _step(config, table, [], [0], np.array([[0, 0, 0, -100.0, 0, 0]], np.float32), rounding, step=1)
        got = _f32(table)[0]
        assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])
        assert got[3] == np.inf if rounding == "nearest" else got[3] in (65504.0, np.inf)
        assert got[4] == 1.0 and got[5] == 0.0


def _adagrad_config(vocab=8, dim=4):
    return make_config(
        [{"name": "t", "vocab": vocab, "dim": dim, "opt": {"name": "adagrad"}, "lr": 0.1}], [("f", 0, [3])]
    )


def test_stochastic_16_bit_without_a_step_is_rejected_and_changes_nothing():
    config = _adagrad_config()
    table = tf.Variable(tf.ones([8, 4], tf.bfloat16))
    slot = tf.Variable(tf.fill([8, 4], tf.constant(0.1, tf.bfloat16)))
    feats = [eo.normalize_feature(tf.constant([1, 2, 3], tf.int64))]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"table 't'.*bfloat16.*rounding_step"):
        eo.send_tpu_embedding_gradients([tf.ones([3, 4])], [], feats, [table], [[slot]], config)
    np.testing.assert_array_equal(_f32(table), np.ones([8, 4]))
    np.testing.assert_array_equal(_f32(slot), _f32(tf.fill([8, 4], tf.constant(0.1, tf.bfloat16))))
    # With "nearest" no step is needed.
    eo.send_tpu_embedding_gradients([tf.ones([3, 4])], [], feats, [table], [[slot]], config, rounding=["nearest"])
    assert not np.array_equal(_f32(table), np.ones([8, 4]))


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"rounding": ["up"]}, r"rounding\[0\] \(table 't'\) is \"up\""),
        ({"rounding": ["nearest", "nearest"]}, r"rounding has 2 entries"),
        ({"rounding_step": [1, 2]}, r"rounding_step must be an int64 scalar"),
    ],
)
def test_bad_rounding_arguments_are_rejected_and_change_nothing(kwargs, pattern):
    config = _adagrad_config()
    table = tf.Variable(tf.ones([8, 4], tf.bfloat16))
    slot = tf.Variable(tf.fill([8, 4], tf.constant(0.1, tf.bfloat16)))
    feats = [eo.normalize_feature(tf.constant([1, 2, 3], tf.int64))]
    kwargs = {"rounding_step": 0, **kwargs}
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=pattern):
        eo.send_tpu_embedding_gradients([tf.ones([3, 4])], [], feats, [table], [[slot]], config, **kwargs)
    np.testing.assert_array_equal(_f32(table), np.ones([8, 4]))


@pytest.mark.parametrize("bad, shown", [(tf.float64, "double"), (tf.int32, "int32")])
def test_unsupported_variable_dtypes_are_rejected_naming_the_table_or_slot(bad, shown):
    config = _adagrad_config()
    good = tf.Variable(tf.ones([8, 4], tf.bfloat16))
    wrong = tf.Variable(tf.ones([8, 4], bad))
    feats = [eo.normalize_feature(tf.constant([1, 2, 3], tf.int64))]
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"table 't'.*float32, bfloat16 or float16.*got {shown}"):
        eo.embedding_activations(feats, [wrong], config)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"slot 'accumulators' of table 't'.*got {shown}"):
        eo.send_tpu_embedding_gradients([tf.ones([3, 4])], [], feats, [good], [[wrong]], config, rounding_step=0)
    np.testing.assert_array_equal(_f32(good), np.ones([8, 4]))
    np.testing.assert_array_equal(wrong.numpy(), np.ones([8, 4]))
