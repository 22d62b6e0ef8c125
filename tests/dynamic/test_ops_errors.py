"""Bad input to the dynamic-table ops: a clear InvalidArgument naming the table (and feature) and the offending value,
and NOTHING changed: keys, rows, slots, admission counts and counters are compared through export and stats before
and after every rejected call."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from dynamic_ops_test_util import (
    assert_unchanged,
    import_rows,
    int_feature,
    make_config,
    new_table,
    schema,
    snapshot,
    string_feature,
)

from tf_embed_ops import embedding_ops
from tf_embed_ops.dynamic import ops as dyn

DIM = 3
ADAGRAD = schema("adagrad")
Invalid = tf.errors.InvalidArgumentError


def _config(dim=DIM, opt=ADAGRAD, name="t", lr=0.1, features=1):
    table = {"name": name, "vocab": 100, "dim": dim, "schema": opt, "lr": lr}
    if lr is None:
        table["options"] = {"dynamic_lr": True}
    return make_config([table], [(f"f{i}", 0) for i in range(features)])


@pytest.fixture
def trained():
    """A table with rows, slots, pending admission counts and counters, after a training lookup."""
    h = new_table(DIM, [0.1], name="users", admission_min_count=2, max_pending_keys=8)
    import_rows(h, [1, 2, 3], np.arange(9, dtype=np.float32).reshape(3, 3), [np.full((3, DIM), 0.5, np.float32)])
    feature = int_feature("ragged", [[1, 2], [7]])  # 7: pending
    dyn.dynamic_embedding_activations([feature], [h], 2, _config(), training=True)
    return h, feature


def _expect(match, fn, error=Invalid):
    with pytest.raises(error, match=match):
        fn()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"dim": 0}, r"'bad'.*dim must be in \[1, 1048576\], got 0"),
        ({"dim": -4}, r"'bad'.*got -4"),
        ({"initial_capacity": 0}, r"'bad'.*initial_capacity must be in \[1, max_rows = 10\], got 0"),
        ({"max_rows": -1}, r"'bad'.*max_rows must be in .* got -1"),
        ({"rows_per_chunk": 3}, r"'bad'.*rows_per_chunk .* got 3"),
        ({"initializer": "uniform", "initializer_params": [1.0]}, r"'bad'.*'uniform' takes 2 .* got 1"),
        ({"initializer": "uniform", "initializer_params": [1.0, -1.0]}, r"'bad'.*minval"),
        ({"admission_min_count": 3}, r"'bad'.*max_pending_keys > 0, got 0"),
        ({"eviction": "lru"}, r"'bad'.*target_rows must be in \[1, max_rows = 10\], got 0"),
        ({"slot_initial_values": [float("nan")]}, r"'bad'.*slot 0 initial value must be finite, got nan"),
    ],
)
def test_bad_handle_options_name_the_table_and_the_value(kwargs, match):
    args = {"table_name": "bad", "dim": DIM, "initial_capacity": 4, "max_rows": 10, "shared_name": f"bad_{match}"}
    args.update(kwargs)
    _expect(match, lambda: dyn.dynamic_table_handle(**args))


def test_a_second_handle_with_other_options_is_refused_and_the_table_is_kept():
    args = {"table_name": "twice", "dim": DIM, "initial_capacity": 4, "max_rows": 10, "shared_name": "twice_ops"}
    h = dyn.dynamic_table_handle(**args)
    import_rows(h, [5], np.ones((1, DIM), np.float32), [])
    before = snapshot(h)
    _expect(
        r"'twice'.*max_rows = 10, but this handle asks for max_rows = 11",
        lambda: dyn.dynamic_table_handle(**{**args, "max_rows": 11}),
    )
    _expect(
        r"'twice'.*key_dtype = int64, but .* key_dtype = string",
        lambda: dyn.dynamic_table_handle(**{**args, "key_dtype": tf.string}),
    )
    assert_unchanged(before, h)
    tf.raw_ops.DestroyResourceOp(resource=h, ignore_lookup_error=False)


def test_wrong_key_dtype_names_the_feature_and_the_table(trained):
    h, _ = trained
    before = snapshot(h, 1)
    _expect(
        r"feature 0 \('f0'\): keys are string but dynamic table 'users' has int64 keys",
        lambda: dyn.dynamic_embedding_activations([string_feature([["a"]])], [h], 3, _config(), training=True),
    )
    _expect(r"keys are string but dynamic table 'users'", lambda: dyn.dynamic_table_find(h, ["a"]))
    _expect(r"keys are string but dynamic table 'users'", lambda: dyn.dynamic_table_lookup(h, ["a"]))
    _expect(r"keys are string but dynamic table 'users'", lambda: dyn.dynamic_table_evict_keys(h, ["a"]))
    grads = [np.ones((1, DIM), np.float32)]
    _expect(
        r"feature 0 \('f0'\): keys are string",
        lambda: dyn.dynamic_send_tpu_embedding_gradients(grads, [], [string_feature([["a"]])], [h], 3, _config()),
    )
    assert_unchanged(before, h, 1)
    s = new_table(DIM, [0.1], name="strings", key_dtype=tf.string)
    _expect(r"keys are int64 but dynamic table 'strings' has string keys", lambda: dyn.dynamic_table_find(s, [1]))


def test_bad_gradient_learning_rate_step_or_numerics_change_nothing(trained):
    h, feature = trained
    before = snapshot(h, 1)
    good = [np.ones((2, DIM), np.float32)]
    send = dyn.dynamic_send_tpu_embedding_gradients
    _expect(
        r"feature 0 \('f0'\): the gradient \(inputs\[0\]\) has shape \[2,4\], expected \[2,3\].*'t'",
        lambda: send([np.ones((2, 4), np.float32)], [], [feature], [h], 3, _config()),
    )
    _expect(r"step must be >= 0, got -1", lambda: send(good, [], [feature], [h], -1, _config()))
    nan = np.array([[1, 1, 1], [1, np.nan, 1]], np.float32)
    _expect(r"holds nan at \[1, 1\]", lambda: send([nan], [], [feature], [h], 3, _config(), check_numerics=True))
    for rate in (-0.5, float("nan"), float("inf")):
        _expect(
            rf"learning_rates\[0\] .*table 't'.* = {rate}: a learning rate must be finite and >= 0",
            lambda rate=rate: send(good, [rate], [feature], [h], 3, _config(lr=None)),
        )
    assert_unchanged(before, h, 1)


def test_config_mismatches_change_nothing(trained):
    h, feature = trained
    before = snapshot(h, 1)
    act = dyn.dynamic_embedding_activations
    _expect(
        r"tables\[0\] \(table 't' in the config\): dynamic table 'users' has dim 3 but the config's table has "
        r"dimension 4",
        lambda: act([feature], [h], 3, _config(dim=4), training=True),
    )
    grads = [np.ones((2, DIM), np.float32)]
    _expect(
        r"dynamic table 'users' was created with 1 slot initial values but the config's optimizer has 2 slots",
        lambda: dyn.dynamic_send_tpu_embedding_gradients(grads, [], [feature], [h], 3, _config(opt=schema("adam"))),
    )
    _expect(
        r"dynamic table 'users' keeps 3 values per row in slot 0 but the config's optimizer's slot "
        r"'row_accumulators' holds 1",
        lambda: dyn.dynamic_send_tpu_embedding_gradients(
            grads, [], [feature], [h], 3, _config(opt=schema("rowwise_adagrad"))
        ),
    )
    two = make_config(
        [{"name": n, "vocab": 100, "dim": DIM, "schema": ADAGRAD} for n in ("a", "b")], [("f0", 0), ("f1", 1)]
    )
    _expect(
        r"tables\[1\] \(table 'b' in the config\): dynamic table 'users' is also tables\[0\]",
        lambda: act([feature, feature], [h, h], 3, two, training=True),
    )
    bad_splits = embedding_ops.FeatureInput(
        tf.constant([0, 3, 2], tf.int64), feature.ids, feature.weights, feature.sample_shape
    )
    _expect(r"feature 0 \('f0'\)", lambda: act([bad_splits], [h], 3, _config(), training=True))
    assert_unchanged(before, h, 1)


@pytest.mark.parametrize(
    "change,match",
    [
        (
            lambda c: c._replace(weights=np.zeros((3, 4), np.float32), slots=[np.zeros((3, 4), np.float32)]),
            r"dim 4, the table has dim 3",
        ),
        (
            lambda c: c._replace(slots=[np.zeros((3, DIM), np.float32)] * 2),
            r"num_slots = 2 but the table has 1 optimizer slots",
        ),
        (
            lambda c: c._replace(slots=[np.zeros((3, 1), np.float32)]),
            r"slot 0 of the checkpoint has 1 values per row, the table's optimizer keeps 3",
        ),
        (lambda c: c._replace(slots=[np.zeros((2, DIM), np.float32)]), r"slots\[0\] .* do not agree"),
        (lambda c: c._replace(keys=np.array([1, 1, 3], np.int64)), r"key 1 appears more than once"),
        (lambda c: c._replace(counts=np.array([1, 1], np.int64)), r"counts has 2 values, expected 3"),
        (lambda c: c._replace(weights=np.zeros((2, DIM), np.float32)), r"do not agree"),
        (lambda c: c._replace(pending_keys=np.array([2], np.int64)), r"key 2 is both a row and a pending key"),
        (lambda c: c._replace(last_steps=np.array([0, -3, 0], np.int64)), r"last step -3"),
    ],
)
def test_bad_imports_change_nothing(trained, change, match):
    h, _ = trained
    before = snapshot(h, 1)
    c = dyn.dynamic_table_export(h, 1)
    contents = dyn.DynamicTableContents(
        *[t.numpy() for t in c[:2]], [s.numpy() for s in c.slots], *[t.numpy() for t in c[3:]]
    )
    _expect(rf"'users'.*{match}", lambda: dyn.dynamic_table_import(h, change(contents)))
    assert_unchanged(before, h, 1)


def test_import_over_max_rows_and_bad_explicit_eviction_change_nothing():
    h = new_table(DIM, name="small", max_rows=2, initial_capacity=2)
    import_rows(h, [1, 2], np.ones((2, DIM), np.float32), [])
    before = snapshot(h)
    _expect(
        r"'small'.*3 rows do not fit max_rows = 2",
        lambda: import_rows(h, [1, 2, 3], np.ones((3, DIM), np.float32), []),
    )
    _expect(r"'small'.*target_rows must be in \[1, max_rows = 2\], got 0", lambda: dyn.dynamic_table_evict(h, 1, "lru"))
    _expect(r"'small'.*ttl_steps must be > 0, got 0", lambda: dyn.dynamic_table_evict(h, 1, "ttl"))
    _expect(r"'small'.*step must be >= 0, got -2", lambda: dyn.dynamic_table_evict(h, -2, "ttl", ttl_steps=1))
    assert_unchanged(before, h)
