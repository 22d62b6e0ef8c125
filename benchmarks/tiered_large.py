"""A tiered table larger than the machine's memory: create, train, checkpoint, restore (docs/tiered_tables.md).

Not part of any test tier or of `python -m benchmarks`: it writes the row file (the table's size), a checkpoint
(about as much again) and a restored row file, and takes minutes to hours (disk speed). Check the machine first:
`free -g` (the point is a table that does not fit in memory) and the free space of `--directory`. The script
checks that space up front and refuses to start without room for the row file and the checkpoint; the restore
goes to a second row file when the disk holds one more copy of the table, else it replaces the trained row file
(after a sample of the trained rows was read for the comparison); either way the restored table is made with
`te.Tiered(mode="restore")`, so the restore writes each row once. Every file it made is removed at the end
(`--keep` keeps them).

    python -m benchmarks.tiered_large --directory /mnt/disk/tiered --table-gb 26 --cache-gb 2 --steps 300

The table: Adagrad, dim 64 in float32 (516-byte records: the row, its accumulator and a CRC), so 26 GB is 50 M
rows. Each phase prints one JSON line: `init` (the row file written from the initializer, chunk by chunk),
`train` (a fresh batch of Zipf(1.05) ids each step, with prefetch: ms/step, the cache's hit rate, rows read and
written back per step), `checkpoint` (the streaming save), `restore`, `verify` (sampled rows of the restored table
bitwise against the trained one); `--train-only` stops after `train`. Each
line has the phase's wall time, the process's RSS now and at its peak (anonymous and file-backed), and the bytes
the process read from and wrote to storage in the phase (`/proc/self/io`) with their rate.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import time

import numpy as np
import tensorflow as tf

_RECORD_OVERHEAD = 4  # the CRC
_MARGIN_BYTES = 2 * 10**9  # left free on the disk beyond what the run writes


def row_file_bytes(table_bytes: int) -> int:
    """The row file of a table of `table_bytes` records: the log-structured file reserves a quarter more record
    slots (docs/tiered_storage.md, "The row file")."""
    return table_bytes + table_bytes // 4


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tiered_large", description=__doc__.splitlines()[0])
    p.add_argument("--directory", required=True, help="where the row files and the checkpoint go (a big disk)")
    p.add_argument("--table-gb", type=float, default=26.0, help="size of the row file (rows and slots), GB")
    p.add_argument("--cache-gb", type=float, default=2.0, help="the DRAM cache's budget, GiB")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=16_384)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--chunk-mb", type=int, default=64, help="rows moved per chunk by init/checkpoint/restore, MiB")
    p.add_argument(
        "--restore-into",
        choices=("auto", "new", "same"),
        default="auto",
        help="a second row file (new), the trained one replaced (same), or new when the disk has room (auto)",
    )
    p.add_argument("--keep", action="store_true", help="keep the row files and the checkpoint")
    p.add_argument("--train-only", action="store_true", help="stop after training (no checkpoint, no restore)")
    return p.parse_args(argv)


def plan_disk(table_bytes: int, free_bytes: int, restore_into: str, train_only: bool = False) -> str:
    """Where the restore goes ("new" or "same"), given the disk's free bytes; raises SystemExit naming the sizes
    when the row file and the checkpoint (plus a margin) do not fit.

    Args:
      table_bytes: the table's records (its checkpoint is about as large; its row file a quarter larger).
      free_bytes: free space of the directory's file system.
      restore_into: "auto", "new" or "same".
      train_only: no checkpoint and no restore: the row file and the margin must fit.

    Returns:
      "new" (a second row file), "same" (the trained row file replaced) or, train_only, "none".

    Raises:
      SystemExit: not enough space for what `restore_into` asks.
    """
    gb = 1e9
    row_file = row_file_bytes(table_bytes)
    if train_only:
        if free_bytes < row_file + _MARGIN_BYTES:
            raise SystemExit(
                f"tiered_large: needs {(row_file + _MARGIN_BYTES) / gb:.1f} GB free (row file "
                f"{row_file / gb:.1f} GB and {_MARGIN_BYTES / gb:.0f} GB of margin) but the disk has "
                f"{free_bytes / gb:.1f} GB free: use a smaller --table-gb or another --directory"
            )
        return "none"
    need_same = row_file + table_bytes + _MARGIN_BYTES
    need_new = 2 * row_file + table_bytes + _MARGIN_BYTES
    if restore_into == "new" and free_bytes < need_new or free_bytes < need_same:
        need = need_new if restore_into == "new" else need_same
        raise SystemExit(
            f"tiered_large: needs {need / gb:.1f} GB free (row file {row_file / gb:.1f} GB, its checkpoint "
            f"{table_bytes / gb:.1f} GB{', a restored row file as large again' if restore_into == 'new' else ''}, and "
            f"{_MARGIN_BYTES / gb:.0f} GB of margin) but the disk has {free_bytes / gb:.1f} GB free: use a smaller "
            "--table-gb or another --directory"
        )
    if restore_into == "auto":
        return "new" if free_bytes >= need_new else "same"
    return restore_into


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


def _status_mb() -> dict:
    fields = {"VmRSS": "rss_mb", "VmHWM": "peak_rss_mb", "RssAnon": "rss_anon_mb", "RssFile": "rss_file_mb"}
    out = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key = line.split(":")[0]
            if key in fields:
                out[fields[key]] = round(int(line.split()[1]) / 1024)
    return out


def _io_bytes() -> tuple[int, int]:
    """Bytes this process made the storage layer read and write (page-cache hits excluded)."""
    values = {}
    with open("/proc/self/io", encoding="ascii") as f:
        for line in f:
            key, value = line.split(":")
            values[key] = int(value)
    return values.get("read_bytes", 0), values.get("write_bytes", 0)


class _Phase:
    """Times a phase and prints its JSON line with memory and storage traffic."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> dict:
        self.fields = {}
        self.io = _io_bytes()
        self.t0 = time.perf_counter()
        return self.fields

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            return
        seconds = time.perf_counter() - self.t0
        read, written = (b - a for a, b in zip(self.io, _io_bytes(), strict=True))
        record = {
            "phase": self.name,
            "seconds": round(seconds, 1),
            **self.fields,
            **_status_mb(),
            "disk_read_gb": round(read / 1e9, 2),
            "disk_written_gb": round(written / 1e9, 2),
            "disk_mb_per_s": round((read + written) / 1e6 / max(seconds, 1e-9)),
        }
        print(json.dumps(record), flush=True)


