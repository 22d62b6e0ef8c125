"""The feature lifecycle of dynamic tables: Bloom admission, scored eviction (L2Norm, DecayedLFU, CountAndAge,
Score) and the evicted-key stream, each against a numpy reference written from docs/dynamic_lifecycle.md, with bad
arguments that change nothing, checkpoints (also into another shard count) and the Keras config."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tests.dynamic.key_hash_reference import MASK as _MASK
from tests.dynamic.key_hash_reference import fmix64 as _fmix64
from tests.dynamic.state_util import DynamicTable, ShardedDynamicTable, config, content, train_lookup
from tf_embed_ops.dynamic import config as config_lib


def _bloom_positions(key: int, num_counters: int, num_hashes: int) -> list[int]:
    """The documented positions: double hashing over fmix64, (h1 + i * h2) mod num_counters."""
    h1 = _fmix64(key & _MASK)
    h2 = _fmix64(h1 ^ 0x9E3779B97F4A7C15) | 1
    return [((h1 + i * h2) & _MASK) % num_counters for i in range(num_hashes)]


class _Rows:
    """The numpy reference of a table's rows: key -> [count, last_step] (weights are read from the table, since
    they come from the initializer)."""

    def __init__(self):
        self.rows: dict[int, list[int]] = {}

    def see(self, keys, step, admitted):
        for k in keys:
            if k in self.rows:
                self.rows[k][0] += 1
                self.rows[k][1] = step
        for k in admitted:
            if k not in self.rows:
                self.rows[k] = [int(np.sum(np.asarray(keys) == k)), step]


def _stream(seed, steps=25, batch=16, vocab=60):
    rng = np.random.default_rng(seed)
    return [rng.zipf(1.6, batch).astype(np.int64) % vocab for _ in range(steps)]


def _keys(table) -> set[int]:
    return set(content(table)["keys"].tolist())


# ----------------------------------------------------------------------------------------------- scored eviction


def _check_threshold_policy(policy, keep_fn, seed=0):
    """Trains a seeded stream; after every step the table's own policy (explicit evict) must keep exactly the
    rows the reference rule keeps."""
    table = DynamicTable(config(eviction=policy, initializer=tf.keras.initializers.RandomUniform(-0.6, 0.6)))
    for step, batch in enumerate(_stream(seed)):
        train_lookup(table, batch, step)
        c = content(table)
        norms = np.sqrt(np.sum(c["weights"].astype(np.float64) ** 2, axis=1))
        expected = {
            int(k)
            for k, n, last, norm in zip(c["keys"], c["counts"], c["last_steps"], norms, strict=True)
            if keep_fn(n, last, norm, step)
        }
        table.evict(step=step)
        assert _keys(table) == expected, f"step {step}"
    return table


def test_l2_norm_keeps_the_rows_the_reference_keeps():
    threshold = np.float32(0.5)  # the op's attribute is a float32
    _check_threshold_policy(te.dynamic.L2Norm(0.5), lambda n, last, norm, step: not norm < threshold)


def test_count_and_age_keeps_the_rows_the_reference_keeps():
    _check_threshold_policy(
        te.dynamic.CountAndAge(3, 2), lambda n, last, norm, step: not (n < 3 and step - last > 2), seed=1
    )


def test_decayed_lfu_keeps_the_rows_the_reference_keeps():
    decay = float(np.float32(0.7))
    table = DynamicTable(config(eviction=te.dynamic.DecayedLFU(12, 0.7)))
    state: dict[int, tuple[float, int]] = {}  # key -> (decayed count, count at the previous round)
    for step, batch in enumerate(_stream(2)):
        train_lookup(table, batch, step)
        c = content(table)
        order, nxt = [], {}
        for k, n, last in zip(c["keys"].tolist(), c["counts"].tolist(), c["last_steps"].tolist(), strict=True):
            d, seen = state.get(k, (0.0, 0))
            d = float(np.float32(d * decay + (n - seen)))
            nxt[k] = (d, n)
            order.append((d, last, k))
        order.sort()
        keep = {k for _, _, k in order[max(0, len(order) - 12) :]}
        state = {k: nxt[k] for k in keep}
        table.evict(step=step)
        assert _keys(table) == keep, f"step {step}"


def test_score_keeps_the_highest_scores_ties_by_key():
    def score(count, last_step, norm, step):
        return count - 0.5 * (step - last_step)

    table = DynamicTable(config(eviction=te.dynamic.Score(score, max_rows=10)))
    for step, batch in enumerate(_stream(3)):
        train_lookup(table, batch, step)
        c = content(table)
        s = c["counts"].astype(np.float32) - np.float32(0.5) * (np.float32(step) - c["last_steps"].astype(np.float32))
        order = sorted(zip(s.tolist(), c["last_steps"].tolist(), c["keys"].tolist(), strict=True))
        keep = {k for _, _, k in order[max(0, len(order) - 10) :]}
        table.evict(step=step)
        assert _keys(table) == keep, f"step {step}"


def test_score_expression_equals_the_same_callable():
    expr = te.dynamic.Score("log1p(count) - 0.1 * (step - last_step) + maximum(norm, 0.5)", max_rows=5)
    counts, last, norm = (tf.constant([1.0, 4.0, 9.0]), tf.constant([0.0, 2.0, 5.0]), tf.constant([0.1, 1.0, 2.0]))
    step = tf.fill([3], 6.0)
    want = np.log1p([1.0, 4.0, 9.0]) - 0.1 * (6.0 - np.array([0.0, 2.0, 5.0])) + np.maximum([0.1, 1.0, 2.0], 0.5)
    np.testing.assert_allclose(expr.fn(counts, last, norm, step).numpy(), want, rtol=1e-6)
    for bad in ("__import__('os')", "count.real", "open('x')", "count if step else norm", "lambda: 1", "("):
        with pytest.raises(ValueError, match="Score"):
            te.dynamic.Score(bad, max_rows=5)


def test_score_runs_after_every_training_step():
    """te.TPUEmbedding: the engine runs the score's round after each update (the core does not know the fn)."""
    table = config(name="scored", eviction=te.dynamic.Score("count", max_rows=3), optimizer="sgd")
    feature = tf.tpu.experimental.embedding.FeatureConfig(table=table, name="f")
    emb = te.TPUEmbedding(feature, te.optimizers.SGD(0.1))
    emb.build()
    rows: dict[int, tuple[int, int]] = {}  # key -> (count, last step)
    for step, batch in enumerate(([1, 1, 1, 2, 3, 4], [2, 2, 5], [6], [4, 4, 4, 4])):
        ids = tf.constant(batch, tf.int64)
        emb.enqueue(ids, training=True)
        acts = emb.dequeue()
        emb.apply_gradients(tf.nest.map_structure(tf.ones_like, acts))
        for k in batch:
            rows[k] = (rows.get(k, (0, 0))[0] + 1, step)
        kept = sorted(rows.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0]))[-3:]
        rows = dict(kept)
        assert set(content(emb.dynamic_tables[table])["keys"].tolist()) == set(rows), f"step {step}"


