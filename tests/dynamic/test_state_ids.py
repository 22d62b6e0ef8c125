"""`DynamicTable.lookup`, `find` and `evict_keys` take ids of any integer dtype for an int64-keyed table (as
`te.TPUEmbedding` does) and strings for a string table; anything else is refused naming the table, and the
table is unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.dynamic.state_util import ShardedDynamicTable, config, content
from tf_embed_ops.dynamic.table import DynamicTable

KEYS = np.array([-3, 1, 2, 70000], np.int64)


def _table(shards=1, key_dtype=tf.int64):
    cfg = config(name="users", key_dtype=key_dtype)
    table = DynamicTable(cfg) if shards == 1 else ShardedDynamicTable(cfg, shards)
    parts = [table] if shards == 1 else list(table.shards)
    rows = np.arange(len(KEYS) * 4, dtype=np.float32).reshape(len(KEYS), 4)
    if key_dtype == tf.int64:
        for part in parts:
            mine = part.check_ids(KEYS)  # int64 in, int64 out
            from tf_embed_ops.dynamic.sharding import shard_of_keys

            keep = shard_of_keys(mine, part.num_shards).numpy() == part.shard_index
            part.import_(KEYS[keep], rows[keep])
    return table, dict(zip(KEYS.tolist(), rows, strict=True))


@pytest.mark.parametrize(
    "ids",
    [
        [1, 2],
        np.array([1, 2], np.int32),
        np.array([1, 2], np.int16),
        np.array([1, 2], np.uint8),
        tf.constant([1, 2], tf.int32),
        tf.constant([[1], [2]], tf.int32),
    ],
    ids=["list", "np_int32", "np_int16", "np_uint8", "tf_int32", "tf_int32_2d"],
)
@pytest.mark.parametrize("shards", [1, 2])
def test_lookup_takes_any_integer_ids(ids, shards):
    table, rows = _table(shards)
    got = table.lookup(ids).numpy()
    flat = np.asarray(ids.numpy() if isinstance(ids, tf.Tensor) else ids).reshape(-1)
    want = np.stack([rows.get(int(k), np.zeros(4, np.float32)) for k in flat])
    np.testing.assert_array_equal(got.reshape(-1, 4), want)
    assert got.shape == (*np.shape(ids), 4)


def test_find_and_evict_keys_take_int32_ids():
    table, _ = _table()
    found = table.find(tf.constant([1, 5, 2], tf.int32)).numpy()
    assert found[1] == -1 and found[0] >= 0 and found[2] >= 0
    assert int(table.evict_keys(np.array([1, 5], np.int32))) == 1
    assert sorted(content(table)["keys"].tolist()) == [-3, 2, 70000]
    assert int(table.evict_keys([2])) == 1


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([1.0, 2.0], r"ids have dtype float32; the table's key_dtype is int64, so ids must be integers"),
        (np.array([1.5]), r"ids have dtype float64"),
        (["a"], r"ids have dtype string; .* must be integers"),
        (tf.ragged.constant([[1], [2, 3]]), r"ids must be a dense tensor, got RaggedTensor"),
    ],
)
@pytest.mark.parametrize("method", ["lookup", "find", "evict_keys"])
def test_non_integer_ids_are_refused_naming_the_table_and_change_nothing(ids, match, method):
    table, _ = _table()
    before = content(table)
    with pytest.raises(ValueError, match=rf"DynamicTable 'users': {match}"):
        getattr(table, method)(ids)
    for k, v in before.items():
        np.testing.assert_array_equal(content(table)[k], v)


@pytest.mark.parametrize("ids", [[1, 2], tf.constant([1.0])], ids=["ints", "floats"])
def test_a_string_table_takes_strings_only(ids):
    table, _ = _table(key_dtype=tf.string)
    with pytest.raises(
        ValueError, match=r"DynamicTable 'users': ids have dtype .*key_dtype is string, so ids must be strings"
    ):
        table.lookup(ids)
    assert table.lookup(["a", "b"]).shape == (2, 4)
