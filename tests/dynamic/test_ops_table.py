"""The dynamic-table ops one by one: handles, find / lookup, the training lookup's admission and max_rows, eviction
(end of step and explicit), export / import, stats, and string keys (TensorFlow's farmhash64).

References are independent of the kernels: numpy sums, the documented policies applied by hand, and
tf.fingerprint for string keys."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from dynamic_ops_test_util import import_rows, int_feature, make_config, new_table, schema, string_feature

from tf_embed_ops import embedding_ops
from tf_embed_ops.dynamic import ops as dyn

DIM = 3
SGD = schema("stochastic_gradient_descent")


def _config(dim=DIM, lr=1.0, features=1):
    return make_config(
        [{"name": "t", "vocab": 1000, "dim": dim, "schema": SGD, "lr": lr}], [(f"f{i}", 0) for i in range(features)]
    )


def _lookup_and_update(handle, keys, step, grad_value=1.0, config=None):
    """One training step of a dense feature of `keys` with gradient `grad_value` everywhere (SGD, lr 1)."""
    config = config or _config()
    feature = int_feature("dense", [[k] for k in keys])
    acts = dyn.dynamic_embedding_activations([feature], [handle], step, config, training=True)
    grads = [np.full(acts[0].shape, grad_value, np.float32)]
    dyn.dynamic_send_tpu_embedding_gradients(grads, [], [feature], [handle], step, config)
    return acts[0].numpy()


def _stats(handle) -> dict:
    return {k: int(v) for k, v in dyn.dynamic_table_stats(handle)._asdict().items()}


def test_training_lookup_inserts_keys_initialised_from_the_key_and_serving_lookup_never_inserts():
    h = new_table(DIM, initializer="uniform", initializer_params=[-1.0, 1.0], seed=7)
    other = new_table(DIM, initializer="uniform", initializer_params=[-1.0, 1.0], seed=7)
    keys = np.array([-5, 0, 2**62, 17], np.int64)
    # Serving lookup: zeros, no insert.
    np.testing.assert_array_equal(dyn.dynamic_table_lookup(h, keys).numpy(), np.zeros((4, DIM)))
    np.testing.assert_array_equal(dyn.dynamic_table_find(h, keys).numpy(), [-1, -1, -1, -1])
    feature = int_feature("dense", [[int(k)] for k in keys])
    acts = dyn.dynamic_embedding_activations([feature], [h], 0, _config(), training=False)
    np.testing.assert_array_equal(acts[0].numpy(), np.zeros((4, DIM)))
    assert _stats(h)["size"] == 0
    # Training lookup: rows appear, initialised from the key alone (same in another table, any order).
    acts = dyn.dynamic_embedding_activations([feature], [h], 3, _config(), training=True)
    assert _stats(h)["size"] == 4
    reversed_feature = int_feature("dense", [[int(k)] for k in keys[::-1]])
    acts_other = dyn.dynamic_embedding_activations([reversed_feature], [other], 3, _config(), training=True)
    np.testing.assert_array_equal(acts[0].numpy(), acts_other[0].numpy()[::-1])
    assert np.all(np.abs(acts[0].numpy()) < 1.0) and len(np.unique(acts[0].numpy())) == 4 * DIM
    np.testing.assert_array_equal(dyn.dynamic_table_lookup(h, keys).numpy(), acts[0].numpy())
    c = dyn.dynamic_table_export(h)
    np.testing.assert_array_equal(c.keys.numpy(), np.sort(keys))  # sorted by key
    np.testing.assert_array_equal(c.last_steps.numpy(), [3, 3, 3, 3])
    np.testing.assert_array_equal(c.counts.numpy(), [1, 1, 1, 1])


def test_keys_without_a_row_read_zeros_in_the_combiner_and_get_no_update():
    h = new_table(DIM, initializer="constant", initializer_params=[1.0], admission_min_count=2, max_pending_keys=10)
    import_rows(h, [1], np.full((1, DIM), 4.0, np.float32), [])
    config = _config()
    # Sample 0: keys 1 (a row) and 9 (first sighting: no row yet), mean combiner: (4 + 0) / 2; sample 1: key 8.
    feature = int_feature("ragged", [[1, 9], [8]])
    acts = dyn.dynamic_embedding_activations([feature], [h], 0, config, ["mean"], training=True)
    np.testing.assert_array_equal(acts[0].numpy(), [[2.0] * DIM, [0.0] * DIM])
    np.testing.assert_array_equal(dyn.dynamic_table_find(h, [1, 9, 8]).numpy() >= 0, [True, False, False])
    assert _stats(h)["below_admission"] == 2
    grads = [np.ones((2, DIM), np.float32)]
    dyn.dynamic_send_tpu_embedding_gradients(grads, [], [feature], [h], 0, config, ["mean"])
    # SGD lr 1: key 1 gets -1/2 (its share of a 2-id mean sample); 9 and 8 get nothing and still have no row.
    np.testing.assert_array_equal(
        dyn.dynamic_table_lookup(h, [1, 9, 8]).numpy(), [[3.5] * DIM, [0.0] * DIM, [0.0] * DIM]
    )
    assert _stats(h)["size"] == 1
    # Second sighting of 9: admitted, initialised by the table's initializer (constant 1).
    dyn.dynamic_embedding_activations([int_feature("dense", [[9]])], [h], 1, config, training=True)
    np.testing.assert_array_equal(dyn.dynamic_table_lookup(h, [9]).numpy(), [[1.0] * DIM])


def test_admission_counts_over_the_whole_step_and_max_rows_refuses():
    h = new_table(DIM, max_rows=3, initial_capacity=1, admission_min_count=2, max_pending_keys=100)
    # Two features on one table: key 4 once in each -> admitted (counted over the step, all features).
    config = _config(features=2)
    f0 = int_feature("dense", [[4], [5], [6]])
    f1 = int_feature("dense", [[4], [6], [7]])
    dyn.dynamic_embedding_activations([f0, f1], [h], 1, config, training=True)
    np.testing.assert_array_equal(dyn.dynamic_table_find(h, [4, 5, 6, 7]).numpy() >= 0, [True, False, True, False])
    s = _stats(h)
    assert (s["size"], s["inserts"], s["below_admission"], s["last_step_inserts"]) == (2, 2, 2, 2)
    # Keys 7 and 5 reach 2 at step 2, but only one row is left: the first occurrence in the batch (7) wins.
    dyn.dynamic_embedding_activations([int_feature("dense", [[7], [5]])], [h], 2, _config(), training=True)
    found = dyn.dynamic_table_find(h, [5, 7]).numpy()
    assert found[0] == -1 and found[1] >= 0
    s = _stats(h)
    assert (s["size"], s["refused_full"], s["last_step_inserts"], s["last_step_refused"]) == (3, 1, 1, 1)


def test_end_of_step_lru_eviction_and_explicit_eviction():
    h = new_table(DIM, eviction="lru", eviction_max_rows=2)
    _lookup_and_update(h, [1, 2], step=0)
    _lookup_and_update(h, [3], step=1)  # 3 rows at the end of step 1 -> the least recently seen (1 or 2) goes
    np.testing.assert_array_equal(dyn.dynamic_table_export(h).keys.numpy(), [2, 3])  # tie at step 0: smaller key
    s = _stats(h)
    assert (s["evictions"], s["last_step_evictions"], s["size"]) == (1, 1, 2)
    # Explicit: ttl at step 5 with ttl 3 evicts rows last seen before step 2.
    assert int(dyn.dynamic_table_evict(h, 5, "ttl", ttl_steps=3)) == 2
    assert _stats(h)["size"] == 0
    _lookup_and_update(h, [8, 9], step=6)
    assert int(dyn.dynamic_table_evict_keys(h, [9, 9, 100])) == 1
    np.testing.assert_array_equal(dyn.dynamic_table_export(h).keys.numpy(), [8])


def test_ttl_eviction_runs_at_the_end_of_the_update():
    h = new_table(DIM, eviction="ttl", eviction_ttl_steps=1)
    _lookup_and_update(h, [1], step=0)
    _lookup_and_update(h, [2], step=1)
    assert sorted(dyn.dynamic_table_export(h).keys.numpy()) == [1, 2]
    _lookup_and_update(h, [2], step=2)  # key 1: 2 - 0 > 1
    np.testing.assert_array_equal(dyn.dynamic_table_export(h).keys.numpy(), [2])


def test_export_import_round_trip_into_another_capacity():
    h = new_table(DIM, slot_initial_values=[0.1], initializer="normal", initializer_params=[0.0, 1.0])
    config = make_config([{"name": "t", "vocab": 1000, "dim": DIM, "schema": schema("adagrad")}], [("f", 0)])
    keys = np.random.default_rng(1).integers(-(2**40), 2**40, 50)
    f = int_feature("dense", [[int(k)] for k in keys])
    dyn.dynamic_embedding_activations([f], [h], 4, config, training=True)
    dyn.dynamic_send_tpu_embedding_gradients([np.ones((50, DIM), np.float32)], [], [f], [h], 4, config)
    c = dyn.dynamic_table_export(h, 1)
    assert np.all(np.diff(c.keys.numpy()) > 0)
    small = new_table(DIM, slot_initial_values=[0.1], initial_capacity=1, max_rows=50)
    dyn.dynamic_table_import(small, c)
    for a, b in zip(dyn.dynamic_table_export(small, 1), c, strict=True):
        for x, y in zip(a if isinstance(a, tuple) else [a], b if isinstance(b, tuple) else [b], strict=True):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
    np.testing.assert_array_equal(
        dyn.dynamic_table_lookup(small, keys).numpy(), dyn.dynamic_table_lookup(h, keys).numpy()
    )


def test_a_second_handle_with_the_same_name_shares_the_table_and_destroy_releases_it():
    kwargs = {"table_name": "shared", "dim": DIM, "initial_capacity": 4, "max_rows": 10, "shared_name": "shared_ops"}
    a = dyn.dynamic_table_handle(**kwargs)
    b = dyn.dynamic_table_handle(**kwargs)
    import_rows(a, [3], np.ones((1, DIM), np.float32), [])
    np.testing.assert_array_equal(dyn.dynamic_table_lookup(b, [3]).numpy(), np.ones((1, DIM)))
    tf.raw_ops.DestroyResourceOp(resource=a, ignore_lookup_error=False)
    with pytest.raises(tf.errors.NotFoundError):
        dyn.dynamic_table_lookup(b, [3])
    c = dyn.dynamic_table_handle(**kwargs)  # created afresh
    assert _stats(c)["size"] == 0
    tf.raw_ops.DestroyResourceOp(resource=c, ignore_lookup_error=False)


def test_string_keys_are_tensorflow_farmhash64_fingerprints():
    strings = ["", "a", "user:12345", "\u00e9t\u00e9", "x" * 100]
    h = new_table(DIM, key_dtype=tf.string, initializer="uniform", initializer_params=[-1.0, 1.0])
    config = _config()
    acts = dyn.dynamic_embedding_activations([string_feature([[s] for s in strings])], [h], 0, config, training=True)
    expected_keys = tf.bitcast(tf.fingerprint(tf.constant(strings), "farmhash64"), tf.int64).numpy()
    np.testing.assert_array_equal(dyn.string_keys_to_int64(strings).numpy(), expected_keys)
    np.testing.assert_array_equal(dyn.dynamic_table_export(h).keys.numpy(), np.sort(expected_keys))
    # An int64 table fed those fingerprints holds the same rows (initialised from the key).
    i = new_table(DIM, initializer="uniform", initializer_params=[-1.0, 1.0])
    acts_int = dyn.dynamic_embedding_activations(
        [int_feature("dense", [[int(k)] for k in expected_keys])], [i], 0, config, training=True
    )
    np.testing.assert_array_equal(acts[0].numpy(), acts_int[0].numpy())
    np.testing.assert_array_equal(dyn.dynamic_table_lookup(h, strings).numpy(), acts[0].numpy())
    np.testing.assert_array_equal(dyn.dynamic_table_find(h, strings).numpy(), dyn.dynamic_table_find(i, expected_keys))
    # Training through string keys: SGD lr 1 with gradient 1 subtracts 1 per occurrence.
    before = dyn.dynamic_table_lookup(h, ["a"]).numpy()
    f = string_feature([["a", "a"], ["zz"]])
    dyn.dynamic_send_tpu_embedding_gradients([np.ones((2, DIM), np.float32)], [], [f], [h], 0, config)
    np.testing.assert_array_equal(dyn.dynamic_table_lookup(h, ["a"]).numpy(), before - 2.0)
    assert int(dyn.dynamic_table_evict_keys(h, ["a", "nope"])) == 1


def test_shape_functions():
    @tf.function
    def graph(keys, splits):
        h = new_table(4, slot_initial_values=[0.1, 0.2])
        feature = embedding_ops.FeatureInput(splits, keys, tf.zeros([0]), tf.constant([2], tf.int64))
        config = make_config([{"name": "t", "vocab": 10, "dim": 4, "schema": SGD}], [("f", 0)])
        acts = dyn.dynamic_embedding_activations([feature], [h], 0, config)
        c = dyn.dynamic_table_export(h, 2)
        values = dyn.dynamic_table_lookup(h, keys)
        assert acts[0].shape.as_list() == [2, 4]
        assert values.shape.as_list() == [3, None]
        assert [x.shape.rank for x in c.slots] == [2, 2] and c.weights.shape.rank == 2
        assert all(s.shape.rank == 0 for s in dyn.dynamic_table_stats(h))
        return acts[0]

    out = graph(tf.constant([1, 2, 3], tf.int64), tf.constant([0, 1, 3], tf.int64))
    assert out.shape == (2, 4)


def test_a_tf_function_training_step_with_a_step_variable():
    # The front ends' shape of a step: lookup and update in one graph, the step read from a variable.
    h = new_table(DIM, initializer="constant", initializer_params=[1.0])
    config = _config()
    step = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def train(keys):
        feature = embedding_ops.FeatureInput(tf.zeros([0], tf.int64), keys, tf.zeros([0]), tf.shape(keys, tf.int64))
        acts = dyn.dynamic_embedding_activations([feature], [h], step, config, training=True)
        update = dyn.dynamic_send_tpu_embedding_gradients([tf.ones_like(acts[0])], [], [feature], [h], step, config)
        with tf.control_dependencies([update]):
            step.assign_add(1)
        return acts[0]

    first = train(tf.constant([4, 5, 4], tf.int64)).numpy()
    np.testing.assert_array_equal(first, np.ones((3, DIM)))
    second = train(tf.constant([4, 6], tf.int64)).numpy()
    # Key 4 got -1 twice at step 0 (SGD, lr 1): 1 - 2 = -1; key 6 is new.
    np.testing.assert_array_equal(second, [[-1.0] * DIM, [1.0] * DIM])
    np.testing.assert_array_equal(dyn.dynamic_table_export(h).last_steps.numpy(), [1, 0, 1])
    assert int(step.numpy()) == 2