# --------------------------------------------------------------------------------------------- Bloom admission


@pytest.mark.parametrize("bits", [4, 8, 16])
def test_bloom_admission_matches_the_counting_reference(bits):
    m, k, t = 97, 2, 3  # a small filter: collisions (false admissions) do happen
    table = DynamicTable(config(admission=te.dynamic.BloomAdmission(t, m, num_hashes=k, counter_bits=bits)))
    counters = np.zeros(m, np.int64)
    admitted: set[int] = set()
    cap = 2**bits - 1
    for step, batch in enumerate(_stream(4, steps=30, vocab=200)):
        misses: dict[int, int] = {}
        for key in batch.tolist():
            if key not in admitted:
                misses[key] = misses.get(key, 0) + 1
        for key, n in misses.items():
            for p in _bloom_positions(key, m, k):
                counters[p] += n
        counters = np.minimum(counters, cap)
        for key in misses:
            if min(counters[p] for p in _bloom_positions(key, m, k)) >= t:
                admitted.add(key)
        train_lookup(table, batch, step)
        assert _keys(table) == admitted, f"step {step}"
    assert int(table.stats()["untracked"]) == 0


def test_bloom_memory_is_fixed_and_counts_no_pending_keys():
    admission = te.dynamic.BloomAdmission(2, 1 << 16, num_hashes=3, counter_bits=4)
    table = DynamicTable(config(admission=admission, max_rows=100000, initial_capacity=1024))
    train_lookup(table, [1], 0)
    before = int(table.stats()["memory_bytes"])
    train_lookup(table, np.arange(10**6, 10**6 + 5000, dtype=np.int64), 1)  # 5000 one-off ids
    assert int(table.stats()["memory_bytes"]) == before  # the 1024 allocated rows hold the few false admissions
    assert int(table.stats()["size"]) < 100
    assert content(table)["pending_keys"].size == 0
    assert admission.memory_bytes == (1 << 16) // 2


