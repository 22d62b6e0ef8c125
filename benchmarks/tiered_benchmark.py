"""Tiered tables on W1 (docs/tiered_tables.md): a table 10x its DRAM cache against the same table in memory.

* step: W1's table (Zipf(1.05) ids, Adagrad) trained by `te.TPUEmbedding`, in memory and tiered with a cache of a
  tenth of the rows (with and without prefetching the next batch), alternating block by block in one process;
  every step takes a fresh batch from a pool (a repeated batch would make any cache hot). The ratio is the tiered
  step time over the in-memory one; the hit rate is the cache's, counted over the timed steps.
* memory: a child process trains the tiered table alone; its peak RSS less the RSS of the same process before the
  table existed (TensorFlow and the op library loaded, a step traced on a tiny table) is what the table costs,
  to compare with its `cache_bytes` budget (the rest: the fixed overhead, stated).

The row file lives in a scratch directory on the machine's disk (its page cache is the operating system's, not
the process's: RSS does not count it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf

from benchmarks import harness
from benchmarks import workloads as wls

CACHE_FRACTION = 0.1
POOL = 64  # distinct batches cycled through
STEADY_STEPS = 200  # steps after the cache is full, before timing (see bench_step)
CACHE_OVERHEAD_BYTES = 34  # the cache's bookkeeping per row (docs/tiered_tables.md)


def _record_bytes(dim: int) -> int:
    return 2 * dim * 4 + 4  # Adagrad: row + accumulator in float32, the CRC


def cache_sizes(wl, batches: list) -> dict:
    """A cache of a tenth of the rows, or of two batches' distinct rows where that is more (smoke sizes: a step's
    rows must fit, and a prefetched batch beside them)."""
    t = wl.tables[0]
    distinct = max(int(tf.size(tf.unique(b)[0])) for b in batches)
    rows = max(1, int(t.vocab * CACHE_FRACTION), 2 * distinct)
    cache = rows * (_record_bytes(t.dim) + CACHE_OVERHEAD_BYTES)
    return {"vocab": t.vocab, "dim": t.dim, "cache_rows": rows, "cache_bytes": cache}


def w1_embedding(wl, storage=None):
    """`(a built te.TPUEmbedding of W1's table, its TableConfig)`: Adagrad, in memory or with `storage`."""
    import tf_embed_ops as te

    t = wl.tables[0]
    table = te.TableConfig(
        t.vocab,
        t.dim,
        name=t.name,
        optimizer=te.optimizers.Adagrad(0.05),
        combiner="sum",
        initializer=tf.zeros_initializer(),
        storage=storage,
    )
    emb = te.TPUEmbedding({"f0": tf.tpu.experimental.embedding.FeatureConfig(table)})
    emb.build(per_replica_batch_size=len(wl.features[0].ids))
    return emb, table


def w1_batches(wl, n: int, seed: int = 5) -> list[tf.Tensor]:
    """`n` batches of W1's Zipf ids."""
    rng = np.random.default_rng(seed)
    batch, vocab = len(wl.features[0].ids), wl.tables[0].vocab
    zipf = wl.params.get("zipf", 1.05)
    return [tf.constant(wls.zipf_ids(rng, vocab, batch, zipf), tf.int64) for _ in range(n)]


def stepper(emb, batches, prefetch: bool):
    """A training step of `emb` over `batches` in turn (prefetching the next one with `prefetch`)."""

    @tf.function
    def step(ids, next_ids):
        emb.enqueue({"f0": ids})
        acts = emb.dequeue()
        if prefetch:  # between the lookup and the update (docs/tiered_tables.md)
            emb.prefetch({"f0": next_ids})
        emb.apply_gradients({"f0": acts["f0"] * 0.01 + 0.001})
        return acts["f0"][0, 0]

    counter = [0]

    def run():
        i = counter[0]
        counter[0] += 1
        return step(batches[i % len(batches)], batches[(i + 1) % len(batches)])

    return run


