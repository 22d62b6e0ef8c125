"""Steps/s of ShardedTPUEmbedding on an in-process localhost cluster, for 1, 2 and 4 parameter servers.

Workload W1 (as benchmarks/fused_step_benchmark.py): one table of 1M x 64 float32 with Adagrad, 16,384
zipf(s=1.05) ids per step, one id per sample (dense input), loss = sum(activations).  A step (forward on the
shards, gradient, fused update on the shards) is scheduled with `ClusterCoordinator.schedule`; the workers run
steps concurrently (asynchronous training), and with `--sync` one round = one step per worker aggregated by
`SyncSparseAggregator`.

Every configuration runs in its own Python process (in-process servers cannot be shut down).  All tasks share
this machine's cores, so the numbers show the protocol's overheads, not a real multi-host speed-up.

`--ps 0` is the baseline without a cluster: `tf_embed_ops.TPUEmbedding` in one process, steps back to back.

Usage: python benchmarks/distributed_scaling.py [--ps 0 1 2 4] [--workers 2] [--steps 40] [--rounds 3] [--quick]
    [--out FILE]
`--workers 1 2 4` runs every server count with each worker count.  Writes
benchmarks/results/distributed_scaling.json (or `--out`) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB, DIM, BATCH, ZIPF_S = 1_000_000, 64, 16_384, 1.05


def zipf_ids(rng, n: int, vocab: int, s: float) -> np.ndarray:
    """Bounded zipf(s) ids in [0, vocab) by inverse-CDF sampling (same generator as the fused benchmark)."""
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-s)
    cdf /= cdf[-1]
    return np.searchsorted(cdf, rng.random(n)).astype(np.int64)


def run_one(num_ps: int, workers: int, steps: int, rounds: int, vocab: int, batch: int, sync: bool) -> dict:
    """Child process: one cluster, `rounds` timed runs of `steps` scheduled steps each; returns steps/s."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    sys.path.insert(0, ROOT)
    from tf_embed_ops.distribute import ShardedTPUEmbedding, SyncSparseAggregator, create_local_cluster

    emb_api = tf.tpu.experimental.embedding
    table = emb_api.TableConfig(vocab, DIM, name="w1", combiner="sum")
    if num_ps == 0:
        # Baseline: no cluster, one process, the single-machine class, steps run back to back.
        from tf_embed_ops import TPUEmbedding  # pylint: disable=import-outside-toplevel

        strategy = coordinator = None
        emb = TPUEmbedding({"ids": emb_api.FeatureConfig(table)}, emb_api.Adagrad(0.01))
        emb.build(per_replica_batch_size=batch)
        workers, sync, aggregator = 0, False, None
    else:
        strategy = create_local_cluster(num_workers=workers, num_ps=num_ps)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            emb = ShardedTPUEmbedding({"ids": emb_api.FeatureConfig(table)}, emb_api.Adagrad(0.01))
            emb.build(per_replica_batch_size=batch)
            aggregator = SyncSparseAggregator(emb, replicas_to_aggregate=workers) if sync else None

    @tf.function
    def step(ids):
        emb.enqueue({"ids": ids})
        with tf.GradientTape() as tape:
            acts = emb.dequeue()
            tape.watch(acts)
            loss = tf.reduce_sum(acts["ids"])
        emb.apply_gradients(tape.gradient(loss, acts))

    rng = np.random.default_rng(0)
    pool = [tf.constant(zipf_ids(rng, batch, vocab, ZIPF_S)) for _ in range(8)]

    def run(n: int) -> None:
        if coordinator is None:
            for i in range(n):
                step(pool[i % len(pool)])
            return
        if sync:
            for r in range(n // workers):
                for w in range(workers):
                    coordinator.schedule(step, args=(pool[(r * workers + w) % len(pool)],))
                aggregator.take_and_apply()
        else:
            for i in range(n):
                coordinator.schedule(step, args=(pool[i % len(pool)],))
        coordinator.join()

    run(max(2 * workers, 2))  # warm-up: traces, function registration on every task
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        run(steps)
        rates.append(steps / (time.perf_counter() - start))
    return {
        "num_ps": num_ps,
        "workers": workers,
        "sync": sync,
        "steps_per_s": rates,
        "median_steps_per_s": statistics.median(rates),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps", type=int, nargs="+", default=[0, 1, 2, 4], help="0: one process, no cluster")
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sync", action="store_true", help="synchronous rounds through SyncSparseAggregator")
    parser.add_argument("--quick", action="store_true", help="10k-row table, 1,024 ids: checks the script runs")
    parser.add_argument("--out", default=None, help="the JSON record (default: benchmarks/results/...)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    vocab, batch = (10_000, 1_024) if args.quick else (VOCAB, BATCH)

    if args.child:
        print(json.dumps(run_one(int(args.child), args.workers[0], args.steps, args.rounds, vocab, batch, args.sync)))
        return

    results = []
    for num_ps, workers in [(p, w) for p in args.ps for w in (args.workers if p else args.workers[:1])]:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            str(num_ps),
            "--workers",
            str(workers),
            "--steps",
            str(args.steps),
            "--rounds",
            str(args.rounds),
        ]
        cmd += ["--sync"] if args.sync else []
        cmd += ["--quick"] if args.quick else []
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"num_ps={num_ps} failed:\n{proc.stderr[-4000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"ps={num_ps} workers={workers}: {results[-1]['median_steps_per_s']:.2f} steps/s", file=sys.stderr)

    record = {
        "workload": {"vocab": vocab, "dim": DIM, "ids_per_step": batch, "zipf_s": ZIPF_S, "optimizer": "adagrad"},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "mode": "sync" if args.sync else "async",
        "results": results,
    }
    if not args.quick or args.out:
        out = args.out or os.path.join(
            ROOT, "benchmarks", "results", "distributed_scaling" + ("_sync" if args.sync else "") + ".json"
        )
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
    print(f"| parameter servers | workers | mode | steps/s (median of {args.rounds}) | ms/step | ids/s |")
    print("|---:|---:|---|---:|---:|---:|")
    for r in results:
        ps = r["num_ps"] or "none (one process)"
        mode = record["mode"] if r["num_ps"] else "-"
        print(
            f"| {ps} | {r['workers']} | {mode} | {r['median_steps_per_s']:.2f} | "
            f"{1000 / r['median_steps_per_s']:.2f} | {r['median_steps_per_s'] * batch:,.0f} |"
        )


if __name__ == "__main__":
    main()