# ----------------------------------------------------------------------------------------- evicted-key stream


def test_evicted_keys_reports_each_eviction_once_with_its_step():
    table = DynamicTable(config(eviction=te.dynamic.TTL(1)))
    train_lookup(table, [1, 2, 3], 0)
    train_lookup(table, [2], 1)
    assert int(table.evict(step=2)) == 2
    keys, steps = table.evicted_keys()
    assert sorted(zip(keys.numpy().tolist(), steps.numpy().tolist(), strict=True)) == [(1, 2), (3, 2)]
    assert table.evicted_keys()[0].numpy().size == 0  # since the previous call: nothing
    table.step.assign(5)
    table.evict_keys(tf.constant([2, 99], tf.int64))
    keys, steps = table.evicted_keys()
    assert keys.numpy().tolist() == [2]


def test_evicted_keys_with_refused_admissions():
    table = DynamicTable(config(admission=te.dynamic.FrequencyAdmission(2, log_refused=True)))
    train_lookup(table, [7, 8, 8], 3)
    assert table.evicted_keys()[0].numpy().size == 0
    train_lookup(table, [9], 4)
    keys, steps = table.evicted_keys(include_refused=True)
    assert keys.numpy().tolist() == [9] and steps.numpy().tolist() == [4]


def test_a_reader_that_fell_behind_gets_a_clear_error_and_can_skip():
    table = DynamicTable(config(eviction_log_capacity=3))
    train_lookup(table, [1, 2, 3, 4, 5], 0)
    table.evict_keys(tf.constant([1, 2, 3, 4, 5], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="'t'.*fell behind.*eviction_log_capacity"):
        table.evicted_keys()
    keys, _ = table.evicted_keys(strict=False)
    assert keys.numpy().tolist() == [3, 4, 5]  # the newest three
    assert table.evicted_keys()[0].numpy().size == 0


def test_restore_restarts_the_stream_without_an_error(tmp_path):
    table = DynamicTable(config(eviction=te.dynamic.TTL(1)))
    train_lookup(table, [1, 2], 0)
    path = tf.train.Checkpoint(t=table).write(str(tmp_path / "c"))
    table.evict(step=5)
    tf.train.Checkpoint(t=table).read(path).assert_consumed()
    assert table.evicted_keys()[0].numpy().size == 0  # what happened before the restore is not reported
    table.evict(step=5)
    assert sorted(table.evicted_keys()[0].numpy().tolist()) == [1, 2]


def test_sharded_evicted_keys_is_the_union_of_the_shards():
    sharded = ShardedDynamicTable(config(), 3)
    for shard in sharded.shards:
        shard.import_(tf.range(20, dtype=tf.int64), tf.zeros([20, 4]))
    for shard in sharded.shards:
        shard.evict_keys(tf.constant([3, 11], tf.int64))
    assert sorted(sharded.evicted_keys()[0].numpy().tolist()) == [3, 3, 3, 11, 11, 11]


# ------------------------------------------------------------------------------------------------ bad arguments


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: te.dynamic.L2Norm(-0.1), "min_norm"),
        (lambda: te.dynamic.L2Norm(float("nan")), "min_norm"),
        (lambda: te.dynamic.DecayedLFU(10, 0.0), "decay"),
        (lambda: te.dynamic.DecayedLFU(10, 1.5), "decay"),
        (lambda: te.dynamic.DecayedLFU(0, 0.5), "max_rows"),
        (lambda: te.dynamic.CountAndAge(0, 3), "min_count"),
        (lambda: te.dynamic.CountAndAge(2, -1), "max_age_steps"),
        (lambda: te.dynamic.Score(3, max_rows=1), "fn"),
        (lambda: te.dynamic.Score("count", max_rows=-1), "max_rows"),
        (lambda: te.dynamic.BloomAdmission(2, 100, counter_bits=5), "counter_bits"),
        (lambda: te.dynamic.BloomAdmission(16, 100, counter_bits=4), "min_count"),
        (lambda: te.dynamic.BloomAdmission(2, 0), "num_counters"),
        (lambda: te.dynamic.BloomAdmission(2, 100, num_hashes=17), "num_hashes"),
        (lambda: config(eviction_log_capacity=0), "eviction_log_capacity"),
        (lambda: config(eviction=te.dynamic.Score("count", max_rows=5000)), "more than max_rows"),
    ],
)
def test_bad_arguments_name_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def _scored_table():
    table = DynamicTable(config())
    train_lookup(table, [1, 2, 3, 4], 0)
    return table, content(table)


