"""`DynamicTable`: its resource, serving lookup, statistics, explicit eviction, import/export, and bad input."""

from __future__ import annotations

import glob

import numpy as np
import pytest
import tensorflow as tf

from tests.dynamic.state_util import DynamicTable, ShardedDynamicTable, config, content, random_content, train_lookup
from tf_embed_ops.dynamic import LFU, LRU, TTL, FrequencyAdmission
from tf_embed_ops.dynamic.table import restrict_to_shard


def _stats(table):
    return {k: int(v.numpy()) for k, v in table.stats().items()}


def test_serving_lookup_reads_rows_and_zeros_and_never_inserts():
    table = DynamicTable(config(dim=3))
    c = random_content(np.random.default_rng(0), 20, 3, table.num_slots)
    table.import_(**c)
    rows = dict(zip(c["keys"].tolist(), c["weights"], strict=True))
    query = np.array([[c["keys"][3], 12345], [-7, c["keys"][0]]], np.int64)
    got = table.lookup(query).numpy()
    want = np.stack([rows.get(int(k), np.zeros(3, np.float32)) for k in query.ravel()]).reshape(2, 2, 3)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(table.find(query).numpy() >= 0, [[True, False], [False, True]])
    assert _stats(table)["size"] == 20
    np.testing.assert_array_equal(content(table)["keys"], c["keys"])


def test_stats_count_inserts_refusals_and_the_last_step():
    table = DynamicTable(config(admission=FrequencyAdmission(2, max_pending_keys=3), max_rows=4, initial_capacity=2))
    # Step 0: key 1 twice (admitted), keys 2, 3, 4 once (below admission, counted).
    train_lookup(table, np.array([1, 1, 2, 3, 4], np.int64), step=0)
    s = _stats(table)
    assert (s["size"], s["inserts"], s["below_admission"], s["untracked"]) == (1, 1, 3, 0)
    assert s["refused"] == s["below_admission"] + s["untracked"] == 3
    assert (s["last_step_inserts"], s["last_step_refused"]) == (1, 0)  # the op's last_step_refused: for space
    # Step 1: 2, 3, 4 seen again (admitted: 3 more rows, table full at 4); 5 has no counter free: untracked.
    train_lookup(table, np.array([2, 3, 4, 5], np.int64), step=1)
    s = _stats(table)
    assert (s["size"], s["inserts"], s["last_step_inserts"]) == (4, 4, 3)
    # Step 2: 6 twice is admitted but the table is full.
    train_lookup(table, np.array([6, 6], np.int64), step=2)
    s = _stats(table)
    assert (s["size"], s["refused_full"], s["evictions"], s["last_step_refused"]) == (4, 1, 0, 1)
    assert s["capacity"] >= s["size"] and s["memory_bytes"] > 0


