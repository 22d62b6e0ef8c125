"""One eviction record per dynamic table (cc/lib/eviction_log.h): `evicted_keys()` and the touched-row tracker
(which the serving publisher and incremental checkpoints read) see the same entries under one bound,
`eviction_log_capacity`, and one overflow rule: a reader that fell behind is told (an error, or `full`), never
handed a partial list. Also what `stats()["memory_bytes"]` counts of the per-key structures."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tests.dynamic.state_util import DynamicTable, config, train_lookup
from tf_embed_ops import tracking


def _embedding(capacity):
    table = te.DynamicTableConfig("items", 4, max_rows=100, eviction_log_capacity=capacity)
    emb = te.TPUEmbedding({"f": tf.tpu.experimental.embedding.FeatureConfig(table, name="f")}, te.optimizers.SGD(0.1))
    emb.build()
    return emb, emb.dynamic_tables[table]


def test_the_tracker_and_evicted_keys_read_one_record_with_one_bound():
    emb, table = _embedding(capacity=4)
    table.import_(tf.range(10, dtype=tf.int64), tf.ones([10, 4]))
    tracker = tracking.Tracker(emb)
    cursor = tracker.cursor()
    table.evict_keys([1, 2])
    changes = tracker.changed_since(cursor)
    assert not changes.tables["items"].full
    assert changes.tables["items"].evicted.tolist() == [1, 2]
    keys, _ = table.evicted_keys()
    assert keys.numpy().tolist() == [1, 2]
    later = changes.cursor
    table.evict_keys([3, 4, 5])  # 5 entries in a record of 4: key 1's is dropped for every reader
    behind = tracker.changed_since(cursor).tables["items"]
    assert behind.full and behind.evicted.size == 0  # the whole table, not a list missing key 1
    assert sorted(behind.rows.tolist()) == [0, 6, 7, 8, 9]
    assert tracker.changed_since(later).tables["items"].evicted.tolist() == [3, 4, 5]
    keys, _ = table.evicted_keys()  # this cursor had read 1 and 2: nothing it needed was dropped
    assert keys.numpy().tolist() == [3, 4, 5]
    table.evict_keys([6, 7, 8, 9, 0])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'items': evicted_keys\(\) fell behind"):
        table.evicted_keys()


def test_memory_bytes_counts_the_pending_admission_counts():
    table = DynamicTable(config(admission=te.dynamic.FrequencyAdmission(2, max_pending_keys=1 << 20)))
    before = int(table.stats()["memory_bytes"])
    train_lookup(table, np.arange(100_000, dtype=np.int64) + 1000, 0)
    assert int(table.stats()["size"]) == 0
    assert table.export()["pending_keys"].shape[0] == 100_000
    grown = int(table.stats()["memory_bytes"]) - before
    # A node per pending key (next pointer, key, count, last step: 32 bytes) and at least a bucket pointer each.
    assert grown >= 100_000 * (32 + 8), grown