def bench_step(opts, wl, root: str, log) -> dict:
    import tf_embed_ops as te

    batches = w1_batches(wl, POOL if not opts.smoke else 4)
    sizes = cache_sizes(wl, batches)
    memory, _ = w1_embedding(wl)
    engines = {"in_memory": stepper(memory, batches, prefetch=False)}
    tables = {}
    for name, prefetch in (("tiered", False), ("tiered_prefetch", True)):
        storage = te.Tiered(cache_bytes=sizes["cache_bytes"], directory=os.path.join(root, name), chunk_bytes=8 << 20)
        emb, config = w1_embedding(wl, storage)
        tables[name] = emb.tiered_tables[config]
        engines[name] = stepper(emb, batches, prefetch)
    for fn in engines.values():  # trace
        for _ in range(max(opts.warmup, 2)):
            fn()
    # Steady state: each tiered cache full (and evicting), as in a long run; a few timed steps from a part-empty
    # cache would time cold misses without write-backs.  Then STEADY_STEPS more: the initialisation dropped the
    # row file from the page cache, and the first full-cache steps read their misses from the device (10 ms
    # steps); in a long run on this machine the file (492 MiB) stays in the page cache.  A file larger than the
    # machine's memory is benchmarks/tiered_large.py's case.
    for k, t in tables.items():
        for _ in range(0 if opts.smoke else 400):
            if int(t.stats()["resident_rows"]) >= int(t.stats()["capacity_rows"]):
                break
            engines[k]()
        for _ in range(0 if opts.smoke else STEADY_STEPS):
            engines[k]()
    steps = {
        k: 1 if opts.smoke else harness.steps_for(harness.estimate_ms(fn), opts.block_ms) for k, fn in engines.items()
    }
    before = {k: {s: int(v) for s, v in t.stats().items() if s != "hit_rate"} for k, t in tables.items()}
    res = harness.time_alternating(engines, steps, opts.blocks, warmup=0, sync=lambda out: out.numpy())
    out = {"sizes": sizes, "steps_per_block": steps, "timing": res}
    for k, t in tables.items():
        after = {s: int(v) for s, v in t.stats().items() if s != "hit_rate"}
        counters = ("hits", "misses", "rows_read", "bytes_read", "bytes_written", "evictions")
        delta = {s: after[s] - before[k][s] for s in counters}
        timed_steps = steps[k] * opts.blocks
        ids_per_step = len(wl.features[0].ids)
        out[k] = {
            # The cache's counters: rows of lookups and updates found resident (an update after its lookup always
            # is; rows a prefetch read are not counted there).
            "hit_rate": delta["hits"] / max(1, delta["hits"] + delta["misses"]),
            # Ids whose row did not have to be read from disk in their step (prefetch reads included).
            "id_hit_rate": 1.0 - delta["rows_read"] / timed_steps / ids_per_step,
            "rows_read_per_step": delta["rows_read"] / timed_steps,
            "bytes_read_per_step": delta["bytes_read"] / timed_steps,
            "bytes_written_per_step": delta["bytes_written"] / timed_steps,
            "ratio_to_in_memory": res[k]["median_ms"] / res["in_memory"]["median_ms"],
            "resident_rows": after["resident_rows"],
            "capacity_rows": after["capacity_rows"],
        }
        log(
            f"tiered: {k}: {res[k]['median_ms']:.2f} ms/step, hit rates {out[k]['hit_rate']:.3f} (rows), "
            f"{out[k]['id_hit_rate']:.3f} (ids)"
        )
    distinct = [int(tf.size(tf.unique(b)[0])) for b in batches[:8]]
    out["distinct_ids_per_batch"] = float(np.mean(distinct))
    return out


def _status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _rss_kb() -> int:
    return _status_kb("VmRSS")


def peak_rss_kb() -> int:
    """The process's peak RSS: VmHWM, this program's own (getrusage's ru_maxrss would also count the RSS of the
    process that forked it, which Linux carries across exec)."""
    return _status_kb("VmHWM")


def memory_child(smoke: bool, directory: str, steps: int) -> dict:
    """Run in a child process: the RSS the tiered table costs (see the module docstring)."""
    import tf_embed_ops as te

    wl = wls.w1(smoke=smoke)
    small = wls.w1(smoke=True)
    emb, _ = w1_embedding(small)  # TensorFlow, the op library and the step's functions loaded and traced
    stepper(emb, w1_batches(small, 2), prefetch=False)()
    baseline_kb = _rss_kb()
    batches = w1_batches(wl, 8)
    sizes = cache_sizes(wl, batches)
    storage = te.Tiered(cache_bytes=sizes["cache_bytes"], directory=directory, chunk_bytes=8 << 20)
    tiered, config = w1_embedding(wl, storage)
    table = tiered.tiered_tables[config]
    run = stepper(tiered, w1_batches(wl, 64 if not smoke else 8), prefetch=True)
    # Train until the cache is full (every budgeted byte in use), at least `steps` steps.
    for i in range(10 * steps):
        run()
        stats = table.stats()
        if i + 1 >= steps and int(stats["resident_rows"]) >= int(stats["capacity_rows"]):
            break
    return {
        "baseline_rss_mb": baseline_kb / 1024,
        "peak_rss_mb": peak_rss_kb() / 1024,
        "final_rss_mb": _rss_kb() / 1024,
        "cache_mb": sizes["cache_bytes"] / 2**20,
        "cache_full": int(table.stats()["resident_rows"]) >= int(table.stats()["capacity_rows"]),
        "table_file_mb": wl.tables[0].vocab * _record_bytes(wl.tables[0].dim) / 2**20,
    }


