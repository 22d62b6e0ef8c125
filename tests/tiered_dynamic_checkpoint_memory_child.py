"""Child process of test_tiered_dynamic_checkpoint's memory test: how much a process grows while it checkpoints and
restores a tiered dynamic table whose rows are much larger than one chunk.

`python tiered_dynamic_checkpoint_memory_child.py <directory>`: fills a tiered dynamic table of 131,072 keys x 128
(Adagrad: rows and accumulators, 128 MiB in float32; a cache of 1 MiB; chunks of 2 MiB) through the streamed
restore's own ops (the keys, then the rows chunk by chunk), then checkpoints it, restores the checkpoint into a
second tiered table, and, for scale, exports the first whole (`DynamicTable.export`). Before each step it resets the
kernel's peak-RSS mark (`/proc/self/clear_refs`, "5"); after it, it reads the peak (`VmHWM`). It prints, as one
JSON line, each step's peak growth over the RSS before it, beside the table's bytes, and whether the restored
table's rows equal the first's (compared chunk by chunk).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tensorflow as tf
from tiered_support import peak_rss_growth, status_kib

import tf_embed_ops as te
from tf_embed_ops.dynamic import ops as dynamic_ops

KEYS, DIM, CHUNK_BYTES = 131072, 128, 2 << 20


def _table(directory: str) -> te.dynamic.DynamicTable:
    storage = te.Tiered(cache_bytes=1 << 20, directory=directory, chunk_bytes=CHUNK_BYTES)
    config = te.DynamicTableConfig(
        "big", DIM, optimizer=te.optimizers.Adagrad(0.1), max_rows=KEYS, storage=storage, seed=3
    )
    return te.dynamic.DynamicTable(config)


def main(directory: str) -> None:
    keys = np.arange(KEYS, dtype=np.int64) * 1000003 - 77
    ones = np.ones(KEYS, np.int64)
    none = np.zeros(0, np.int64)
    rows = CHUNK_BYTES // (4 * 2 * DIM)
    first = _table(os.path.join(directory, "rows1"))
    dynamic_ops.dynamic_table_tiered_import_keys(first.handle, keys, ones, ones, none, none, none)
    rng = np.random.default_rng(0)
    for start in range(0, KEYS, rows):
        n = min(rows, KEYS - start)
        weights = rng.normal(size=(n, DIM)).astype(np.float32)
        dynamic_ops.dynamic_table_tiered_write_rows(first.handle, keys[start : start + n], weights, [weights**2])
    report = {"table_bytes": KEYS * 2 * DIM * 4, "chunk_bytes": CHUNK_BYTES, "rss_before": status_kib("VmRSS") * 1024}
    prefix = os.path.join(directory, "ckpt", "ckpt")
    saved = []
    report["save"] = peak_rss_growth(lambda: saved.append(tf.train.Checkpoint(table=first).write(prefix)))
    second = _table(os.path.join(directory, "rows2"))
    report["restore"] = peak_rss_growth(lambda: tf.train.Checkpoint(table=second).read(saved[0]).assert_consumed())
    same = True
    for start in range(0, KEYS, rows):
        chunk = keys[start : start + rows]
        a = dynamic_ops.dynamic_table_tiered_read_rows(first.handle, chunk, num_slots=1)
        b = dynamic_ops.dynamic_table_tiered_read_rows(second.handle, chunk, num_slots=1)
        same &= bool(np.array_equal(a[0].numpy(), b[0].numpy()) and np.array_equal(a[1][0].numpy(), b[1][0].numpy()))
    report["restored_equal"] = same
    report["export_whole"] = peak_rss_growth(lambda: first.export()["weights"].numpy())
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