@pytest.mark.parametrize(
    "fn, match",
    [
        (lambda count, last, norm, step: tf.cast(count, tf.float64), "dtype float64"),
        (lambda count, last, norm, step: tf.stack([count, count]), "shape"),
        (lambda count, last, norm, step: count[:2], "2 scores for 4 rows"),
        (lambda count, last, norm, step: count / 0.0 * 0.0, "not finite"),
    ],
)
def test_a_bad_score_names_the_table_and_evicts_nothing(fn, match):
    table, before = _scored_table()
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=f"'t'.*{match}|{match}.*'t'"):
        table.evict(te.dynamic.Score(fn, max_rows=1), step=1)
    after = content(table)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert table.evicted_keys()[0].numpy().size == 0


def test_explicit_decayed_lfu_needs_the_tables_own_policy():
    table, before = _scored_table()
    with pytest.raises(tf.errors.InvalidArgumentError, match="'t'.*DecayedLFU"):
        table.evict(te.dynamic.DecayedLFU(1, 0.5), step=1)
    np.testing.assert_array_equal(content(table)["keys"], before["keys"])


# -------------------------------------------------------------------------------------------------- checkpoints


def test_bloom_counters_round_trip_and_reshard(tmp_path):
    admission = te.dynamic.BloomAdmission(3, 4096, num_hashes=2, counter_bits=4)
    table = DynamicTable(config(admission=admission))
    train_lookup(table, [5, 5, 6, 7, 7], 0)  # 5 and 7 have estimate 2: one more sighting admits them
    path = tf.train.Checkpoint(t=table).write(str(tmp_path / "c"))
    fresh = DynamicTable(config(admission=admission))
    tf.train.Checkpoint(t=fresh).read(path).assert_consumed()
    train_lookup(fresh, [5, 6], 1)
    assert _keys(fresh) == {5}
    # Into three shards: each shard takes the whole saved filter (one part), so the estimates carry over.
    sharded = ShardedDynamicTable(config(admission=admission), 3)
    tf.train.Checkpoint(t=sharded).read(path).assert_consumed()
    owner = int(te.dynamic.shard_of_keys(tf.constant([7], tf.int64), 3).numpy()[0])
    train_lookup(sharded.shards[owner], [7], 1)
    assert 7 in _keys(sharded.shards[owner])
    # Back from three shards into one: the filters are added.
    path3 = tf.train.Checkpoint(t=sharded).write(str(tmp_path / "c3"))
    one = DynamicTable(config(admission=admission))
    tf.train.Checkpoint(t=one).read(path3).assert_consumed()
    train_lookup(one, [6], 2)  # 6: 1 saved sighting in each of 3 filters -> 3 + 1
    assert 6 in _keys(one)


def test_decayed_counts_round_trip(tmp_path):
    policy = te.dynamic.DecayedLFU(100, 0.5)
    table = DynamicTable(config(eviction=policy))
    train_lookup(table, [1, 1, 1, 2], 0)
    table.evict(step=0)
    train_lookup(table, [2], 1)
    table.evict(step=1)
    path = tf.train.Checkpoint(t=table).write(str(tmp_path / "c"))
    for shards in (1, 2):
        other = (
            DynamicTable(config(eviction=policy)) if shards == 1 else ShardedDynamicTable(config(eviction=policy), 2)
        )
        tf.train.Checkpoint(t=other).read(path).assert_consumed()
        state = other._serialize_to_tensors()
        assert state["decayed_keys"].numpy().tolist() == [1, 2]
        np.testing.assert_array_equal(state["decayed_counts"].numpy(), [1.5, 1.5])


# ------------------------------------------------------------------------------------------------------- Keras