def bench_memory(opts, root: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.tiered_benchmark", "--memory-child", os.path.join(root, "rss")]
    if opts.smoke:
        cmd.append("--smoke")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"rc {done.returncode}"}
    r = json.loads(done.stdout.strip().splitlines()[-1])
    r["table_cost_mb"] = r["peak_rss_mb"] - r["baseline_rss_mb"]
    r["fixed_overhead_mb"] = r["table_cost_mb"] - r["cache_mb"]
    return r


def run(opts, log=print) -> dict:
    wl = wls.w1(smoke=opts.smoke)
    out = {"workload": {"name": wl.name, "description": wl.description}, "load_avg": list(os.getloadavg())}
    # When: a committed report may carry this section from a later run than the rest (`python -m benchmarks --only
    # tiered`, spliced into suite.json and re-rendered), and says so.
    out["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    root = tempfile.mkdtemp(prefix="tf_embed_ops_tiered_bench_")
    try:
        out["step"] = bench_step(opts, wl, root, log)
        out["memory"] = bench_memory(opts, root)
        log(f"tiered: memory {out['memory']}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["load_avg_end"] = list(os.getloadavg())
    return out


def section(result: dict) -> list[str]:
    """Markdown lines of the tiered-table section (none without one)."""
    r = result.get("tiered")
    if not r:
        return []
    s, timing = r["step"], r["step"]["timing"]
    z = s["sizes"]
    out = [
        f"## Tiered tables (W1, Adagrad, a cache of {z['cache_rows'] / z['vocab']:.0%} of the rows)",
        "",
        f"{r['workload']['description']}; the tiered table's cache holds {z['cache_rows']:,} of its {z['vocab']:,} "
        f"rows ({z['cache_bytes'] / 2**20:.1f} MiB); {s['distinct_ids_per_batch']:,.0f} distinct ids per batch. "
        f"Load average {r['load_avg'][0]:.1f} at start, {r['load_avg_end'][0]:.1f} at the end"
        + (f"; measured {r['measured_at']}." if r.get("measured_at") else "."),
        "",
        "| engine | ms/step (median) | IQR | vs in memory | hit rate (rows) | ids from cache | rows read / step | "
        "read / step | written / step |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| in memory | {timing['in_memory']['median_ms']:.2f} | {timing['in_memory']['iqr_ms']:.2f} | 1.00x "
        "| | | | | |",
    ]
    for k, label in (("tiered", "tiered"), ("tiered_prefetch", "tiered + prefetch")):
        if "error" in timing.get(k, {}):
            out.append(f"| {label} | {timing[k]['error']} | | | | | | | |")
            continue
        e = s[k]
        out.append(
            f"| {label} | {timing[k]['median_ms']:.2f} | {timing[k]['iqr_ms']:.2f} | "
            f"{e['ratio_to_in_memory']:.2f}x | {e['hit_rate']:.3f} | {e['id_hit_rate']:.3f} | "
            f"{e['rows_read_per_step']:,.0f} | {e['bytes_read_per_step'] / 1e6:.2f} MB | "
            f"{e['bytes_written_per_step'] / 1e6:.2f} MB |"
        )
    out += [
        "",
        "Hit rate (rows): the cache's counters, the distinct rows of each lookup and update found resident (the "
        "update after its lookup always finds them; rows a prefetch read count as reads, not misses). Ids from "
        "cache: the share of the batch's ids whose row was not read from disk in their step (prefetch included).",
    ]
    m = r["memory"]
    out.append("")
    if "error" in m:
        out += [f"Memory: not measured ({m['error']}).", ""]
    else:
        out += [
            f"Memory (a process training the tiered table alone): peak RSS {m['peak_rss_mb']:.0f} MiB, "
            f"{m['table_cost_mb']:.0f} MiB over the same process before the table existed "
            f"({m['baseline_rss_mb']:.0f} MiB: TensorFlow and the op library), trained until its cache was "
            f"{'full' if m.get('cache_full') else 'NOT full'}; the cache budget is {m['cache_mb']:.1f} MiB, so the "
            f"fixed overhead (a batch's tensors, initialisation and step buffers) is {m['fixed_overhead_mb']:.0f} "
            f"MiB, for a row file of {m['table_file_mb']:.0f} MiB.",
            "",
        ]
    return out


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--memory-child":
        print(json.dumps(memory_child("--smoke" in sys.argv, sys.argv[2], steps=3 if "--smoke" in sys.argv else 50)))
