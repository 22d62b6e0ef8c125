"""te.TPUEmbedding with static and dynamic tables side by side.

The reference for a dynamic table is a static table with the same initial rows, fed the same ids in the same
TPUEmbedding: a dynamic table holding keys 0..V-1 must train exactly like it (the static path itself is checked
against numpy elsewhere; one numpy check here keeps this file independent).
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te

_emb = tf.tpu.experimental.embedding
V, DIM = 12, 4


def _initial_rows(seed=0):
    return np.random.default_rng(seed).normal(size=(V, DIM)).astype(np.float32)


def _pair(optimizer, combiner="mean", max_sequence_length=0, **dynamic_kwargs):
    """A static table and a dynamic one with the same initial rows, one feature each (same kind of input)."""
    rows = _initial_rows()
    static = _emb.TableConfig(
        V, DIM, name="static", combiner=combiner, optimizer=optimizer, initializer=tf.constant_initializer(rows)
    )
    dynamic = te.DynamicTableConfig("dynamic", DIM, optimizer=optimizer, combiner=combiner, **dynamic_kwargs)
    features = {
        "d": _emb.FeatureConfig(dynamic, max_sequence_length=max_sequence_length),
        "s": _emb.FeatureConfig(static, max_sequence_length=max_sequence_length),
    }
    emb = te.TPUEmbedding(features)
    emb.build()
    emb.dynamic_tables[dynamic].import_(tf.range(V, dtype=tf.int64), rows)
    return emb, static, dynamic


def _step(emb, features, weights=None, target=1.0):
    emb.enqueue(features, weights)
    with tf.GradientTape() as tape:
        acts = emb.dequeue()
        tape.watch(acts)
        loss = sum(tf.reduce_sum((a - target) ** 2 * tf.range(1.0, DIM + 1.0)) for a in tf.nest.flatten(acts))
    emb.apply_gradients(tape.gradient(loss, acts))
    return acts


def _dynamic_content(emb, dynamic):
    exported = emb.dynamic_tables[dynamic].export()
    return exported["keys"].numpy(), exported["weights"].numpy(), exported["slots"].numpy()


def _assert_same_as_static(emb, static, dynamic):
    keys, weights, slots = _dynamic_content(emb, dynamic)
    np.testing.assert_array_equal(keys, np.arange(V))
    np.testing.assert_array_equal(weights, emb.embedding_tables[static].numpy())
    static_slots = list(emb.slot_variables[static].values())
    assert slots.shape[1] == sum(slot.shape[1] for slot in static_slots)  # slots side by side
    start = 0
    for slot in static_slots:
        np.testing.assert_array_equal(slots[:, start : start + slot.shape[1]], slot.numpy())
        start += slot.shape[1]


def _inputs(kind, rng):
    if kind == "dense":
        ids = tf.constant(rng.integers(0, V, size=[6]), tf.int64)
        return ids, None
    if kind == "ragged":
        lengths = rng.integers(0, 4, size=5)
        values = rng.integers(0, V, size=int(lengths.sum()))
        ids = tf.RaggedTensor.from_row_lengths(tf.constant(values, tf.int64), lengths)
        weights = tf.RaggedTensor.from_row_lengths(tf.constant(rng.uniform(0.5, 2, values.size), tf.float32), lengths)
        return ids, weights
    if kind == "sparse":
        dense = rng.integers(-1, V, size=[4, 3])
        idx = np.argwhere(dense >= 0)
        ids = tf.SparseTensor(idx, tf.constant(dense[dense >= 0], tf.int64), [4, 3])
        weights = tf.SparseTensor(idx, tf.constant(rng.uniform(0.5, 2, len(idx)), tf.float32), [4, 3])
        return ids, weights
    raise AssertionError(kind)


_OPTIMIZERS = {
    "sgd": lambda: te.optimizers.SGD(0.1),
    "adagrad": lambda: te.optimizers.Adagrad(0.1, initial_accumulator_value=0.2),
    "adam_lazy": lambda: te.optimizers.Adam(0.05, lazy_adam=True),
    "ftrl": lambda: te.optimizers.FTRL(0.1),
    "momentum_clipped": lambda: te.optimizers.Momentum(
        0.1, momentum=0.9, clipvalue=0.5, clip_weight_min=-1.5, weight_decay_factor=0.01
    ),
    "adagrad_accumulation_off": lambda: te.optimizers.Adagrad(0.1, use_gradient_accumulation=False),
    "adam_non_lazy": lambda: te.optimizers.Adam(0.05, lazy_adam=False),
    "rmsprop": lambda: te.optimizers.RMSProp(0.05, rho=0.9, momentum=0.5, epsilon=0.1),
}


@pytest.mark.parametrize("optimizer", sorted(_OPTIMIZERS))
@pytest.mark.parametrize(("kind", "combiner"), [("dense", "sum"), ("ragged", "mean"), ("sparse", "sqrtn")])
def test_dynamic_table_trains_like_a_static_table(optimizer, kind, combiner):
    emb, static, dynamic = _pair(_OPTIMIZERS[optimizer](), combiner)
    rng = np.random.default_rng(7)
    for _ in range(3):
        ids, weights = _inputs(kind, rng)
        acts = _step(emb, {"d": ids, "s": ids}, None if weights is None else {"d": weights, "s": weights})
        np.testing.assert_array_equal(acts["d"].numpy(), acts["s"].numpy())
    _assert_same_as_static(emb, static, dynamic)


def test_sequence_feature_and_tf_function():
    emb, static, dynamic = _pair(te.optimizers.Adagrad(0.1), "sum", max_sequence_length=3)

    @tf.function
    def step(ids):
        return _step(emb, {"d": ids, "s": ids})

    rng = np.random.default_rng(3)
    for _ in range(3):
        ids, _ = _inputs("ragged", rng)
        acts = step(ids)
        assert acts["d"].shape == (5, 3, DIM)
        np.testing.assert_array_equal(acts["d"].numpy(), acts["s"].numpy())
    _assert_same_as_static(emb, static, dynamic)


def test_one_sgd_step_against_numpy():
    emb, _, dynamic = _pair(te.optimizers.SGD(0.5), "mean")
    rows = _initial_rows()
    ids = tf.ragged.constant([[1, 3, 3], [], [11]], tf.int64)
    _step(emb, {"d": ids, "s": ids}, target=0.0)
    # act_s = mean of rows; dL/dact = 2 act * scale; each id gets dL/dact / count; summed per row.
    scale = np.arange(1.0, DIM + 1.0, dtype=np.float32)
    expected = rows.copy()
    for sample in ([1, 3, 3], [11]):
        act = rows[sample].mean(0)
        for i in sample:
            expected[i] -= 0.5 * 2 * act * scale / len(sample)
    _, weights, _ = _dynamic_content(emb, dynamic)
    np.testing.assert_allclose(weights, expected, rtol=1e-6, atol=1e-6)


def test_new_keys_get_rows_and_inference_never_inserts():
    table = te.DynamicTableConfig("t", DIM, optimizer=te.optimizers.SGD(0.1), initializer="ones")
    emb = te.TPUEmbedding({"f": _emb.FeatureConfig(table)})
    ids = tf.constant([2**62, -7, 5], tf.int64)
    np.testing.assert_array_equal(emb({"f": ids})["f"].numpy(), np.zeros([3, DIM]))  # lookup only: no rows
    handle = emb.dynamic_tables[table]
    assert int(handle.size()) == 0
    emb.enqueue({"f": ids}, training=False)
    np.testing.assert_array_equal(emb.dequeue()["f"].numpy(), np.zeros([3, DIM]))
    assert int(handle.size()) == 0
    acts = _step(emb, {"f": ids}, target=0.0)
    np.testing.assert_array_equal(acts["f"].numpy(), np.ones([3, DIM]))  # inserted, initialised from the key
    assert int(handle.size()) == 3
    assert int(emb.dynamic_step.numpy()) == 1
    # Trained rows are read back by a lookup-only call, which still inserts nothing new.
    out = emb({"f": tf.constant([5, 6], tf.int64)})["f"].numpy()
    assert not np.array_equal(out[0], np.ones(DIM)) and np.array_equal(out[1], np.zeros(DIM))
    assert int(handle.size()) == 3


def test_string_ids_match_their_fingerprint_keys():
    strings = tf.constant(["alice", "bob", "alice", ""])
    keys = te.dynamic.string_keys(strings)
    by_string = te.DynamicTableConfig("by_string", DIM, optimizer=te.optimizers.SGD(0.1), key_dtype=tf.string)
    by_key = te.DynamicTableConfig("by_key", DIM, optimizer=te.optimizers.SGD(0.1))
    emb = te.TPUEmbedding({"s": _emb.FeatureConfig(by_string), "k": _emb.FeatureConfig(by_key)})
    for _ in range(2):
        acts = _step(emb, {"s": strings, "k": keys})
        np.testing.assert_array_equal(acts["s"].numpy(), acts["k"].numpy())
    a, b = emb.dynamic_tables[by_string].export(), emb.dynamic_tables[by_key].export()
    np.testing.assert_array_equal(a["keys"].numpy(), b["keys"].numpy())
    np.testing.assert_array_equal(a["weights"].numpy(), b["weights"].numpy())
    assert a["keys"].shape[0] == 3


def test_admission_and_eviction_through_the_front_end():
    table = te.DynamicTableConfig(
        "t",
        DIM,
        optimizer=te.optimizers.SGD(0.0),
        initializer="ones",
        admission=te.dynamic.FrequencyAdmission(2),
        eviction=te.dynamic.LRU(2),
    )
    emb = te.TPUEmbedding({"f": _emb.FeatureConfig(table, name="f")})
    handle = lambda: emb.dynamic_tables[table]
    acts = _step(emb, {"f": tf.constant([1, 2, 2], tf.int64)})
    np.testing.assert_array_equal(acts["f"].numpy()[:, 0], [0, 1, 1])  # key 2 reached min_count in the batch
    acts = _step(emb, {"f": tf.constant([1, 3, 3], tf.int64)})
    np.testing.assert_array_equal(acts["f"].numpy()[:, 0], [1, 1, 1])
    assert int(handle().size()) == 2  # 1, 2, 3 admitted; LRU keeps the two seen last (1 and 3; ties: smaller key)
    np.testing.assert_array_equal(handle().export()["keys"].numpy(), [1, 3])
    stats = handle().stats()
    assert int(stats["evictions"]) == 1 and int(stats["inserts"]) == 3


@pytest.mark.parametrize(
    ("key_dtype", "ids", "message"),
    [
        (tf.int64, tf.constant(["a", "b"]), "Feature f: table 't' has key_dtype int64; got string ids"),
        (tf.string, tf.constant([1, 2], tf.int64), "Feature f: table 't' has key_dtype string; got int64 ids"),
        (tf.int64, tf.constant([1.0, 2.0]), "Feature f: table 't' has key_dtype int64; got float32 ids"),
    ],
)
def test_wrong_key_dtype_names_feature_and_table_and_changes_nothing(key_dtype, ids, message):
    table = te.DynamicTableConfig("t", DIM, optimizer=te.optimizers.SGD(0.1), key_dtype=key_dtype)
    emb = te.TPUEmbedding({"f": _emb.FeatureConfig(table)})
    good = tf.constant(["x"]) if key_dtype == tf.string else tf.constant([9], tf.int64)
    _step(emb, {"f": good})
    before = {k: v.numpy() for k, v in emb.dynamic_tables[table].export().items()}
    for call in (lambda: emb.enqueue({"f": ids}), lambda: emb({"f": ids})):
        with pytest.raises(ValueError) as info:
            call()
        assert message in str(info.value)
    after = {k: v.numpy() for k, v in emb.dynamic_tables[table].export().items()}
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])
    assert int(emb.dynamic_step.numpy()) == 1


def test_static_configuration_is_unchanged_by_dynamic_tables():
    static = _emb.TableConfig(V, DIM, name="static", optimizer=te.optimizers.Adagrad(0.1))
    alone = te.TPUEmbedding({"s": _emb.FeatureConfig(static)})
    dynamic = te.DynamicTableConfig("dynamic", DIM, optimizer=te.optimizers.SGD(0.1))
    mixed = te.TPUEmbedding({"a": _emb.FeatureConfig(dynamic), "s": _emb.FeatureConfig(static)})
    assert mixed.config_proto == alone.config_proto
    assert mixed.table_configs == [static]
    assert alone.dynamic_tables == {} and alone.dynamic_step is None


def test_untrainable_dynamic_table_is_refused_before_any_update():
    static = _emb.TableConfig(V, DIM, name="static", optimizer=te.optimizers.SGD(0.1))
    dynamic = te.DynamicTableConfig("dynamic", DIM)
    emb = te.TPUEmbedding({"d": _emb.FeatureConfig(dynamic), "s": _emb.FeatureConfig(static)})
    emb.build()
    before = emb.embedding_tables[static].numpy()
    with pytest.raises(RuntimeError, match="Table 'dynamic' has no optimizer"):
        _step(emb, {"d": tf.constant([1], tf.int64), "s": tf.constant([1], tf.int64)})
    np.testing.assert_array_equal(before, emb.embedding_tables[static].numpy())


def test_checkpoint_round_trip_of_a_mixed_embedding(tmp_path):
    emb, static, dynamic = _pair(te.optimizers.Adagrad(0.1), "sum")
    _step(emb, {"d": tf.constant([1, 2, 70], tf.int64), "s": tf.constant([1, 2, 3], tf.int64)})
    path = tf.train.Checkpoint(embedding=emb).write(str(tmp_path / "ckpt"))
    saved = _dynamic_content(emb, dynamic)
    static_saved = emb.embedding_tables[static].numpy()
    _step(emb, {"d": tf.constant([5, 71], tf.int64), "s": tf.constant([5, 6], tf.int64)})
    tf.train.Checkpoint(embedding=emb).read(path).assert_consumed()
    for a, b in zip(saved, _dynamic_content(emb, dynamic), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(static_saved, emb.embedding_tables[static].numpy())
    assert int(emb.dynamic_step.numpy()) == 1


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (tf.ragged.constant([[["a"]], [["b"]]]), "Feature f: x: a RaggedTensor feature must have ragged_rank 1, got 2"),
        (tf.constant([["a", "b"]]), "Feature f: x: dense input of rank >= 2 must have a last dimension of 1"),
    ],
)
def test_string_inputs_follow_the_static_layout_rules(ids, message):
    table = te.DynamicTableConfig("t", DIM, optimizer=te.optimizers.SGD(0.1), key_dtype=tf.string)
    emb = te.TPUEmbedding({"f": _emb.FeatureConfig(table)})
    with pytest.raises(ValueError) as info:
        emb.enqueue({"f": ids})
    assert message in str(info.value)
    assert int(emb.dynamic_tables[table].size()) == 0


def test_check_numerics_rejects_the_step_and_changes_no_table():
    static = _emb.TableConfig(V, DIM, name="static", optimizer=te.optimizers.Adagrad(0.1))
    dynamic = te.DynamicTableConfig("dynamic", DIM, optimizer=te.optimizers.Adagrad(0.1))
    emb = te.TPUEmbedding({"d": _emb.FeatureConfig(dynamic), "s": _emb.FeatureConfig(static)}, check_numerics=True)
    ids = tf.constant([1, 2], tf.int64)
    _step(emb, {"d": ids, "s": ids})
    before = {k: v.numpy() for k, v in emb.dynamic_tables[dynamic].export().items()}
    static_before = emb.embedding_tables[static].numpy()
    emb.enqueue({"d": tf.constant([1, 3], tf.int64), "s": ids})
    acts = emb.dequeue()
    bad = tf.tensor_scatter_nd_update(tf.zeros_like(acts["d"]), [[0, 1]], [float("nan")])
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN|nan|Inf|finite"):
        emb.apply_gradients({"d": bad, "s": tf.ones_like(acts["s"])})
    after = emb.dynamic_tables[dynamic].export()
    # Key 3 got its row from the training lookup; the rows and slots that existed are untouched, the step stays.
    np.testing.assert_array_equal(after["keys"].numpy(), [1, 2, 3])
    for name in ("weights", "slots"):
        kept = after[name].numpy()[:2]
        np.testing.assert_array_equal(kept, before[name])
    assert int(emb.dynamic_step.numpy()) == 1
    np.testing.assert_array_equal(emb.embedding_tables[static].numpy(), static_before)


def test_lookup_of_a_subset_of_features_with_a_string_table():
    names = te.DynamicTableConfig("names", DIM, optimizer=te.optimizers.SGD(0.1), key_dtype=tf.string)
    static = _emb.TableConfig(V, DIM, name="static", optimizer=te.optimizers.SGD(0.1))
    emb = te.TPUEmbedding({"n": _emb.FeatureConfig(names), "s": _emb.FeatureConfig(static)})
    _step(emb, {"n": tf.constant(["a", "b"]), "s": tf.constant([1, 2], tf.int64)}, target=0.0)
    only_static = emb({"s": tf.constant([1], tf.int64)})
    np.testing.assert_array_equal(only_static["s"].numpy(), emb.embedding_tables[static].numpy()[[1]])
    only_names = emb({"n": tf.constant(["b", "zzz"])})
    np.testing.assert_array_equal(only_names["n"].numpy()[1], np.zeros(DIM))
    assert int(emb.dynamic_tables[names].size()) == 2


def test_dynamic_learning_rates_are_tagged_per_group():
    rate = tf.Variable(0.5)
    other = tf.Variable(0.25)
    rows = _initial_rows()
    static = _emb.TableConfig(
        V, DIM, name="static", optimizer=te.optimizers.SGD(lambda: other), initializer=tf.constant_initializer(rows)
    )
    dynamic = te.DynamicTableConfig("dynamic", DIM, optimizer=te.optimizers.SGD(lambda: rate))
    static_twin = _emb.TableConfig(
        V, DIM, name="twin", optimizer=dynamic.optimizer, initializer=tf.constant_initializer(rows)
    )
    emb = te.TPUEmbedding(
        {"d": _emb.FeatureConfig(dynamic), "s": _emb.FeatureConfig(static), "t": _emb.FeatureConfig(static_twin)}
    )
    emb.build()
    emb.dynamic_tables[dynamic].import_(tf.range(V, dtype=tf.int64), rows)
    ids = tf.constant([0, 3, 3, 9], tf.int64)
    for value in (0.5, 0.125):
        rate.assign(value)
        _step(emb, {"d": ids, "s": ids, "t": ids}, target=0.0)
    # The twin static table shares the dynamic table's callable: both trained at the same rates.
    np.testing.assert_array_equal(_dynamic_content(emb, dynamic)[1], emb.embedding_tables[static_twin].numpy())
    # The other static table trained at its own rate (0.25, its own tag), so it differs.
    assert not np.array_equal(emb.embedding_tables[static].numpy(), emb.embedding_tables[static_twin].numpy())


@pytest.mark.parametrize("bad_rate", [-1.0, float("nan")])
@pytest.mark.parametrize("in_function", [False, True])
def test_a_rate_only_the_dynamic_op_checks_rejects_the_step_before_the_static_update(bad_rate, in_function):
    # The dynamic group's learning rate is not an input of the static op, and the static op runs first: without
    # the up-front check the static table would be updated by a step the dynamic op then rejects.
    rate = tf.Variable(0.5)
    static = _emb.TableConfig(V, DIM, name="static", optimizer=te.optimizers.SGD(0.25))
    dynamic = te.DynamicTableConfig("dynamic", DIM, optimizer=te.optimizers.SGD(lambda: rate))
    emb = te.TPUEmbedding({"d": _emb.FeatureConfig(dynamic), "s": _emb.FeatureConfig(static)})
    ids = tf.constant([1, 2], tf.int64)
    step = tf.function(_step) if in_function else _step
    step(emb, {"d": ids, "s": ids})
    dynamic_before = {k: v.numpy() for k, v in emb.dynamic_tables[dynamic].export().items()}
    static_before = emb.embedding_tables[static].numpy()
    rate.assign(bad_rate)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be finite and >= 0"):
        step(emb, {"d": ids, "s": ids})
    np.testing.assert_array_equal(emb.embedding_tables[static].numpy(), static_before)
    # The step's training lookup counted the keys (counts, last steps); the update changed nothing.
    after = emb.dynamic_tables[dynamic].export()
    for name in ("keys", "weights", "slots"):
        np.testing.assert_array_equal(after[name].numpy(), dynamic_before[name])
    assert int(emb.dynamic_step.numpy()) == 1
