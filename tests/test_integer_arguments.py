"""Every Python-side integer argument of the op wrappers is range-checked before any op runs: a value outside
int64 (or the argument's range) raises a ValueError naming the argument, and no table, slot or dynamic table
changes (TensorFlow's attribute conversion used to wrap 2**64 to -1 and fail only after the op had run)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.embedding_test_util import make_config
from tf_embed_ops import embedding_ops as eo
from tf_embed_ops.dynamic import ops as dyn

BAD_INT64 = [2**64, 2**63, -(2**63) - 1, 1.5, True, "3", None]


def _bf16_step_inputs():
    config = make_config([{"name": "t", "vocab": 8, "dim": 4, "opt": {"name": "adagrad"}, "lr": 0.1}], [("f", 0, [3])])
    table = tf.Variable(tf.fill([8, 4], tf.constant(1.3, tf.bfloat16)))
    slot = tf.Variable(tf.fill([8, 4], tf.constant(0.1, tf.bfloat16)))
    feats = [eo.normalize_feature(tf.constant([1, 2, 3], tf.int64))]
    return config, table, slot, feats


def _send(config, table, slot, feats, **kwargs):
    kwargs.setdefault("rounding_step", 0)
    return eo.send_tpu_embedding_gradients([tf.ones([3, 4])], [], feats, [table], [[slot]], config, **kwargs)


@pytest.mark.parametrize("value", BAD_INT64, ids=repr)
def test_rounding_seed_outside_int64_is_refused_before_the_update(value):
    config, table, slot, feats = _bf16_step_inputs()
    before = (table.numpy().copy(), slot.numpy().copy())
    with pytest.raises(ValueError, match=r"rounding_seed: must be (an integer|in \[-9223372036854775808, )"):
        _send(config, table, slot, feats, rounding_seed=value)
    np.testing.assert_array_equal(table.numpy(), before[0])
    np.testing.assert_array_equal(slot.numpy(), before[1])


@pytest.mark.parametrize("value", [2**63 - 1, -(2**63), np.int64(7), np.uint8(3)], ids=repr)
def test_rounding_seed_accepts_every_int64(value):
    config, table, slot, feats = _bf16_step_inputs()
    before = table.numpy().copy()
    _send(config, table, slot, feats, rounding_seed=value)
    assert not np.array_equal(table.numpy(), before)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (2**63, ValueError, r"rounding_step: must be in \[0, 9223372036854775807\], got 9223372036854775808"),
        (-1, ValueError, r"rounding_step: must be in \[0, "),
        (np.int64(-5), ValueError, r"rounding_step: must be in \[0, "),
        (tf.constant(-1, tf.int64), tf.errors.InvalidArgumentError, "rounding_step: must be >= 0"),
    ],
    ids=["2**63", "-1", "np-5", "tensor-1"],
)
def test_a_negative_or_huge_rounding_step_is_refused_before_the_update(value, error, match):
    config, table, slot, feats = _bf16_step_inputs()
    before = (table.numpy().copy(), slot.numpy().copy())
    with pytest.raises(error, match=match):
        _send(config, table, slot, feats, rounding_step=value)
    np.testing.assert_array_equal(table.numpy(), before[0])
    np.testing.assert_array_equal(slot.numpy(), before[1])


def test_a_negative_rounding_step_is_refused_inside_a_function_too():
    config, table, slot, feats = _bf16_step_inputs()
    before = table.numpy().copy()

    @tf.function
    def step(s):
        _send(config, table, slot, feats, rounding_step=s)

    with pytest.raises(tf.errors.InvalidArgumentError, match="rounding_step: must be >= 0"):
        step(tf.constant(-3, tf.int64))
    np.testing.assert_array_equal(table.numpy(), before)


_HANDLE_INTS = [
    "dim",
    "initial_capacity",
    "max_rows",
    "rows_per_chunk",
    "seed",
    "admission_min_count",
    "max_pending_keys",
    "pending_ttl_steps",
    "eviction_max_rows",
    "eviction_ttl_steps",
]


def _handle_kwargs(shared_name, **overrides):
    kwargs = {"table_name": "t", "dim": 4, "initial_capacity": 8, "max_rows": 64, "shared_name": shared_name}
    kwargs.update(overrides)
    return kwargs


@pytest.mark.parametrize("argument", _HANDLE_INTS)
@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 2.5], ids=repr)
def test_dynamic_table_handle_checks_every_int_before_creating_a_table(argument, value):
    name = f"int_check_{argument}_{abs(hash(repr(value)))}"
    with pytest.raises(ValueError, match=rf"^{argument}: must be"):
        dyn.dynamic_table_handle(**_handle_kwargs(name, **{argument: value}))
    # No table was created under that name: one with other options (seed 5) is created, not refused as a
    # mismatch with a table the refused call left behind.
    handle = dyn.dynamic_table_handle(**_handle_kwargs(name, seed=5))
    assert int(dyn.dynamic_table_stats(handle).size) == 0
    tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)


def test_dynamic_table_handle_refuses_a_bad_slot_width():
    with pytest.raises(ValueError, match=r"slot_widths\[1\]: must be"):
        dyn.dynamic_table_handle(
            **_handle_kwargs("int_check_widths", slot_initial_values=[0.0, 0.0], slot_widths=[4, 2**64])
        )


@pytest.fixture
def table():
    handle = dyn.dynamic_table_handle(**_handle_kwargs("int_check_table", slot_initial_values=[0.1], eviction="none"))
    dyn.dynamic_table_import(
        handle,
        dyn.DynamicTableContents(
            tf.constant([1, 2, 3], tf.int64),
            tf.ones([3, 4]),
            (tf.fill([3, 4], 0.5),),
            tf.constant([1, 2, 3], tf.int64),
            tf.constant([0, 1, 2], tf.int64),
            tf.zeros([0], tf.int64),
            tf.zeros([0], tf.int64),
            tf.zeros([0], tf.int64),
        ),
    )
    yield handle
    tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)


def _contents(handle):
    c = dyn.dynamic_table_export(handle, num_slots=1)
    return [np.asarray(x) for x in (c.keys, c.weights, *c.slots, c.counts, c.last_steps)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"step": 2**64, "policy": "ttl", "ttl_steps": 1}, r"^step: must be in"),
        ({"step": 5, "policy": "lru", "max_rows": 2**64}, r"^max_rows: must be in"),
        ({"step": 5, "policy": "ttl", "ttl_steps": -(2**63) - 1}, r"^ttl_steps: must be in"),
        ({"step": 5, "policy": "lru", "max_rows": 1.0}, r"^max_rows: must be an integer"),
    ],
)
def test_evict_checks_its_integers_and_changes_nothing(table, kwargs, match):
    before = _contents(table)
    with pytest.raises(ValueError, match=match):
        dyn.dynamic_table_evict(table, **kwargs)
    for a, b in zip(before, _contents(table), strict=True):
        np.testing.assert_array_equal(a, b)


def test_export_checks_num_slots(table):
    with pytest.raises(ValueError, match=r"^num_slots: must be in \[0, "):
        dyn.dynamic_table_export(table, num_slots=2**64)
    with pytest.raises(ValueError, match=r"^num_slots: must be in \[0, "):
        dyn.dynamic_table_export(table, num_slots=-1)
