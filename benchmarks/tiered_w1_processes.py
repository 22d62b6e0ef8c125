"""W1 in memory against tiered, one engine per process (docs/design_notes.md, "Tiered tables").

`python -m benchmarks.tiered_w1_processes --rounds 2` runs, per round, a process training W1's table in memory,
then one training it tiered (a cache of a tenth of the rows), then one tiered prefetching the next batch, each
with one TensorFlow thread (`--tf-threads 0`: TensorFlow's defaults): warm-up steps (the
tiered cache filled first), then timed blocks; a process reports its best block (ms/step), its CPU time per step
(user + system, every thread of the process) over the timed blocks and the load average beside it.  Processes
alternate so that both engines see the same load; the row file lives in a scratch directory that is removed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

# tiered_prefetch: the step prefetches the next batch between its lookup and its update (the cache's thread reads
# it while the step goes on).
ENGINES = ("memory", "tiered", "tiered_prefetch")


def _io_chars() -> dict:
    """Bytes this process has passed to read/write system calls so far (/proc/self/io: rchar, wchar): with the
    row file in the page cache, the tiered table's reads and appends (cleaning's included)."""
    with open("/proc/self/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return {"rchar": int(fields["rchar"]), "wchar": int(fields["wchar"])}


def _child(args) -> dict:
    import tensorflow as tf

    if args.tf_threads:  # 0: TensorFlow's defaults (a thread per core in each pool)
        tf.config.threading.set_intra_op_parallelism_threads(args.tf_threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.tf_threads)
    import tf_embed_ops as te
    from benchmarks import tiered_benchmark as tb
    from benchmarks import workloads as wls

    wl = wls.w1(smoke=False)
    batches = tb.w1_batches(wl, tb.POOL)
    sizes = tb.cache_sizes(wl, batches)
    storage = None
    if args.engine != "memory":
        storage = te.Tiered(cache_bytes=sizes["cache_bytes"], directory=args.directory, chunk_bytes=8 << 20)
    emb, config = tb.w1_embedding(wl, storage)
    step = tb.stepper(emb, batches, prefetch=args.engine == "tiered_prefetch")
    table = emb.tiered_tables[config] if storage is not None else None
    if table is not None:  # the cache full and evicting, as in a long run
        for _ in range(400):
            if int(table.stats()["resident_rows"]) >= int(table.stats()["capacity_rows"]):
                break
            step()
    for _ in range(args.warmup):
        step().numpy()
    if args.gc_freeze:  # Python's cyclic collector walks every object set up so far, in both engines alike
        gc.collect()
        gc.freeze()
    before = {k: int(v) for k, v in table.stats().items() if k != "hit_rate"} if table is not None else {}
    best, steps_total = float("inf"), 0
    cpu0, io0 = resource.getrusage(resource.RUSAGE_SELF), _io_chars()
    for _ in range(args.blocks):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < args.block_s:
            step().numpy()
            n += 1
        best = min(best, (time.perf_counter() - t0) * 1e3 / n)
        steps_total += n
    cpu1, io1 = resource.getrusage(resource.RUSAGE_SELF), _io_chars()
    out = {
        "engine": args.engine,
        "best_ms_per_step": best,
        "cpu_ms_per_step": ((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)) * 1e3 / steps_total,
        "user_ms_per_step": (cpu1.ru_utime - cpu0.ru_utime) * 1e3 / steps_total,
        "system_ms_per_step": (cpu1.ru_stime - cpu0.ru_stime) * 1e3 / steps_total,
        "load_avg": os.getloadavg()[0],
        "tf_threads": args.tf_threads,
        "gc_freeze": args.gc_freeze,
        "max_rss_mb": cpu1.ru_maxrss / 1024,
    }
    if table is not None:
        after = {k: int(v) for k, v in table.stats().items() if k != "hit_rate"}
        d = {k: (after[k] - before[k]) / steps_total for k in ("hits", "misses", "rows_read", "rows_written")}
        out.update({f"{k}_per_step": v for k, v in d.items()})
        out["hit_rate"] = d["hits"] / max(1e-9, d["hits"] + d["misses"])
        out["bytes_read_syscalls_per_step"] = (io1["rchar"] - io0["rchar"]) / steps_total
        out["bytes_written_syscalls_per_step"] = (io1["wchar"] - io0["wchar"]) / steps_total
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tiered_w1_processes", description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=ENGINES, help="(one child process)")
    p.add_argument("--engines", default="memory,tiered,tiered_prefetch", help="comma-separated, run in this order")
    p.add_argument("--directory", help="(child) the row file's directory")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tf-threads", type=int, default=1, help="TensorFlow's intra- and inter-op threads (0: default)")
    p.add_argument("--warmup", type=int, default=150)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--block-s", type=float, default=3.0)
    p.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after the warm-up (see the docs)")
    args = p.parse_args(argv)
    if args.engine:
        print(json.dumps(_child(args)))
        return []
    results = []
    for r in range(args.rounds):
        for engine in args.engines.split(","):
            with tempfile.TemporaryDirectory(prefix="tf_embed_ops_w1_") as directory:
                cmd = [sys.executable, "-m", "benchmarks.tiered_w1_processes", "--engine", engine]
                cmd += ["--directory", directory, "--warmup", str(args.warmup), "--blocks", str(args.blocks)]
                cmd += ["--block-s", str(args.block_s), "--tf-threads", str(args.tf_threads)]
                cmd += ["--gc-freeze"] if args.gc_freeze else []
                env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
                done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=True)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                result["round"] = r + 1
                results.append(result)
                print(json.dumps(result), flush=True)
    return results


if __name__ == "__main__":
    main()
