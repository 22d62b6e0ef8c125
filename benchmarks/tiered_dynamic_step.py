"""A tiered dynamic table's training step against the same dynamic table in memory (docs/tiered_dynamic_tables.md,
"Measured"): a short, standalone measurement (not part of the suite).

W1-like: Zipf(1.05) keys over a key space of `--keys`, one feature, Adagrad, `--batch` ids per step, a fresh batch
each step from a pool; the tiered table's cache holds `--cache-fraction` of the key space. The two tables train
in one process, alternating block by block (so load changes hit both alike); the ratio is the tiered step time
over the in-memory one. The row file lives in a scratch directory on the machine's disk. Report the load average
(`uptime`) beside the figures: the machine may be shared.

    python -m benchmarks.tiered_dynamic_step --keys 200000 --dim 32 --batch 8192 --blocks 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np
import tensorflow as tf

import tf_embed_ops as te

CACHE_OVERHEAD_BYTES = 34  # the cache's bookkeeping per row (docs/tiered_tables.md)


def _table(args, storage=None):
    return te.DynamicTableConfig(
        "items",
        args.dim,
        optimizer=te.optimizers.Adagrad(0.05),
        combiner="sum",
        initializer="zeros",
        max_rows=args.keys,
        initial_capacity=min(args.keys, 1 << 16),
        storage=storage,
    )


def _embedding(table):
    emb = te.TPUEmbedding({"f": tf.tpu.experimental.embedding.FeatureConfig(table, name="f")})
    emb.build()

    @tf.function
    def step(ids):
        emb.enqueue({"f": ids})
        with tf.GradientTape() as tape:
            acts = emb.dequeue()
            tape.watch(acts)
            loss = tf.reduce_sum(acts["f"] ** 2)
        emb.apply_gradients(tape.gradient(loss, acts))
        return loss

    return emb, step


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--cache-fraction", type=float, default=0.1)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps-per-block", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    pool = [
        tf.constant(np.minimum(rng.zipf(1.05, args.batch), args.keys) * 7919 % (1 << 40), tf.int64) for _ in range(64)
    ]
    record = 2 * args.dim * 4 + 4  # Adagrad: row + accumulator in float32, the CRC
    distinct = max(int(tf.size(tf.unique(b)[0])) for b in pool)
    cache_rows = max(int(args.keys * args.cache_fraction), distinct)
    scratch = tempfile.mkdtemp(prefix="tiered_dynamic_")
    try:
        storage = te.Tiered(cache_bytes=cache_rows * (record + CACHE_OVERHEAD_BYTES), directory=scratch)
        memory_table, tiered_table = _table(args), _table(args, storage)
        emb_m, step_m = _embedding(memory_table)
        emb_t, step_t = _embedding(tiered_table)
        for i in range(args.warmup):  # both tables fill up with the hot keys
            step_m(pool[i % len(pool)])
            step_t(pool[i % len(pool)])
        cache = emb_t.dynamic_tables[tiered_table]
        before = {k: float(v) for k, v in cache.cache_stats().items()}
        times = {"memory": 0.0, "tiered": 0.0}
        i = args.warmup
        for _ in range(args.blocks):
            for name, step in (("memory", step_m), ("tiered", step_t)):
                start = time.perf_counter()
                for k in range(args.steps_per_block):
                    step(pool[(i + k) % len(pool)]).numpy()
                times[name] += time.perf_counter() - start
            i += args.steps_per_block
        after = {k: float(v) for k, v in cache.cache_stats().items()}
        steps = args.blocks * args.steps_per_block
        hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
        size = int(emb_t.dynamic_tables[tiered_table].stats()["size"])
        memory_bytes = int(emb_t.dynamic_tables[tiered_table].stats()["memory_bytes"])
        out = {
            "keys": args.keys,
            "dim": args.dim,
            "batch": args.batch,
            "cache_rows": cache_rows,
            "rows": size,
            "memory_ms_per_step": 1e3 * times["memory"] / steps,
            "tiered_ms_per_step": 1e3 * times["tiered"] / steps,
            "ratio": times["tiered"] / times["memory"],
            "hit_rate": hits / max(hits + misses, 1.0),
            "rows_read_per_step": (after["rows_read"] - before["rows_read"]) / steps,
            "dram_bytes_per_key_beside_the_cache": (memory_bytes - cache_rows * (record + CACHE_OVERHEAD_BYTES)) / size,
            "load_average": os.getloadavg(),
        }
        print(json.dumps(out, indent=1))
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
