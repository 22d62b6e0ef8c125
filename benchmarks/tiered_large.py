"""A tiered table larger than the machine's memory: create, train, checkpoint, restore (docs/tiered_tables.md).

Not part of any test tier or of `python -m benchmarks`: it writes the table twice and its checkpoint once, so it
needs about 3x the table's size free on the disk of `--directory`, and takes minutes to hours (disk speed). The
default is 40 GB of rows and slots (Adagrad, dim 64 in float32: 516-byte records, 77.5 M rows) with a 4 GiB cache;
check the machine's memory first (`free -g`): the point is a table that does not fit in it.

    python -m benchmarks.tiered_large --directory /mnt/disk/tiered --table-gb 40 --cache-gb 4 --steps 200

Each phase prints one JSON line: `init` (the row file written from the initializer, chunk by chunk), `train`
(Zipf(1.05) batches, with prefetch; ms/step and the cache's hit rate), `checkpoint` (the streaming save),
`restore` (into a new table over a new row file), `verify` (rows of the restored table read back against the
trained one, a sample of chunks). Peak RSS is printed with each, to compare with the cache's budget.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import tensorflow as tf

_RECORD_OVERHEAD = 4  # the CRC
_CACHE_OVERHEAD = 34  # the cache's bookkeeping per row


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tiered_large", description=__doc__.splitlines()[0])
    p.add_argument("--directory", required=True, help="where the row files and the checkpoint go (a big disk)")
    p.add_argument("--table-gb", type=float, default=40.0, help="size of the row file (rows and slots), GB")
    p.add_argument("--cache-gb", type=float, default=4.0, help="the DRAM cache's budget, GiB")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=16_384)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--chunk-mb", type=int, default=64, help="rows moved per chunk by init/checkpoint/restore, MiB")
    return p.parse_args(argv)


def zipf_ids(rng: np.random.Generator, rows: int, n: int, s: float = 1.05) -> np.ndarray:
    """`n` ids in [0, rows) with Zipf(s) frequencies: ranks from numpy's Zipf sampler (redrawn past `rows`),
    scattered over the table by a multiplicative bijection (W1's sampler keeps two float64/int64 tables of the
    whole vocabulary, 16 bytes per row, which would count against the memory this script measures)."""
    ranks = rng.zipf(s, n)
    while (ranks > rows).any():
        over = ranks > rows
        ranks[over] = rng.zipf(s, int(over.sum()))
    prime = 2_147_483_647
    factor = prime if math.gcd(prime, rows) == 1 else 1
    return ((ranks - 1).astype(np.int64) * factor) % rows


def _report(phase: str, **fields) -> None:
    with open("/proc/self/status", encoding="ascii") as f:  # VmHWM: this program's own peak RSS
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    print(json.dumps({"phase": phase, "peak_rss_mb": round(peak), **fields}), flush=True)


def _embedding(config):
    import tf_embed_ops as te

    emb = te.TPUEmbedding({"f": tf.tpu.experimental.embedding.FeatureConfig(config)})
    t0 = time.perf_counter()
    emb.build()
    return emb, time.perf_counter() - t0


def main(argv=None) -> None:
    import tf_embed_ops as te

    a = _args(argv)
    record = 2 * a.dim * 4 + _RECORD_OVERHEAD
    rows = int(a.table_gb * 1e9 // record)
    cache_bytes = int(a.cache_gb * 2**30)

    def config(sub: str):
        storage = te.Tiered(
            cache_bytes=cache_bytes,
            directory=os.path.join(a.directory, sub),
            mode="overwrite",
            chunk_bytes=a.chunk_mb << 20,
        )
        return te.TableConfig(
            rows, a.dim, name="big", optimizer=te.optimizers.Adagrad(0.05), combiner="sum", storage=storage
        )

    trained_config = config("trained")
    emb, seconds = _embedding(trained_config)
    table = emb.tiered_tables[trained_config]
    _report("init", rows=rows, row_file_gb=rows * record / 1e9, cache_gib=a.cache_gb, seconds=round(seconds, 1))

    rng = np.random.default_rng(0)
    batches = [tf.constant(zipf_ids(rng, rows, a.batch), tf.int64) for _ in range(16)]

    @tf.function
    def step(ids, next_ids):
        emb.enqueue({"f": ids})
        acts = emb.dequeue()
        emb.prefetch({"f": next_ids})
        emb.apply_gradients({"f": acts["f"] * 0.01 + 0.001})

    step(batches[0], batches[1])
    before = {k: int(v) for k, v in table.stats().items() if k != "hit_rate"}
    t0 = time.perf_counter()
    for i in range(a.steps):
        step(batches[i % len(batches)], batches[(i + 1) % len(batches)])
    elapsed = time.perf_counter() - t0
    after = {k: int(v) for k, v in table.stats().items() if k != "hit_rate"}
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    _report(
        "train",
        steps=a.steps,
        ms_per_step=round(elapsed * 1e3 / a.steps, 2),
        hit_rate=hits / max(1, hits + misses),  # rows a prefetch read count as reads, not misses
        rows_read_per_step=(after["rows_read"] - before["rows_read"]) / a.steps,
    )

    path = os.path.join(a.directory, "checkpoint", "big")
    t0 = time.perf_counter()
    path = tf.train.Checkpoint(embedding=emb).write(path)
    _report("checkpoint", seconds=round(time.perf_counter() - t0, 1), path=path)

    restored_config = config("restored")
    restored, _ = _embedding(restored_config)
    t0 = time.perf_counter()
    tf.train.Checkpoint(embedding=restored).read(path).assert_consumed()
    _report("restore", seconds=round(time.perf_counter() - t0, 1))

    other = restored.tiered_tables[restored_config]
    chunks = table.chunks()
    sample = [chunks[i] for i in sorted({0, len(chunks) // 2, len(chunks) - 1})]
    for start, n in sample:
        want, want_slots = table.read_rows(start, n)
        got, got_slots = other.read_rows(start, n)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        for name in want_slots:
            np.testing.assert_array_equal(got_slots[name].numpy(), want_slots[name].numpy())
    _report("verify", chunks_compared=len(sample), equal=True)


if __name__ == "__main__":
    main()
