"""`check_numerics=True` on values that first become non-finite inside the step (docs/reliability.md).

Finite gradients can still make a row non-finite: two gradients of 3e38 on one row sum to inf in float32 (the
per-row accumulation), and an update can overflow a table or slot (a float16 table past 65504, an Adagrad
accumulator past float32's range).  With the check on, such a step is rejected with an error that names the
table, the row, the feature and position, and no table or slot changes (every table's update is checked before
any is written).  The references are plain numpy float32 arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.embedding_test_util import initial_slots, make_config
from tf_embed_ops import embedding_ops as eo

BIG = 3e38  # finite; 2 * BIG overflows float32


def _bits(v: tf.Variable) -> np.ndarray:
    return tf.bitcast(v, tf.uint16 if v.dtype.size == 2 else tf.uint32).numpy().copy()


def _send(config, tables, slots, feats, grads, check_numerics=True, rounding="nearest"):
    eo.send_tpu_embedding_gradients(
        [tf.constant(g, tf.float32) for g in grads],
        [],
        feats,
        tables,
        slots,
        config,
        check_numerics=check_numerics,
        rounding=[rounding] * len(tables),
        rounding_step=0,
    )


def _two_tables(dtype, opt=None):
    """Table 'a' (the one that overflows) and table 'b' (written first if the check came too late)."""
    opt = opt or {"name": "sgd"}
    config = make_config(
        [
            {"name": "b", "vocab": 8, "dim": 4, "opt": {"name": "sgd"}, "lr": 1.0},
            {"name": "a", "vocab": 8, "dim": 4, "opt": opt, "lr": 1.0},
        ],
        [("fb", 0, [2]), ("fa", 1, [2])],
    )
    tables = [tf.Variable(tf.ones([8, 4], dtype)), tf.Variable(tf.ones([8, 4], dtype))]
    slots = [[], [tf.Variable(tf.cast(s, dtype)) for s in initial_slots(opt, 8, 4, np.random.default_rng(0))]]
    return config, tables, slots


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float16])
def test_overflowing_row_sum_is_rejected_and_nothing_changes(dtype):
    config, tables, slots = _two_tables(dtype)
    feats = [eo.normalize_feature(tf.constant([1, 2], tf.int64)), eo.normalize_feature(tf.constant([5, 5], tf.int64))]
    grads = [np.ones([2, 4], np.float32), np.full([2, 4], BIG, np.float32)]
    # The reference: the row sum really overflows float32 (without the check the row would be -inf).
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.float32(BIG) + np.float32(BIG))
    before = [_bits(v) for v in tables + slots[1]]
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"check_numerics: table 'a', row 5 \(first seen at feature 1 \('fa'\), ids\[0\]\): its gradient summed "
        r"over the step holds inf at column 0",
    ):
        _send(config, tables, slots, feats, grads)
    for old, v in zip(before, tables + slots[1], strict=True):
        np.testing.assert_array_equal(_bits(v), old)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float16])
def test_without_the_check_the_overflow_is_applied(dtype):
    config, tables, slots = _two_tables(dtype)
    feats = [eo.normalize_feature(tf.constant([1, 2], tf.int64)), eo.normalize_feature(tf.constant([5, 5], tf.int64))]
    grads = [np.ones([2, 4], np.float32), np.full([2, 4], BIG, np.float32)]
    _send(config, tables, slots, feats, grads, check_numerics=False)
    row = tf.cast(tables[1], tf.float32).numpy()[5]
    np.testing.assert_array_equal(row, np.full(4, -np.inf, np.float32))  # 1 - 1.0 * inf


def test_float16_update_past_65504_is_rejected_after_rounding():
    """The gradient sum is finite and so is the float32 update; only the stored float16 value is inf."""
    config, tables, slots = _two_tables(tf.float16)
    tables[1].assign(tf.fill([8, 4], tf.constant(60000.0, tf.float16)))
    feats = [eo.normalize_feature(tf.constant([1], tf.int64)), eo.normalize_feature(tf.constant([3], tf.int64))]
    grads = [np.ones([1, 4], np.float32), np.array([[0, 0, -10000.0, 0]], np.float32)]
    with np.errstate(over="ignore"):
        assert np.isinf(np.float16(np.float32(60000.0) + np.float32(10000.0)))
    before = [_bits(v) for v in tables]
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"check_numerics: table 'a', row 3 .*: the update would store inf in the table at column 2",
    ):
        _send(config, tables, slots, feats, grads)
    for old, v in zip(before, tables, strict=True):
        np.testing.assert_array_equal(_bits(v), old)
    # A step that stays finite passes and is applied exactly (float32 numpy, then round to nearest).
    grads[1] = np.array([[0, 0, -5000.0, 0]], np.float32)
    _send(config, tables, slots, feats, grads)
    assert float(tf.cast(tables[1][3, 2], tf.float32)) == float(np.float16(np.float32(65000.0)))


def test_adagrad_accumulator_overflow_is_rejected_in_the_slot():
    opt = {"name": "adagrad"}
    config, tables, slots = _two_tables(tf.float32, opt)
    feats = [eo.normalize_feature(tf.constant([1], tf.int64)), eo.normalize_feature(tf.constant([4], tf.int64))]
    grads = [np.ones([1, 4], np.float32), np.array([[1.0, 2e19, 1.0, 1.0]], np.float32)]
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(2e19) * np.float32(2e19))
    before = [_bits(v) for v in tables + slots[1]]
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"check_numerics: table 'a', row 4 .*: the update would store inf in slot 'accumulators' at column 1",
    ):
        _send(config, tables, slots, feats, grads)
    for old, v in zip(before, tables + slots[1], strict=True):
        np.testing.assert_array_equal(_bits(v), old)


def test_rows_already_non_finite_do_not_block_training():
    """The check is about what the step introduces: a row that is NaN already is updated as before."""
    config, tables, slots = _two_tables(tf.float32)
    tables[1].assign(tf.tensor_scatter_nd_update(tables[1], [[6, 0]], [np.nan]))
    feats = [eo.normalize_feature(tf.constant([1], tf.int64)), eo.normalize_feature(tf.constant([6], tf.int64))]
    _send(config, tables, slots, feats, [np.ones([1, 4], np.float32), np.ones([1, 4], np.float32)])
    row = tables[1].numpy()[6]
    assert np.isnan(row[0])
    np.testing.assert_array_equal(row[1:], np.zeros(3, np.float32))


def _mixed(check_numerics=True):
    import tf_embed_ops as te

    emb_api = tf.tpu.experimental.embedding
    static = emb_api.TableConfig(16, 4, name="static", optimizer=te.optimizers.SGD(1.0))
    dynamic = te.DynamicTableConfig("dynamic", 4, optimizer=te.optimizers.SGD(1.0), initializer="zeros")
    emb = te.TPUEmbedding(
        {"s": emb_api.FeatureConfig(static, name="s"), "d": emb_api.FeatureConfig(dynamic, name="d")},
        check_numerics=check_numerics,
    )
    return emb, static, dynamic


def _mixed_state(emb, static, dynamic):
    exported = emb.dynamic_tables[dynamic].export()
    return [emb.embedding_tables[static].numpy(), exported["keys"].numpy(), exported["weights"].numpy()]


@pytest.mark.parametrize("bad", ["overflow", "nan"])
def test_static_and_dynamic_tables_in_one_embedding_reject_the_step_naming_the_feature(bad):
    emb, static, dynamic = _mixed()
    ids = tf.constant([[1], [1]], tf.int64)  # two samples, one key: two gradients on one row
    emb.enqueue({"s": ids, "d": ids})
    acts = emb.dequeue()
    emb.apply_gradients({"s": tf.ones_like(acts["s"]), "d": tf.ones_like(acts["d"])})
    before = _mixed_state(emb, static, dynamic)
    emb.enqueue({"s": ids, "d": ids})
    acts = emb.dequeue()
    if bad == "overflow":
        grad = tf.fill(tf.shape(acts["d"]), BIG)
        pattern = (
            r"check_numerics: table 'dynamic', key 1 \(row \d+\) \(first seen at feature 0 \('d'\), ids\[0\]\): its "
            r"gradient summed over the step holds inf"
        )
    else:
        grad = tf.tensor_scatter_nd_update(tf.zeros_like(acts["d"]), [[1, 2]], [np.nan])
        pattern = r"feature 0 \('d'\): the gradient \(inputs\[0\]\) holds nan at \[1, 2\].*table 'dynamic'"
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        emb.apply_gradients({"s": tf.ones_like(acts["s"]), "d": grad})
    for old, new in zip(before, _mixed_state(emb, static, dynamic), strict=True):
        np.testing.assert_array_equal(new, old)