def test_keras_get_config_round_trip_keeps_the_policies():
    table = config(
        name="users",
        admission=te.dynamic.BloomAdmission(3, 1 << 12, num_hashes=2, counter_bits=4, log_refused=True),
        eviction=te.dynamic.Score("log1p(count) - (step - last_step)", max_rows=100),
        eviction_log_capacity=77,
    )
    layer = te.keras.TPUEmbedding({"u": tf.tpu.experimental.embedding.FeatureConfig(table)})
    rebuilt = te.keras.TPUEmbedding.from_config(json.loads(json.dumps(layer.get_config())))
    (copy,) = rebuilt.dynamic_tables
    assert config_lib.handle_attrs(copy) == config_lib.handle_attrs(table)
    assert repr(copy) == repr(table).replace(repr(table.optimizer), repr(copy.optimizer))
    for policy in (te.dynamic.DecayedLFU(9, 0.25), te.dynamic.L2Norm(0.5), te.dynamic.CountAndAge(2, 3)):
        t = config(name="x", eviction=policy)
        layer = te.keras.TPUEmbedding({"x": tf.tpu.experimental.embedding.FeatureConfig(t)})
        (copy,) = te.keras.TPUEmbedding.from_config(json.loads(json.dumps(layer.get_config()))).dynamic_tables
        assert repr(copy.eviction) == repr(policy)


def test_keras_get_config_refuses_a_score_callable_naming_the_table():
    table = config(name="users", eviction=te.dynamic.Score(lambda c, last, n, s: c, max_rows=10))
    layer = te.keras.TPUEmbedding({"u": tf.tpu.experimental.embedding.FeatureConfig(table)})
    with pytest.raises(ValueError, match="'users'.*callable.*expression"):
        layer.get_config()


# ------------------------------------------------------------------------------------ te.distribute, tf.function


def test_sharded_embedding_runs_the_score_on_every_shard():
    from tf_embed_ops.distribute import ShardedTPUEmbedding

    table = config(name="users", eviction=te.dynamic.Score("count", max_rows=2), optimizer="sgd")
    emb = ShardedTPUEmbedding({"u": tf.tpu.experimental.embedding.FeatureConfig(table)}, num_shards=2)
    rows: list[dict[int, tuple[int, int]]] = [{}, {}]  # per shard: key -> (count, last step)
    stream = [[1, 1, 2, 3, 4, 5, 6], [7, 8, 8, 2, 9], [10, 11, 12, 1]]
    for step, batch in enumerate(stream):
        emb.enqueue({"u": tf.constant(batch, tf.int64)})
        with tf.GradientTape() as tape:
            acts = emb.dequeue()
            tape.watch(acts)
            loss = tf.reduce_sum(acts["u"])
        emb.apply_gradients(tape.gradient(loss, acts))
        shard_of = te.dynamic.shard_of_keys(tf.constant(batch, tf.int64), 2).numpy()
        for k, s in zip(batch, shard_of, strict=True):
            rows[s][k] = (rows[s].get(k, (0, 0))[0] + 1, step)
        for s in range(2):
            rows[s] = dict(sorted(rows[s].items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0]))[-2:])
        shards = emb.dynamic_tables[table].shards
        for s in range(2):
            assert _keys(shards[s]) == set(rows[s]), f"step {step} shard {s}"


def test_evicted_keys_in_a_tf_function():
    table = DynamicTable(config(eviction=te.dynamic.CountAndAge(2, 0)))
    train_lookup(table, [1, 2, 2], 0)

    @tf.function
    def round_and_read(step):
        with tf.control_dependencies([table.evict(step=step)]):
            return table.evicted_keys()

    keys, steps = round_and_read(tf.constant(1, tf.int64))
    assert keys.numpy().tolist() == [1] and steps.numpy().tolist() == [1]
    assert round_and_read(tf.constant(2, tf.int64))[0].numpy().size == 0


