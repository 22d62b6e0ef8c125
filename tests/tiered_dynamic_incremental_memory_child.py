"""Child process of test_tiered_dynamic_incremental_checkpoint's memory test: how much a process grows while
`te.checkpoint.IncrementalCheckpointManager` saves and restores a chain of a dynamic table whose rows are much
larger than one chunk.

`python tiered_dynamic_incremental_memory_child.py <directory> tiered|memory`: fills a dynamic table of 65,536 keys
x 256 (SGD: rows only, 64 MiB in float32), tiered (a cache of 1 MiB, chunks of 2 MiB; filled through the streamed
restore's ops) or kept in memory (`import_`), saves a full checkpoint, trains one step of 256 keys, saves a delta,
trains again and restores the chain. Before each save and the restore it resets the kernel's peak-RSS mark
(`/proc/self/clear_refs`, "5"); after it, it reads the peak (`VmHWM`). It prints, as one JSON line, each one's peak
growth over the RSS before it, beside the table's bytes and the delta's keys.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tensorflow as tf
from tiered_support import peak_rss_growth, status_kib, step

import tf_embed_ops as te
from tf_embed_ops.dynamic import ops as dynamic_ops

KEYS, DIM, CHUNK_BYTES = 65536, 256, 2 << 20


def main(directory: str, kind: str) -> None:
    storage = te.Tiered(cache_bytes=1 << 20, directory=os.path.join(directory, "rows"), chunk_bytes=CHUNK_BYTES)
    config = te.DynamicTableConfig(
        "big", DIM, optimizer=te.optimizers.SGD(0.1), storage=storage if kind == "tiered" else None
    )
    emb = te.TPUEmbedding({"f": tf.tpu.experimental.embedding.FeatureConfig(config, name="f")})
    emb.build()
    table = emb.dynamic_tables[config]
    keys = np.arange(KEYS, dtype=np.int64) * 1000003 - 77
    rng = np.random.default_rng(0)
    if kind == "tiered":
        ones, none = np.ones(KEYS, np.int64), np.zeros(0, np.int64)
        dynamic_ops.dynamic_table_tiered_import_keys(table.handle, keys, ones, ones, none, none, none)
        rows = CHUNK_BYTES // (4 * DIM)
        for start in range(0, KEYS, rows):
            weights = rng.normal(size=(min(rows, KEYS - start), DIM)).astype(np.float32)
            dynamic_ops.dynamic_table_tiered_write_rows(table.handle, keys[start : start + rows], weights, [])
    else:
        table.import_(keys, rng.normal(size=(KEYS, DIM)).astype(np.float32))
    manager = te.checkpoint.IncrementalCheckpointManager(
        tf.train.Checkpoint(embedding=emb), os.path.join(directory, f"chain_{kind}")
    )
    report = {"table_bytes": KEYS * DIM * 4, "chunk_bytes": CHUNK_BYTES, "rss_before": status_kib("VmRSS") * 1024}
    report["save_full"] = peak_rss_growth(manager.save)
    ids = tf.constant(rng.choice(keys, size=256, replace=False))
    step(emb, {"f": ids})
    report["save_delta"] = peak_rss_growth(manager.save)
    report["kinds"] = [e["kind"] for e in manager.chain]
    expected = table.lookup(ids[:16]).numpy()
    step(emb, {"f": ids})
    report["restore"] = peak_rss_growth(manager.restore)
    report["restored_equal"] = bool(np.array_equal(table.lookup(ids[:16]).numpy(), expected))
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
