"""Child process of test_tiered_dynamic_serving's memory test: how much a process grows while it exports a tiered
dynamic table whose rows are much larger than one chunk for serving.

`python tiered_dynamic_serving_memory_child.py <directory>`: fills a tiered dynamic table of 65,536 keys x 512
(SGD: rows only, 128 MiB in float32; a cache of 1 MiB; chunks of 2 MiB) through the streamed restore's ops (the keys,
then the rows chunk by chunk), then exports it for serving twice (`freeze_streamed` + `te.serving.save_streamed`,
float32, then int8) and, for scale, reads its whole export (`DynamicTable.export`, what `freeze` would read). Before
each step it resets the kernel's peak-RSS mark (`/proc/self/clear_refs`, "5"); after it, it reads the peak
(`VmHWM`). It prints, as one JSON line, each step's peak growth over the RSS before it, beside the table's bytes,
and whether the float32 servable serves a sample of keys' rows exactly (looked up in this process).
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
from tf_embed_ops.dynamic import serving as dynamic_serving

KEYS, DIM, CHUNK_BYTES = 65536, 512, 2 << 20


def _export(table: te.dynamic.DynamicTable, path: str, mode: str | None) -> None:
    form = dynamic_serving.freeze_streamed(table, mode)
    root = tf.Module()
    root.table = form
    root.serve = tf.function(form.lookup, input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    te.serving.save_streamed(root, path, signatures={"serving_default": root.serve})


def _table(directory: str, name: str, max_rows: int) -> te.dynamic.DynamicTable:
    storage = te.Tiered(cache_bytes=1 << 20, directory=os.path.join(directory, "rows"), chunk_bytes=CHUNK_BYTES)
    config = te.DynamicTableConfig(name, DIM, optimizer=te.optimizers.SGD(0.1), max_rows=max_rows, storage=storage)
    return te.dynamic.DynamicTable(config)


def main(directory: str) -> None:
    # TensorFlow's one-time costs of a first SavedModel (tracing, the saver's modules) outside the measures: a
    # small table exported first.
    small = _table(directory, "small", 16)
    dynamic_ops.dynamic_table_tiered_import_keys(small.handle, np.arange(4), *[np.ones(4, np.int64)] * 2, *[[]] * 3)
    dynamic_ops.dynamic_table_tiered_write_rows(small.handle, np.arange(4), np.ones([4, DIM], np.float32), [])
    _export(small, os.path.join(directory, "warm_up"), None)
    table = _table(directory, "big", KEYS)
    keys = np.arange(KEYS, dtype=np.int64) * 1000003 - 77
    ones, none = np.ones(KEYS, np.int64), np.zeros(0, np.int64)
    dynamic_ops.dynamic_table_tiered_import_keys(table.handle, keys, ones, ones, none, none, none)
    rows = CHUNK_BYTES // (4 * DIM)
    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(KEYS, 64, replace=False))
    expected = {}
    for start in range(0, KEYS, rows):
        n = min(rows, KEYS - start)
        weights = rng.normal(size=(n, DIM)).astype(np.float32)
        dynamic_ops.dynamic_table_tiered_write_rows(table.handle, keys[start : start + n], weights, [])
        for i in sample[(sample >= start) & (sample < start + n)]:
            expected[int(i)] = weights[i - start]
    report = {"table_bytes": KEYS * DIM * 4, "chunk_bytes": CHUNK_BYTES, "rss_before": status_kib("VmRSS") * 1024}
    for mode in (None, "int8"):
        path = os.path.join(directory, f"streamed_{mode}")
        report[f"streamed_{mode or 'none'}"] = peak_rss_growth(lambda path=path, mode=mode: _export(table, path, mode))
    fn = tf.saved_model.load(os.path.join(directory, "streamed_None")).signatures["serving_default"]
    served = fn(ids=tf.constant(keys[sample]))["output_0"].numpy()
    report["served_equal"] = bool(np.array_equal(served, np.stack([expected[int(i)] for i in sample])))
    report["export_whole"] = peak_rss_growth(lambda: table.export()["weights"].numpy())
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