def test_write_summaries_logs_every_counter(tmp_path):
    table = DynamicTable(config(name="users"))
    train_lookup(table, np.array([1, 2, 3], np.int64), step=0)
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        table.write_summaries(step=4)
    writer.flush()
    tags = {}
    for path in glob.glob(str(tmp_path / "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                tags[v.tag] = (event.step, float(tf.make_ndarray(v.tensor)))
    assert tags["dynamic_tables/users/size"] == (4, 3.0)
    assert tags["dynamic_tables/users/inserts"] == (4, 3.0)
    assert {t.rsplit("/", 1)[1] for t in tags} == set(table.stats())


@pytest.mark.parametrize(
    "policy, evicted",
    [
        (LRU(3), [10, 11]),  # oldest last steps (0, 1) go; ties would go by key
        (LFU(3), [12, 14]),  # lowest counts (1, 1): 12 is older than 14
        (TTL(2), [10, 11, 12]),  # at step 5: last steps 0, 1, 2 are more than 2 steps old
    ],
)
def test_explicit_eviction(policy, evicted):
    table = DynamicTable(config())
    keys = np.array([10, 11, 12, 13, 14], np.int64)
    table.import_(
        keys,
        np.ones([5, 4], np.float32),
        counts=np.array([5, 4, 1, 9, 1], np.int64),
        last_steps=np.array([0, 1, 2, 4, 4], np.int64),
    )
    table.step.assign(5)
    n = int(table.evict(policy).numpy())
    assert n == len(evicted)
    np.testing.assert_array_equal(content(table)["keys"], np.setdiff1d(keys, evicted))
    assert _stats(table)["evictions"] == n


def test_evict_without_a_policy_uses_the_table_s_own_and_refuses_when_there_is_none():
    with_policy = DynamicTable(config(eviction=LRU(1)))
    with_policy.import_(np.array([1, 2], np.int64), np.ones([2, 4], np.float32), last_steps=np.array([3, 1]))
    assert int(with_policy.evict().numpy()) == 1
    np.testing.assert_array_equal(content(with_policy)["keys"], [1])
    without = DynamicTable(config(name="plain"))
    without.import_(np.array([1, 2], np.int64), np.ones([2, 4], np.float32))
    with pytest.raises(ValueError, match="'plain'.*needs a policy"):
        without.evict()
    with pytest.raises(ValueError, match="'plain'.*LRU, LFU, TTL, L2Norm, DecayedLFU, CountAndAge or Score"):
        without.evict("lru")
    assert _stats(without)["size"] == 2


def test_evict_keys():
    table = DynamicTable(config())
    table.import_(np.array([1, 2, 3], np.int64), np.ones([3, 4], np.float32))
    assert int(table.evict_keys(tf.constant([2, 9], tf.int64)).numpy()) == 1
    np.testing.assert_array_equal(content(table)["keys"], [1, 3])


def test_import_fills_in_a_fresh_row_s_slots_count_and_step():
    table = DynamicTable(config(optimizer="adagrad"))  # slot initial value 0.25
    table.step.assign(6)
    table.import_(np.array([5, -5], np.int64), np.full([2, 4], 2.0, np.float32))
    c = content(table)
    np.testing.assert_array_equal(c["keys"], [-5, 5])
    np.testing.assert_array_equal(c["slots"], np.full([2, 4], 0.25, np.float32))
    np.testing.assert_array_equal(c["counts"], [1, 1])
    np.testing.assert_array_equal(c["last_steps"], [6, 6])
    assert c["pending_keys"].shape == (0,)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"weights": np.ones([2, 5], np.float32)}, "dim 5 but the table has dim 4"),
        ({"slots": np.ones([2, 8], np.float32)}, r"slots are 8 values per row but the table's optimizer keeps 4"),
        ({"slots": np.ones([1, 2, 3], np.float32)}, r"slots must be \[n, 4\]"),
    ],
)
def test_bad_import_is_refused_naming_the_table_and_changes_nothing(kwargs, match):
    table = DynamicTable(config(name="items"))
    c = random_content(np.random.default_rng(1), 7, 4, 1)
    table.import_(**c)
    args = {"keys": np.array([1, 2], np.int64), "weights": np.ones([2, 4], np.float32), **kwargs}
    with pytest.raises(ValueError, match=f"DynamicTable 'items'.*{match}"):
        table.import_(**args)
    for k, v in content(table).items():
        np.testing.assert_array_equal(v, c[k])


def test_ids_of_the_wrong_dtype_are_refused_naming_the_table():
    table = DynamicTable(config(name="items"))
    table.import_(np.array([1], np.int64), np.ones([1, 4], np.float32))
    for call in (table.lookup, table.find, table.evict_keys):
        with pytest.raises(ValueError, match="'items'.*string.*int64"):
            call(tf.constant(["1"]))
    assert _stats(table)["size"] == 1


@pytest.mark.parametrize("num_shards, shard_index", [(0, 0), (2, 2), (2, -1)])
def test_bad_shard_arguments_are_refused(num_shards, shard_index):
    with pytest.raises(ValueError, match="'t'"):
        DynamicTable(config(), num_shards=num_shards, shard_index=shard_index)


def test_sharded_table_looks_up_each_key_in_its_shard_and_sums_stats():
    cfg = config()
    c = random_content(np.random.default_rng(2), 50, 4, 1)
    whole = DynamicTable(cfg)
    whole.import_(**c)
    sharded = ShardedDynamicTable(cfg, 3)
    for shard in sharded.shards:
        part = restrict_to_shard({k: tf.constant(v) for k, v in c.items()}, 3, shard.shard_index)
        shard.import_(**part)
    query = np.concatenate([c["keys"][::3], [7, 8]])
    np.testing.assert_array_equal(sharded.lookup(query).numpy(), whole.lookup(query).numpy())
    assert int(sharded.stats()["size"].numpy()) == 50
    for k, v in content(sharded).items():
        np.testing.assert_array_equal(v, c[k])


def test_two_tables_of_one_config_are_two_resources():
    cfg = config()
    a, b = DynamicTable(cfg), DynamicTable(cfg)
    a.import_(np.array([1], np.int64), np.ones([1, 4], np.float32))
    assert _stats(b)["size"] == 0