def _table(rows: int, dim: int, cache_bytes: int, directory: str, chunk_mb: int, mode: str):
    import tf_embed_ops as te

    storage = te.Tiered(cache_bytes=cache_bytes, directory=directory, mode=mode, chunk_bytes=chunk_mb << 20)
    config = te.TableConfig(
        rows, dim, name="big", optimizer=te.optimizers.Adagrad(0.05), combiner="sum", storage=storage
    )
    emb = te.TPUEmbedding({"f": tf.tpu.experimental.embedding.FeatureConfig(config)})
    emb.build()
    return emb, emb.tiered_tables[config]


def _sample(table, rng: np.random.Generator) -> list:
    """Rows of `table` to compare later: its first, middle and last chunk and 256 rows drawn at random."""
    chunks = table.chunks()
    ranges = [chunks[i] for i in sorted({0, len(chunks) // 2, len(chunks) - 1})]
    ranges += [(int(r), 1) for r in rng.integers(0, table.num_rows, 256)]
    out = []
    for start, n in ranges:
        values, slots = table.read_rows(start, n)
        out.append((start, n, values.numpy(), {k: v.numpy() for k, v in slots.items()}))
    return out


def main(argv=None) -> None:
    a = _args(argv)
    record = 2 * a.dim * 4 + _RECORD_OVERHEAD
    rows = int(a.table_gb * 1e9 // record)
    table_bytes = rows * record
    cache_bytes = int(a.cache_gb * 2**30)
    made_root = not os.path.exists(a.directory)
    os.makedirs(a.directory, exist_ok=True)
    restore_into = plan_disk(table_bytes, shutil.disk_usage(a.directory).free, a.restore_into, a.train_only)
    with open("/proc/meminfo", encoding="ascii") as f:
        mem_total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    made = [os.path.join(a.directory, d) for d in ("trained", "restored", "checkpoint")]
    made = [d for d in made if not os.path.exists(d)]  # never remove what the script did not make
    try:
        _run(a, rows, table_bytes, cache_bytes, mem_total, restore_into)
    finally:
        if not a.keep:
            for d in made:
                shutil.rmtree(d, ignore_errors=True)
            if made_root and not os.listdir(a.directory):
                os.rmdir(a.directory)
            print(json.dumps({"phase": "cleanup", "removed": made}), flush=True)


def _run(a, rows: int, table_bytes: int, cache_bytes: int, mem_total: int, restore_into: str) -> None:
    with _Phase("init") as fields:
        emb, table = _table(rows, a.dim, cache_bytes, os.path.join(a.directory, "trained"), a.chunk_mb, "create")
        fields.update(
            rows=rows,
            row_file_gb=round(table_bytes / 1e9, 2),
            memory_gb=round(mem_total / 1e9, 2),
            larger_than_memory=table_bytes > mem_total,
            cache_gib=a.cache_gb,
            cache_rows=int(table.stats()["capacity_rows"]),
        )

    rng = np.random.default_rng(0)

    def batch():  # a fresh batch every step: cycling a few would let the cache hold all their rows
        return tf.constant(zipf_ids(rng, rows, a.batch), tf.int64)

    @tf.function
    def step(ids, next_ids):
        emb.enqueue({"f": ids})
        acts = emb.dequeue()
        emb.prefetch({"f": next_ids})  # between the lookup and the update (docs/tiered_tables.md)
        emb.apply_gradients({"f": acts["f"] * 0.01 + 0.001})

    current, following = batch(), batch()
    step(current, following)
    with _Phase("train") as fields:
        before = {k: int(v) for k, v in table.stats().items() if k != "hit_rate"}
        elapsed = 0.0  # the steps only, not drawing the batches
        for _ in range(a.steps):
            current, following = following, batch()
            t0 = time.perf_counter()
            step(current, following)
            elapsed += time.perf_counter() - t0
        after = {k: int(v) for k, v in table.stats().items() if k != "hit_rate"}
        delta = {k: after[k] - before[k] for k in before}
        fields.update(
            steps=a.steps,
            ms_per_step=round(elapsed * 1e3 / a.steps, 2),
            hit_rate=round(delta["hits"] / max(1, delta["hits"] + delta["misses"]), 4),  # prefetch reads: not misses
            ids_from_cache=round(1 - delta["rows_read"] / a.steps / a.batch, 4),
            rows_read_per_step=round(delta["rows_read"] / a.steps),
            rows_written_per_step=round(delta["rows_written"] / a.steps),
            resident_rows=after["resident_rows"],
            evictions_per_step=round(delta["evictions"] / a.steps),
        )
    if a.train_only:
        return

    with _Phase("checkpoint") as fields:
        path = tf.train.Checkpoint(embedding=emb).write(os.path.join(a.directory, "checkpoint", "big"))
        size = sum(e.stat().st_size for e in os.scandir(os.path.dirname(path)) if e.is_file())
        fields.update(checkpoint_gb=round(size / 1e9, 2))

    sample = _sample(table, np.random.default_rng(1))
    directory = os.path.join(a.directory, "trained" if restore_into == "same" else "restored")
    if restore_into == "same":  # the trained table goes first (its file is closed), then its file is replaced
        del emb, table, step
        gc.collect()
        free = shutil.disk_usage(a.directory).free + row_file_bytes(table_bytes)  # the trained row file is about to go
        if free < row_file_bytes(table_bytes) + _MARGIN_BYTES:
            raise SystemExit(f"tiered_large: {free / 1e9:.1f} GB free for the restored row file: too little")
    with _Phase("restore") as fields:
        t0 = time.perf_counter()
        # mode="restore": the new row file gets no initial rows; the checkpoint's restore writes each row once.
        restored, other = _table(rows, a.dim, cache_bytes, directory, a.chunk_mb, "restore")
        fields.update(into=restore_into, create_seconds=round(time.perf_counter() - t0, 1))
        t0 = time.perf_counter()
        tf.train.Checkpoint(embedding=restored).read(path).assert_consumed()
        fields.update(read_seconds=round(time.perf_counter() - t0, 1))

    with _Phase("verify") as fields:
        compared = 0
        for start, n, want, want_slots in sample:
            got, got_slots = other.read_rows(start, n)
            np.testing.assert_array_equal(got.numpy(), want)
            for name, value in want_slots.items():
                np.testing.assert_array_equal(got_slots[name].numpy(), value)
            compared += n
        fields.update(rows_compared=compared, bitwise_equal=True)


if __name__ == "__main__":
    main()