def test_keras_save_and_load_keep_the_policies_and_their_state(tmp_path):
    import keras

    table = te.DynamicTableConfig(
        "users",
        4,
        optimizer=te.optimizers.Adagrad(0.1),
        combiner="sum",
        admission=te.dynamic.BloomAdmission(2, 1 << 10, num_hashes=2, counter_bits=8),
        eviction=te.dynamic.DecayedLFU(100, 0.5),
        seed=1,
    )
    layer = te.keras.TPUEmbedding({"u": tf.tpu.experimental.embedding.FeatureConfig(table)})
    ids = keras.Input(shape=(None,), dtype="int64", ragged=True)
    model = keras.Model(ids, keras.layers.Dense(1)(layer({"u": ids})["u"]))
    model.compile(keras.optimizers.SGD(0.1), "mse")
    x = tf.ragged.constant([[1, 2], [2, 3], [3], [2, 5]], tf.int64)
    model.fit(x, np.ones((4, 1), np.float32), batch_size=4, epochs=2, verbose=0)
    model.save(str(tmp_path / "m.keras"))
    loaded = keras.models.load_model(str(tmp_path / "m.keras"))
    (loaded_layer,) = [x for x in loaded.layers if isinstance(x, te.keras.TPUEmbedding)]
    (copy,) = loaded_layer.dynamic_tables
    assert repr(copy.admission) == repr(table.admission) and repr(copy.eviction) == repr(table.eviction)
    a = layer.dynamic_tables[table]._serialize_to_tensors()
    b = loaded_layer.dynamic_tables[copy]._serialize_to_tensors()
    for name in ("keys", "bloom_counters", "decayed_keys", "decayed_counts"):
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy(), err_msg=name)
    assert a["bloom_counters"].numpy().sum() > 0


def test_bloom_refusals_are_logged_when_asked():
    admission = te.dynamic.BloomAdmission(2, 1 << 12, num_hashes=2, counter_bits=4, log_refused=True)
    table = DynamicTable(config(admission=admission))
    train_lookup(table, [4, 5, 5], 3)  # 5 reaches 2: admitted; 4 refused
    keys, steps = table.evicted_keys(include_refused=True)
    assert keys.numpy().tolist() == [4] and steps.numpy().tolist() == [3]
    assert _keys(table) == {5}


def test_decayed_lfu_through_training_steps_keeps_the_reference_rows():
    """te.TPUEmbedding: the fused update's end of step runs the decay round (one per step) and the eviction."""
    table = config(name="d", eviction=te.dynamic.DecayedLFU(3, 0.5), optimizer="sgd")
    emb = te.TPUEmbedding(tf.tpu.experimental.embedding.FeatureConfig(table=table, name="f"), te.optimizers.SGD(0.1))
    emb.build()
    state: dict[int, tuple[float, int, int, int]] = {}  # key -> (decayed, count, seen at the last round, last step)
    for step, batch in enumerate(([1, 1, 1, 2, 3, 4], [2, 2, 5], [6, 6, 6, 6], [1, 7])):
        emb.enqueue(tf.constant(batch, tf.int64), training=True)
        acts = emb.dequeue()
        emb.apply_gradients(tf.nest.map_structure(tf.ones_like, acts))
        for k in batch:
            d, n, seen, _ = state.get(k, (0.0, 0, 0, step))
            state[k] = (d, n + 1, seen, step)
        rounds = {k: (d * 0.5 + (n - seen), n, n, last) for k, (d, n, seen, last) in state.items()}
        kept = sorted(rounds.items(), key=lambda kv: (kv[1][0], kv[1][3], kv[0]))[-3:]
        state = dict(kept)
        assert _keys(emb.dynamic_tables[table]) == set(state), f"step {step}"


@pytest.mark.parametrize(
    "text, match",
    [
        ("-" * 100000 + "count", "MAX_SCORE_EXPRESSION_CHARS = 1000"),
        ("+".join(["count"] * 100000), "MAX_SCORE_EXPRESSION_CHARS = 1000"),
        ("+".join(["count"] * 100), "MAX_SCORE_EXPRESSION_DEPTH = 64"),
        ("-" * 200 + "count", "MAX_SCORE_EXPRESSION_DEPTH = 64"),
        ("(" * 300 + "count" + ")" * 300, "Score: "),
        ("log(count, 2)", r"log\(\) takes 1 argument; got 2"),
        ("log1p()", r"log1p\(\) takes 1 argument; got 0"),
        ("maximum(count)", r"maximum\(\) takes 2 arguments; got 1"),
        ("minimum(count, norm, step)", r"minimum\(\) takes 2 arguments; got 3"),
    ],
)
def test_score_refuses_long_deep_and_wrong_arity_expressions(text, match):
    with pytest.raises(ValueError, match=match):
        te.dynamic.Score(text, max_rows=5)


def test_score_accepts_expressions_at_its_limits():
    at_depth = te.dynamic.Score("+".join(["count"] * 64), max_rows=5)  # 63 additions: within the depth
    np.testing.assert_allclose(at_depth.fn(*[tf.constant([2.0])] * 4).numpy(), [128.0])
    long_text = "count" + " " * (1000 - len("count"))
    assert te.dynamic.Score(long_text, max_rows=5).expression == long_text
