"""Touched-row tracking and incremental checkpoints on W1 (docs/tracking.md, docs/checkpoints.md).

* tracking: W1's fused step (Adagrad) on one set of tables, untracked and tracked (``tracked_blocks.py``), in
  interleaved pairs (``pairs.run_pairs``); the ratio, the median of the pairs', is the tracking overhead.
* checkpoint: the mid-level API on W1's table (Adagrad: table + accumulator), a full save, then deltas after
  1 / 10 / 100 steps of W1 batches (bytes, seconds, touched rows: the save-time curve); then a chain of a full
  save + 10 deltas restored against a full save alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np
import tensorflow as tf

from benchmarks import harness, ours, pairs
from benchmarks import workloads as wls
from benchmarks.tracked_blocks import TrackedBlocks

# Pairs per suite block count: the blocks are short (one set of tables, no setup between), and a ratio of a few
# percent needs more pairs than a section's 7 blocks.
TRACKING_PAIRS_PER_BLOCK = 3
TRACKING_TARGET = 1.02


def _dir_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def bench_tracking(opts, wl) -> dict:
    """W1 Adagrad on one set of tables, untracked and tracked (``tracked_blocks.py``), in interleaved pairs."""
    base = pairs.LocalEngine(ours.fused_step(wl, "adagrad"))
    tracked = TrackedBlocks(base)
    steps = pairs.size_blocks(base, opts.block_ms / 1e3, opts.warmup)  # (warms it: traced before any block)
    if opts.smoke:
        steps = 1
    res = pairs.run_pairs(
        base, {"tracked": tracked}, {"base": steps, "tracked": steps}, TRACKING_PAIRS_PER_BLOCK * opts.blocks
    )
    r = res["tracked"]
    return {
        "untracked": harness.summarize(r["base_ms"]),
        "tracked": harness.summarize(r["ms"]),
        "ratio": float(np.median(r["ratios"])),
        "ratio_q1": float(np.percentile(r["ratios"], 25)),
        "ratio_q3": float(np.percentile(r["ratios"], 75)),
        "pairs": len(r["ratios"]),
    }


def _engine(wl):
    import tf_embed_ops as te

    emb_api = tf.tpu.experimental.embedding
    t = wl.tables[0]
    table = emb_api.TableConfig(t.vocab, t.dim, name=t.name, optimizer=emb_api.Adagrad(0.05), combiner="sum")
    emb = te.TPUEmbedding({"f0": emb_api.FeatureConfig(table)})
    emb.build(per_replica_batch_size=len(wl.features[0].ids))
    return emb


def bench_checkpoint(opts, wl, log) -> dict:
    import tf_embed_ops as te

    rng = np.random.default_rng(11)
    batch = len(wl.features[0].ids)
    batches = [
        tf.constant(wls.zipf_ids(rng, wl.tables[0].vocab, batch, wl.params.get("zipf", 1.05)), tf.int64)
        for _ in range(170 if not opts.smoke else 40)
    ]  # a fresh batch every step (a cycle of a few batches would stop touching new rows)
    emb = _engine(wl)

    @tf.function
    def step(ids):
        emb.enqueue({"f0": ids})
        acts = emb.dequeue()
        emb.apply_gradients({"f0": acts["f0"] * 0.01 + 0.001})

    counter = [0]

    def train(n):
        for _ in range(n):
            step(batches[counter[0] % len(batches)])
            counter[0] += 1

    root = tempfile.mkdtemp(prefix="tf_embed_ops_ckpt_bench_")
    try:
        ckpt = tf.train.Checkpoint(emb=emb)
        mgr = te.checkpoint.IncrementalCheckpointManager(ckpt, os.path.join(root, "chain"), full_every=0, max_chains=1)
        train(1)
        t0 = time.perf_counter()
        mgr.save()
        full_s = time.perf_counter() - t0
        full_bytes = mgr.chain[-1]["bytes"]
        curve = []
        tracker = te.tracking.Tracker(emb)
        for steps in (1, 10, 100) if not opts.smoke else (1, 10):
            cursor = tracker.cursor()
            train(steps)
            touched = int(tracker.changed_since(cursor).tables[wl.tables[0].name].rows.size)
            t0 = time.perf_counter()
            mgr.save()
            curve.append(
                {
                    "steps": steps,
                    "touched_rows": touched,
                    "bytes": mgr.chain[-1]["bytes"],
                    "save_s": time.perf_counter() - t0,
                }
            )
            log(f"checkpoint: delta after {steps} steps: {curve[-1]}")
        # Restore: full + 10 deltas against a full save alone.
        mgr.compact()
        for _ in range(10):
            train(5)
            mgr.save()
        t0 = time.perf_counter()
        mgr.restore()
        chain_s = time.perf_counter() - t0
        mgr.compact()
        t0 = time.perf_counter()
        mgr.restore()
        full_restore_s = time.perf_counter() - t0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    after_100 = [c for c in curve if c["steps"] == 100]
    step_ms = None
    if after_100:
        t0 = time.perf_counter()
        train(20)
        step_ms = (time.perf_counter() - t0) * 1e3 / 20
    return {
        "step_ms": step_ms,
        "full_bytes": full_bytes,
        "full_save_s": full_s,
        "curve": curve,
        "ratio_full_to_delta_after_100": full_bytes / after_100[0]["bytes"] if after_100 else None,
        "restore_full_plus_10_deltas_s": chain_s,
        "restore_full_s": full_restore_s,
    }


def run(opts, log=print) -> dict:
    wl = wls.w1(smoke=opts.smoke)
    load = os.getloadavg()
    out = {
        "workload": {"name": wl.name, "description": wl.description},
        "load_avg": list(load),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    out["tracking"] = bench_tracking(opts, wl)
    log(f"tracking: ratio {out['tracking']['ratio']:.3f}")
    out["checkpoint"] = bench_checkpoint(opts, wl, log)
    return out


def _overhead_line(tr: dict) -> str:
    """The overhead as a ratio of pairs (median [IQR], pairs), or a single ratio (a result from before pairs)."""
    met = "met" if tr["ratio"] <= TRACKING_TARGET else "missed"
    if "pairs" not in tr:
        return f"Tracking overhead: **{tr['ratio']:.3f}x** (target <= {TRACKING_TARGET:g}: {met})."
    return (
        f"Tracking overhead: **{tr['ratio']:.3f}x** [{tr['ratio_q1']:.3f}-{tr['ratio_q3']:.3f}] over {tr['pairs']} "
        f"pairs on the same tables (target <= {TRACKING_TARGET:g}: {met})."
    )


def section(result: dict) -> list[str]:
    """Markdown lines of the tracking / incremental-checkpoint section (none without one)."""
    r = result.get("checkpoint")
    if not r:
        return []
    tr, ck = r["tracking"], r["checkpoint"]
    out = [
        "## Touched-row tracking and incremental checkpoints (W1, Adagrad)",
        "",
        f"{r['workload']['description']}; load average at start {r['load_avg'][0]:.1f}"
        + (f"; measured {r['date_utc']} UTC." if "date_utc" in r else "."),
        "",
        "| W1 fused step | ms/step (median) | IQR |",
        "|---|---|---|",
        f"| untracked | {tr['untracked']['median_ms']:.2f} | {tr['untracked']['iqr_ms']:.2f} |",
        f"| tracked | {tr['tracked']['median_ms']:.2f} | {tr['tracked']['iqr_ms']:.2f} |",
        "",
        _overhead_line(tr),
        "",
        f"Full checkpoint (table + accumulator): {ck['full_bytes'] / 1e6:.1f} MB in {ck['full_save_s']:.2f} s.",
        "",
        "| delta after | touched rows | bytes | save s | full / delta |",
        "|---|---|---|---|---|",
    ]
    for c in ck["curve"]:
        out.append(
            f"| {c['steps']} steps | {c['touched_rows']:,} | {c['bytes'] / 1e6:.2f} MB | {c['save_s']:.3f} | "
            f"{ck['full_bytes'] / c['bytes']:.1f}x |"
        )
    out += [
        "",
        f"Restore: full + 10 deltas {ck['restore_full_plus_10_deltas_s']:.2f} s, full alone "
        f"{ck['restore_full_s']:.2f} s (ratio {ck['restore_full_plus_10_deltas_s'] / ck['restore_full_s']:.2f}).",
        "",
    ]
    last = ck["curve"][-1]
    if ck.get("step_ms"):
        # A 60 s cadence: 60 s of steps, then one delta. The delta after `last['steps']` steps bounds it from
        # below (more steps touch more rows, sub-linearly under Zipf); reported as an estimate.
        steps_per_minute = 60e3 / ck["step_ms"]
        out += [
            f"Estimated cost of a delta every 60 s: {last['save_s'] / 60:.2%} of training time (one "
            f"{last['save_s']:.2f} s delta a minute, measured after {last['steps']} steps; a minute holds "
            f"{steps_per_minute:,.0f} steps at {ck['step_ms']:.1f} ms/step and touches more rows, sub-linearly "
            f"under Zipf), plus tracking's {tr['ratio'] - 1:+.2%} per step.",
            "",
        ]
    return out
