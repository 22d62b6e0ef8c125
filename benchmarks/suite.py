"""The benchmark suite: every workload, every engine, in one run; results as one JSON-able dict.

Per workload and optimizer, our fused step and the TensorFlow-native peers are timed in this process, alternating
block by block (``harness.time_alternating``); FBGEMM runs right after in its own interpreter on the same ids.
Each of our results carries its memory-bandwidth bound (``bandwidth.bound_ms``). Sweeps move one knob of W1; the
thread curve re-runs W1 in child processes (TensorFlow's thread pools are fixed at start-up). Nothing is hidden:
an engine that cannot run is recorded with its error.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time

import tensorflow as tf

from benchmarks import bandwidth, harness, ours
from benchmarks import speed_of_light as sol
from benchmarks import workloads as wls
from benchmarks.peers import fbgemm, keras_rs_peer
from benchmarks.peers import tf_native as tn

# The optimizers of the issue, everywhere; the rest of the TPU catalogue that has a TF raw-op peer, on W1 only.
CORE_OPTIMIZERS = ("sgd", "adagrad", "adagrad_momentum", "adam", "adam_nonlazy", "ftrl")
EXTRA_OPTIMIZERS = ("momentum", "rms_prop", "centered_rms_prop", "rowwise_adagrad")
SWEEP_OPTIMIZERS = ("sgd", "adagrad", "adam")
# The vocabulary sweep reaches 1e7 rows (1.3 GB a table at dim 32): without Adam's two extra slots, ours and the
# raw-op peer together stay near 5 GB, which a 24 GB machine shared with other work can hold.
SWEEP_OPTIMIZERS_BY_AXIS = {"vocab": ("sgd", "adagrad")}


@dataclasses.dataclass
class Options:
    """What to run. ``smoke`` shrinks sizes and repetitions so the whole suite runs in seconds."""

    smoke: bool = False
    only: tuple[str, ...] = ()  # workload / section names (W1..W4, sweeps, threads, lookup, accumulator)
    optimizers: tuple[str, ...] = ()  # restrict optimizers (default: all)
    threads: int = 1
    fbgemm_python: str | None = None
    no_fbgemm: bool = False
    no_speed_of_light: bool = False
    tfra_python: str | None = None
    blocks: int = 7
    warmup: int = 3
    block_ms: float = 150.0

    def wants(self, section: str) -> bool:
        return not self.only or section in self.only

    def optimizers_for(self, candidates) -> list[str]:
        return [o for o in candidates if not self.optimizers or o in self.optimizers]


def host_meta(opts: Options) -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "host": {
            "cpu": cpu,
            "logical_cpus": os.cpu_count(),
            "machine": platform.machine(),
            "load_avg_at_start": os.getloadavg(),
        },
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "threads": opts.threads,
        "smoke": opts.smoke,
        "blocks": opts.blocks,
        "warmup": opts.warmup,
        "block_ms_target": opts.block_ms,
    }


def _rows_per_s(summary: dict, ms: float) -> float:
    return float(sum(summary["unique_rows"])) / (ms / 1e3) if ms > 0 else 0.0


def _build(builder, *args) -> object:
    try:
        return builder(*args)
    except Exception as e:
        err = harness.error_text(e)

        def failing():
            raise RuntimeError(err)

        return failing


def bench_training(
    wl: wls.Workload,
    optimizers: list[str],
    opts: Options,
    probe: dict | None,
    fbgemm_python: str | None,
    section: str,
    keras: bool = True,
) -> list[dict]:
    """Ours vs Keras 3 vs raw ops (alternating), then FBGEMM, for each optimizer on one workload.

    ``keras=False`` leaves Keras out (the sweeps: its dense updates take seconds per step at the large points and
    its scaling is that of a dense pass, which the W1-W4 tables already show).
    """
    summary = wl.summary()
    records = []
    for opt in optimizers:
        engines = {"ours": _build(ours.fused_step, wl, opt)}
        if opt in tn.RAW_OPTIMIZERS:
            engines["raw_op"] = _build(tn.raw_op_step, wl, opt)
        if keras and opt in tn.KERAS_OPTIMIZERS:
            engines["keras"] = _build(tn.keras_step, wl, opt)
        if keras and opt == "adam" and section == "W1":  # keras-rs's layer (model Adam) vs ours (table Adam)
            engines.update({name: _build(make, wl) for name, make in keras_rs_peer.ENGINES.items()})
        res = harness.time_engines(engines, opts)
        for engine, r in res.items():
            rec = {"section": section, "workload": wl.name, "optimizer": opt, "engine": engine, **r}
            if engine == "raw_op":
                rec["detail"] = tn.RAW_KIND.get(opt, "ResourceSparseApply*")
            if engine == "keras" and opt == "adam":
                rec["detail"] = "Keras Adam is dense (no lazy variant)"
            if "median_ms" in r:
                rec["unique_rows_per_s"] = _rows_per_s(summary, r["median_ms"])
                if engine == "ours" and probe is not None:
                    b = bandwidth.bound_ms(summary, opt, probe)
                    rec["bound"] = b
                    rec["fraction_of_bound"] = b["bound_ms"] / r["median_ms"]
            records.append(rec)
        del engines
        gc.collect()
    if fbgemm_python is not None:
        fb_opts = [o for o in ("sgd", "adagrad") if o in optimizers]
        if "adagrad" in fb_opts:
            fb_opts.append("rowwise_adagrad")
        if fb_opts:
            steps = 2 if opts.smoke else 0  # 0: the peer sizes its blocks to block_ms itself
            fb = fbgemm.run_best(
                fbgemm_python,
                wl,
                fb_opts,
                steps=steps,
                blocks=opts.blocks,
                warmup=opts.warmup,
                threads=opts.threads,
                block_ms=opts.block_ms,
            )
            for name, r in fb.items():
                opt = "adagrad" if name == "rowwise_adagrad" else name
                engine = "fbgemm_rowwise" if name == "rowwise_adagrad" else "fbgemm"
                rec = {"section": section, "workload": wl.name, "optimizer": opt, "engine": engine}
                if "block_ms" in r:
                    rec.update(harness.summarize(r["block_ms"]))
                    rec["steps_per_block"] = r.get("steps", steps)
                    rec["detail"] = (
                        r.get("optim_type", "")
                        + (f", OMP_WAIT_POLICY={r['omp_wait_policy']}" if r.get("omp_wait_policy") else "")
                        + (", THP_MEM_ALLOC_ENABLE=1" if r.get("huge_pages") else "")
                    )
                    rec["unique_rows_per_s"] = _rows_per_s(summary, rec["median_ms"])
                else:
                    rec["error"] = r.get("error", "no result")
                records.append(rec)
    records += _speed_of_light(wl, optimizers, opts, section)
    return records


def _speed_of_light(wl: wls.Workload, optimizers: list[str], opts: Options, section: str) -> list[dict]:
    """The speed-of-light kernel on the same ids (its own process, right after the others), per optimizer."""
    sol_opts = [o for o in optimizers if o in sol.OPTIMIZERS]
    if not sol_opts or opts.no_speed_of_light:
        return []
    summary = wl.summary()
    base = {"section": section, "workload": wl.name, "engine": "speed_of_light"}
    try:
        res = sol.run(
            wl,
            sol_opts,
            threads=opts.threads,
            steps=2 if opts.smoke else 0,
            blocks=opts.blocks,
            warmup=opts.warmup,
            block_ms=opts.block_ms,
        )
    except Exception as e:
        return [{**base, "optimizer": o, "error": harness.error_text(e)} for o in sol_opts]
    records = []
    for o in sol_opts:
        rec = {**base, "optimizer": o, **harness.summarize(res[o]["block_ms"]), "steps_per_block": res[o]["steps"]}
        rec["unique_rows_per_s"] = _rows_per_s(summary, rec["median_ms"])
        records.append(rec)
    return records


def bench_floor(opts: Options) -> list[dict]:
    """The dispatch floor: an empty ``tf.function`` step and our fused SGD step on one id, through the same harness.

    What no engine running in TensorFlow can go below per step, whatever its kernels do; the speed-of-light
    kernel has no such floor (it is one C++ loop), so the floor is part of any gap between the two.
    """
    empty = tf.function(lambda: tf.constant(0.0))
    engines = {"tf_empty_step": empty, "ours_one_id": _build(ours.fused_step, wls.w1(vocab=1000, batch=1), "sgd")}
    res = harness.time_engines(engines, opts)
    return [{"section": "floor", "workload": "W1", "optimizer": "sgd", "engine": e, **r} for e, r in res.items()]


def bench_lookup(wl: wls.Workload, opts: Options, probe: dict | None) -> list[dict]:
    """Serving: our forward op vs tf.nn.embedding_lookup(_sparse)."""
    summary = wl.summary()
    res = harness.time_engines({"ours": _build(ours.lookup_step, wl), "tf_lookup": _build(tn.lookup_step, wl)}, opts)
    out = []
    for engine, r in res.items():
        rec = {"section": "lookup", "workload": wl.name, "optimizer": "lookup", "engine": engine, **r}
        if engine == "tf_lookup":
            rec["detail"] = (
                "tf.nn.embedding_lookup_sparse"
                if wl.combiner == "mean" or any(f.kind == "bag" for f in wl.features)
                else "tf.nn.embedding_lookup"
            )
        if "median_ms" in r:
            rec["unique_rows_per_s"] = _rows_per_s(summary, r["median_ms"])
            if engine == "ours" and probe is not None:
                b = bandwidth.bound_ms(summary, "lookup", probe)
                rec["bound"] = b
                rec["fraction_of_bound"] = b["bound_ms"] / r["median_ms"]
        out.append(rec)
    gc.collect()
    return out


def parity(smoke_workloads: list[wls.Workload], optimizers: list[str], steps: int = 2) -> list[dict]:
    """Checks that ours and the raw-op peer do the same work: same start, ``steps`` steps, compare the state.

    Runs on small workloads (it reads whole tables back). A benchmark of two engines that compute different
    updates would compare nothing; this is what makes the ratios meaningful.
    """
    import numpy as np

    out = []
    for wl in smoke_workloads:
        for opt in optimizers:
            if opt not in tn.RAW_OPTIMIZERS:
                continue
            rec = {"workload": wl.name, "optimizer": opt}
            try:
                mine = ours.fused_step(wl, opt)
                peer = tn.raw_op_step(wl, opt)
                (t_a, s_a), (t_b, s_b) = mine.state, peer.state
                for a, b in zip(t_a + [x for s in s_a for x in s], t_b + [x for s in s_b for x in s], strict=True):
                    b.assign(a)
                for _ in range(steps):
                    mine()
                    peer()
                diffs = [
                    float(np.max(np.abs(a.numpy() - b.numpy()), initial=0.0))
                    for a, b in zip(t_a + [x for s in s_a for x in s], t_b + [x for s in s_b for x in s], strict=True)
                ]
                moved = max(
                    float(np.max(np.abs(a.numpy() - b0), initial=0.0))
                    for a, b0 in zip(t_a, [tn.make_tables(wl, 0)[i].numpy() for i in range(len(t_a))], strict=True)
                )
                rec.update({"max_abs_diff": max(diffs), "max_abs_update": moved, "steps": steps})
            except Exception as e:
                rec["error"] = harness.error_text(e)
            out.append(rec)
    return out


def parity_speed_of_light(smoke_workloads: list[wls.Workload], optimizers: list[str], steps: int = 3) -> list[dict]:
    """Ours and the speed-of-light kernel from the same tables, ``steps`` steps each: the tables compared.

    The kernel is a yardstick only if it does our step's work; this shows it computes the same update.
    """
    import numpy as np

    out = []
    for wl in smoke_workloads:
        for opt in optimizers:
            if opt not in sol.OPTIMIZERS:
                continue
            rec = {"workload": wl.name, "optimizer": opt, "peer": "speed_of_light", "steps": steps}
            try:
                mine = ours.fused_step(wl, opt)
                tables = mine.state[0]
                init = [t.numpy() for t in tables]
                for _ in range(steps):
                    mine()
                theirs = sol.final_tables(wl, opt, init, steps)
                rec["max_abs_diff"] = max(
                    float(np.max(np.abs(t.numpy() - k), initial=0.0)) for t, k in zip(tables, theirs, strict=True)
                )
                rec["max_abs_update"] = max(
                    float(np.max(np.abs(t.numpy() - i), initial=0.0)) for t, i in zip(tables, init, strict=True)
                )
            except Exception as e:
                rec["error"] = harness.error_text(e)
            out.append(rec)
    return out


def bench_accumulator(opts: Options) -> dict:
    """Our SparseConditionalAccumulator vs TensorFlow's (reuses benchmarks/accumulator_benchmark.py)."""
    try:
        from benchmarks import accumulator_benchmark as ab
    except Exception as e:
        return {"error": f"accumulator benchmark unavailable: {harness.error_text(e)}"}
    applies, rows, width, repeats = (4, 256, 8, 2) if opts.smoke else (32, 16384, 64, 5)
    out = {"config": {"applies": applies, "rows": rows, "width": width, "repeats": repeats}, "cases": {}}
    for case in ("disjoint", "overlapping"):
        try:
            indices, values = ab.make_gradients(case, applies, rows, width)
            graph = ab.time_graph(indices, values, repeats)
            eager = ab.time_eager(indices, values, repeats)
        except Exception as e:
            out["cases"][case] = {"error": harness.error_text(e)}
            continue
        row = {name: harness.summarize([x * 1e3 for x in t]) for name, t in graph.items()}
        row["tf_embed_ops_eager"] = harness.summarize([x * 1e3 for x in eager])
        out["cases"][case] = row
    return out


