"""16-bit tables on W1: our fused step with bfloat16 tables and slots vs float32, and FBGEMM with FP16 weights.

For each optimizer (SGD, Adagrad, lazy Adam) the same step (forward, fixed upstream gradient, fused backward and
update; benchmarks/ours.py) runs on three states, timed alternating block by block in one process:
  * fp32:         float32 table and slots (the suite's "ours");
  * bf16:         bfloat16 table and slots, stochastic rounding (te.TableConfig's default for 16 bits);
  * bf16_nearest: bfloat16 table and slots, round to nearest (what the random bits cost).
Then FBGEMM's CPU TBE on the same ids, with FP32 and with FP16 weights (its low-precision tables), in its own
interpreter, and the speed-of-light kernel (benchmarks/speed_of_light.cc) with fp32 and with bf16 storage and
stochastic rounding: its bf16 / fp32 ratio is what a 16-bit table can gain on this machine (the ceiling of the
target). The report gives each bf16 step as a fraction of the fp32 step (target <= 0.9, never slower than fp32)
and the bytes of the table and slots.

Usage: python -m benchmarks.low_precision_benchmark [--smoke] [--blocks 7] [--threads 1] [--out FILE]
                                                     [--fbgemm-python PY | --no-fbgemm]
Prints a markdown table and writes the JSON (default: a file in a new scratch directory).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from benchmarks import harness, ours
from benchmarks import speed_of_light as sol
from benchmarks import workloads as wls
from benchmarks.peers import fbgemm
from benchmarks.peers import tf_native as tn

OPTIMIZERS = ("sgd", "adagrad", "adam")
TARGET = 0.9  # bf16 step (stochastic rounding) / fp32 step
STATES = {
    "fp32": (tf.float32, "stochastic"),
    "bf16": (tf.bfloat16, "stochastic"),
    "bf16_nearest": (tf.bfloat16, "nearest"),
}


def fused_step(wl: wls.Workload, optimizer: str, dtype: tf.DType, rounding: str):
    """benchmarks/ours.fused_step with the table and slots stored in `dtype` (a step counter keys the rounding);
    it returns nothing, as that step does."""
    from tf_embed_ops import embedding_ops as api

    cfg = ours.make_config(wl, optimizer).SerializeToString()
    tables = [tf.Variable(tf.cast(t, dtype)) for t in tn.make_tables(wl, 0)]
    slots = [
        [tf.Variable(tf.fill([t.vocab, t.dim], tf.constant(v, dtype))) for v in ours.SLOT_INIT[optimizer]]
        for t in wl.tables
    ]
    combiners = [wl.combiner] * len(wl.tables)
    lengths = [f.sequence_length for f in wl.features]
    counter = tf.Variable(0, dtype=tf.int64)
    rounding_args = {} if dtype == tf.float32 else {"rounding": [rounding] * len(wl.tables)}

    @tf.function
    def step():
        # The step's data are constants of its graph, as ours.fused_step's.
        raw = ours.raw_features(wl)
        feats = [api.normalize_feature(x, max_sequence_length=n) for x, n in zip(raw, lengths, strict=True)]
        api.embedding_activations(feats, tables, cfg, combiners)
        extra = dict(rounding_args)
        if extra:
            extra["rounding_step"] = counter.assign_add(1)
        upstream = ours.activation_gradients(wl)
        api.send_tpu_embedding_gradients(upstream, [], feats, tables, slots, cfg, combiners, **extra)

    step.state_bytes = sum(v.shape.num_elements() * v.dtype.size for v in tables + [s for ts in slots for s in ts])
    return step


def _time(engines: dict, blocks: int, warmup: int, block_ms: float, smoke: bool) -> dict:
    steps = {}
    for name, fn in engines.items():
        for _ in range(warmup):
            fn()
        steps[name] = 1 if smoke else harness.steps_for(harness.estimate_ms(fn), block_ms)
    res = harness.time_alternating(engines, steps, blocks, warmup=0)
    for name, r in res.items():
        r["steps_per_block"] = steps[name]
    return res


def run(smoke: bool, blocks: int, threads: int, fbgemm_python: str | None, log=print) -> dict:
    wl = wls.w1(smoke=smoke)
    warmup, block_ms = (1, 20.0) if smoke else (3, 150.0)
    result = {
        "workload": wl.summary(),
        "threads": threads,
        "blocks": blocks,
        "smoke": smoke,
        "load_avg": os.getloadavg(),
    }
    rows = []
    for opt in OPTIMIZERS:
        engines = {name: fused_step(wl, opt, dtype, rounding) for name, (dtype, rounding) in STATES.items()}
        res = _time(engines, blocks, warmup, block_ms, smoke)
        for name, r in res.items():
            r["state_bytes"] = engines[name].state_bytes
        for name in STATES:
            if name != "fp32" and "median_ms" in res[name] and "median_ms" in res["fp32"]:
                res[name]["ratio_to_fp32"] = res[name]["median_ms"] / res["fp32"]["median_ms"]
        rows.append({"optimizer": opt, "ours": res})
        log(f"{opt}: " + ", ".join(f"{n} {r.get('median_ms', float('nan')):.3f} ms" for n, r in res.items()))
        del engines
    if fbgemm_python is not None:
        for precision in ("fp32", "fp16"):
            fb = fbgemm.run(
                fbgemm_python,
                wl,
                list(OPTIMIZERS),
                steps=2 if smoke else 0,
                blocks=blocks,
                warmup=warmup,
                threads=threads,
                block_ms=block_ms,
                weights_precision=precision,
            )
            for row in rows:
                r = fb.get(row["optimizer"], {"error": "no result"})
                row[f"fbgemm_{precision}"] = (
                    {**harness.summarize(r["block_ms"]), "detail": r.get("optim_type")}
                    if ("block_ms" in r)
                    else {"error": r.get("error", "no result")}
                )
            log(f"fbgemm {precision}: done")
    try:
        for storage in sol.STORAGES:
            res = sol.run(
                wl,
                list(OPTIMIZERS),
                storage=storage,
                threads=threads,
                steps=2 if smoke else 0,
                blocks=blocks,
                warmup=warmup,
                block_ms=block_ms,
            )
            for row in rows:
                row[f"speed_of_light_{storage}"] = harness.summarize(res[row["optimizer"]]["block_ms"])
        log("speed of light: done")
    except Exception as e:  # reported, never hidden
        for row in rows:
            for storage in sol.STORAGES:
                row[f"speed_of_light_{storage}"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    result["rows"] = rows
    return result


def markdown(result: dict) -> str:
    def ms(r: dict) -> str:
        return f"{r['median_ms']:.3f}" if "median_ms" in r else "n/a"

    lines = [
        "| optimizer | fp32 ms | bf16 (stochastic) ms | bf16 / fp32 | bf16 (nearest) ms | nearest / fp32 | "
        "FBGEMM fp32 ms | FBGEMM fp16 ms | speed of light fp32 -> bf16 ms (ratio) | state MB fp32 -> bf16 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        o = row["ours"]

        def ratio(k: str, o: dict = o) -> str:
            return f"{o[k]['ratio_to_fp32']:.2f}" if "ratio_to_fp32" in o[k] else "n/a"

        fb32, fb16 = row.get("fbgemm_fp32", {}), row.get("fbgemm_fp16", {})
        s32, s16 = row.get("speed_of_light_fp32", {}), row.get("speed_of_light_bf16", {})
        sol_cell = (
            f"{ms(s32)} -> {ms(s16)} ({s16['median_ms'] / s32['median_ms']:.2f})"
            if "median_ms" in s32 and "median_ms" in s16
            else "n/a"
        )
        lines.append(
            f"| {row['optimizer']} | {ms(o['fp32'])} | {ms(o['bf16'])} | {ratio('bf16')} | {ms(o['bf16_nearest'])} | "
            f"{ratio('bf16_nearest')} | {ms(fb32) if fb32 else 'absent'} | {ms(fb16) if fb16 else 'absent'} | "
            f"{sol_cell} | "
            f"{o['fp32']['state_bytes'] / 2**20:.0f} -> {o['bf16']['state_bytes'] / 2**20:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: an end-to-end check, not a measurement")
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="JSON output file")
    parser.add_argument("--fbgemm-python", default=None)
    parser.add_argument("--no-fbgemm", action="store_true")
    args = parser.parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    fb_python = None
    if not args.no_fbgemm:
        fb_python = fbgemm.find_python(args.fbgemm_python)
        ok, note = fbgemm.available(fb_python)
        if not ok:
            print(f"fbgemm: {note}", file=sys.stderr)
            fb_python = None
    result = run(args.smoke, args.blocks, args.threads, fb_python)
    out = args.out or os.path.join(tempfile.mkdtemp(prefix="low_precision_"), "low_precision.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(markdown(result))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