def bench_threads(opts: Options) -> list[dict]:
    """W1 and W4 at 1 and 2 intra-op threads, each in a child process (thread pools are fixed at TF start-up)."""
    import tempfile

    records = []
    scratch = tempfile.mkdtemp(prefix="tf_embed_ops_bench_threads_")
    for threads in (1, 2):
        child_out = os.path.join(scratch, f"threads{threads}")
        cmd = [
            sys.executable,
            "-m",
            "benchmarks",
            "--only",
            "W1,W4",
            "--threads",
            str(threads),
            "--out",
            child_out,
            "--optimizers",
            ",".join(SWEEP_OPTIMIZERS),
            "--no-report",
            "--blocks",
            str(opts.blocks),
        ]
        if opts.smoke:
            cmd.append("--smoke")
        if opts.no_fbgemm:
            cmd.append("--no-fbgemm")
        elif opts.fbgemm_python:
            cmd += ["--fbgemm-python", opts.fbgemm_python]
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            check=False,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        if proc.returncode != 0:
            records.append(
                {
                    "section": "threads",
                    "threads": threads,
                    "engine": "all",
                    "error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:400],
                }
            )
            continue
        with open(os.path.join(child_out, "suite.json")) as f:
            child = json.load(f)
        for rec in child["runs"]:
            if rec.get("workload") in ("W1", "W4") and rec.get("section") == rec.get("workload"):
                records.append({**rec, "section": "threads", "threads": threads})
    shutil.rmtree(scratch, ignore_errors=True)
    return records


# The sections that are one module's ``run(opts, log)``, in the order they run: (section, module under
# benchmarks/, whether to log "<section>: done" after it).
_MODULE_SECTIONS = (
    ("serving_delta", "serving_delta_benchmark", False),
    ("checkpoint", "checkpoint_benchmark", False),
    ("tiered", "tiered_benchmark", False),
    ("serving_quant", "serving_quant", False),
    ("lifecycle", "lifecycle_benchmark", True),
    ("ps_wire_bytes", "ps_wire_bytes", False),
)


def run(opts: Options, log=print) -> dict:
    """Runs the selected sections; returns {"meta", "bandwidth", "workloads", "runs", "accumulator", "peers"}."""
    meta = host_meta(opts)
    ok, why = ours.available()
    peers = {"ours": {"available": ok, "note": why}}
    fb_python = None
    if opts.no_fbgemm:
        peers["fbgemm"] = {"available": False, "note": "disabled (--no-fbgemm)"}
    else:
        fb_python = fbgemm.find_python(opts.fbgemm_python)
        fb_ok, fb_note = fbgemm.available(fb_python)
        peers["fbgemm"] = {"available": fb_ok, "note": fb_note, "python": fb_python}
        if not fb_ok:
            fb_python = None
    log(f"ours: {'ok' if ok else why}; fbgemm: {peers['fbgemm']['note']}")

    probe = None
    try:
        if opts.smoke:
            probe = bandwidth.probe(opts.threads, mb=32, reps=1, dims=(8, 16, 64), rows_touched=1024)
        else:
            probe = bandwidth.probe(opts.threads, reps=5)
        log(
            f"bandwidth: copy {probe['stream_copy_gbs']:.1f} GB/s, random-row RMW "
            f"{bandwidth.rmw_gbs(probe, 64):.1f} GB/s at dim 64"
        )
    except Exception as e:
        probe = None
        meta["bandwidth_error"] = harness.error_text(e)
        log(f"bandwidth probe unavailable: {meta['bandwidth_error']}")

    result = {"meta": meta, "peers": peers, "bandwidth": probe, "workloads": {}, "runs": []}
    # The one-minute load average as each section starts (and at the end): whether the machine stayed quiet is
    # read per section, since a shared machine can get busy half-way through a 40-minute run.
    meta["load_by_section"] = []

    def section(name: str) -> None:
        meta["load_by_section"].append([name, time.strftime("%H:%M:%S", time.gmtime()), os.getloadavg()[0]])

    if ok:
        result["parity"] = parity(
            [make(smoke=True) for name, make in wls.WORKLOADS.items() if opts.wants(name)],
            opts.optimizers_for(list(CORE_OPTIMIZERS) + list(EXTRA_OPTIMIZERS)),
        )
        if not opts.no_speed_of_light:
            result["parity"] += parity_speed_of_light(
                [make(smoke=True) for name, make in wls.WORKLOADS.items() if opts.wants(name)],
                opts.optimizers_for(sol.OPTIMIZERS),
            )
        diffs = [r["max_abs_diff"] for r in result["parity"] if "max_abs_diff" in r]
        failed = [f"{r['workload']}/{r['optimizer']}" for r in result["parity"] if "error" in r]
        log(
            f"parity: {len(diffs)} checks, largest difference {max(diffs, default=0.0):.1e}"
            + (f"; not run: {', '.join(failed)}" if failed else "")
        )
    # The thread-scaling children (W1 and W4, ~11 GB each) run first, while this process is still small: after
    # the workloads and sweeps it holds ~13 GB, and both together outgrow a 24 GB machine.
    if opts.wants("threads"):
        section("threads")
        result["runs"] += bench_threads(opts)
        log("threads: done")

    for name, make in wls.WORKLOADS.items():
        if not opts.wants(name):
            continue
        section(name)
        wl = make(smoke=opts.smoke)
        result["workloads"][name] = wl.summary()
        optimizers = list(CORE_OPTIMIZERS) + (list(EXTRA_OPTIMIZERS) if name == "W1" else [])
        log(f"{name}: {wl.description}")
        t0 = time.time()
        result["runs"] += bench_training(wl, opts.optimizers_for(optimizers), opts, probe, fb_python, name)
        if name in ("W1", "W2") and (not opts.optimizers or "lookup" in opts.optimizers):
            result["runs"] += bench_lookup(wl, opts, probe)
        if name == "W1":
            result["runs"] += bench_floor(opts)
        log(f"{name}: done in {time.time() - t0:.0f} s")
        del wl
        gc.collect()

    if opts.wants("sweeps"):
        section("sweeps")
        for axis, points in wls.sweeps(opts.smoke).items():
            for wl in points:
                t0 = time.time()
                result["workloads"][f"{axis}:{wl.name}"] = wl.summary()
                recs = bench_training(
                    wl,
                    opts.optimizers_for(SWEEP_OPTIMIZERS_BY_AXIS.get(axis, SWEEP_OPTIMIZERS)),
                    opts,
                    probe,
                    fb_python,
                    f"sweep:{axis}",
                    keras=False,
                )
                for r in recs:
                    r["axis"], r["point"] = axis, wl.params.get(axis)
                    r["workload"] = f"{axis}:{wl.name}"
                result["runs"] += recs
                log(f"sweep {axis} {wl.name}: {time.time() - t0:.0f} s")
                del wl
                gc.collect()

    if opts.wants("dynamic"):
        section("dynamic")
        from benchmarks import dynamic_benchmark

        result["dynamic"] = dynamic_benchmark.run(opts, log, opts.tfra_python)

    for name, module, log_done in _MODULE_SECTIONS:
        if opts.wants(name):
            section(name)
            result[name] = importlib.import_module(f"benchmarks.{module}").run(opts, log)
            if log_done:
                log(f"{name}: done")

    if opts.wants("accumulator"):
        section("accumulator")
        result["accumulator"] = bench_accumulator(opts)
        log("accumulator: done")

    section("end")
    if probe is not None and not opts.smoke:
        # The bound is what the hardware can do: probe again at the end (another phase of a shared machine) and
        # cost every result at the best figures seen.
        try:
            again = bandwidth.probe(opts.threads, reps=5)
            result["bandwidth"] = bandwidth.best_of(probe, again)
            result["bandwidth_probes"] = [probe, again]
            rebound(result)
            log(
                f"bandwidth (best of start and end): copy {result['bandwidth']['stream_copy_gbs']:.1f} GB/s, "
                f"random-row RMW {bandwidth.rmw_gbs(result['bandwidth'], 64):.1f} GB/s at dim 64"
            )
        except Exception as e:
            log(f"second bandwidth probe failed ({harness.error_text(e)}); keeping the first")
    return result


def rebound(result: dict) -> None:
    """Recomputes every bound and fraction of bound from ``result["bandwidth"]``."""
    for rec in result["runs"]:
        if rec.get("engine") != "ours" or "median_ms" not in rec or rec.get("section") == "threads":
            continue
        summary = result["workloads"].get(rec["workload"])
        if summary is None:
            continue
        b = bandwidth.bound_ms(summary, rec["optimizer"], result["bandwidth"])
        rec["bound"] = b
        rec["fraction_of_bound"] = b["bound_ms"] / rec["median_ms"]
