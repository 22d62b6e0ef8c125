"""The headline ratios, measured by interleaved pairs (``benchmarks/pairs.py``) in a bounded time.

Every ratio the speed targets name (ours against the speed-of-light kernel, FBGEMM, our own fp32 / static /
untracked / one-thread step) is measured here with each peer's blocks next to ours in time: the out-of-process
engines (FBGEMM, the kernel, ours at two threads) as persistent workers (``benchmarks/workers.py``), the others in
this process. Each figure is the median of its per-pair ratios, with their interquartile range and the number of
pairs; a ceiling (what the kernel shows possible for that target) is a ratio of pair ratios of the same rounds.

One comparison group per workload and optimizer: ours (the base) and every engine compared with it are built,
timed in rounds (``pairs.run_pairs``, each block after 150 ms of untimed steps of its engine) and freed before the
next group. The groups run in three passes (``PASSES``), each timing a third of every figure's pairs with every
engine built afresh, so that a figure's pairs come from three moments of the run. About 9 minutes on 2 cores.

Usage (also ``python -m benchmarks --headline``):
    python -m benchmarks.headline [--pairs 21] [--passes 3] [--block-ms 60] [--warm-ms 150] [--out DIR]
                                  [--fbgemm-python PY] [--smoke]
    python -m benchmarks.headline --compare RUN_A/headline.json RUN_B/headline.json   # do two runs agree?
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
import time

from benchmarks import pairs

AGREEMENT = 0.15  # two runs of the headline agree when every figure is within 15% (max / min - 1)
# Each group's pairs are timed in this many passes over all the groups, each with a fresh build of every engine:
# this machine slows for tens of seconds at a time, and engines unequally (FBGEMM and ours more than the kernel),
# so a figure whose pairs all come from one minute carries that minute's state.
PASSES = 3


@dataclasses.dataclass(frozen=True)
class Headline:
    """One headline ratio: ``num`` engine's ms / ``den`` engine's ms in ``group`` ("base" = the group's ours).

    ``op``/``limit`` the target; ``ceiling`` = (num, den) of the same ratio for the kernel's engines (what the
    speed-of-light kernel shows possible), or a number, or None (the kernel lacks the step).
    An engine name ending in ``*`` is the best (lowest median) of the engines ``BEST_OF`` lists for it.
    """

    key: str
    label: str
    group: str
    num: str
    den: str
    op: str
    limit: float
    ceiling: tuple[str, str] | float | None = None
    note: str = ""


# Engines read as the best (lowest median) of several: FBGEMM with and without huge pages (the faster of the
# settings a PyTorch user could pick), and each one-thread engine of the speed-of-light kernel in its worker
# process or called directly in this one (the same code; the faster of the two is what the machine allows: a fresh
# worker's tables sometimes step up to 1.3x slower for as long as they live). The two-thread kernel runs in its
# worker only (OpenMP's threads in this process would share it with TensorFlow's).
BEST_OF: dict[str, tuple[str, ...]] = {
    "fbgemm*": ("fbgemm", "fbgemm_hp"),
    "sol*": ("sol", "sol_local"),
    "sol_bf16*": ("sol_bf16", "sol_bf16_local"),
    "sol_dynamic*": ("sol_dynamic", "sol_dynamic_local"),
}

# The kernel's dynamic-table step (`sol_dynamic*`) indexes its keys as our dynamic tables do (speed_of_light.py's
# KEY_INDEXES): row numbers in the buckets, each key with its count and last step in its row's record, within the
# tables' memory target of 32 bytes a row past the floats. An index with each key beside its row number ("wide")
# spends 32 bytes of index a row alone.
DYNAMIC_KEY_INDEX = "compact"

# The targets, each as a ratio of interleaved pairs.
HEADLINES: tuple[Headline, ...] = (
    *(
        Headline(
            f"{w}_{o}_sol",
            f"{w} {lab}: ours / speed-of-light kernel",
            f"{w}:{o}",
            "base",
            "sol*",
            "<=",
            1.25,
            ("sol_tf_halves", "sol_local"),
            "ceiling: the kernel's step as two ops of a tf.function, its forward half then its backward half (what "
            "any training step run by TensorFlow pays: the model's backward pass runs between them), over the "
            "kernel's step called directly, both in this process",
        )
        for w in ("W1", "W4")
        for o, lab in (("sgd", "SGD"), ("adagrad", "Adagrad"), ("adam", "lazy Adam"))
    ),
    *(
        Headline(
            f"{w}_sgd_fbgemm",
            f"{w} SGD: FBGEMM EXACT_SGD / ours",
            f"{w}:sgd",
            "fbgemm*",
            "base",
            ">=",
            1.3,
            ("fbgemm*", "sol*"),
        )
        for w in ("W1", "W2", "W4")
    ),
    Headline(
        "W1_adagrad_fbgemm",
        "W1 Adagrad: FBGEMM EXACT_ADAGRAD / ours",
        "W1:adagrad",
        "fbgemm*",
        "base",
        ">=",
        2.5,
        ("fbgemm*", "sol*"),
    ),
    Headline(
        "W1_rowwise_fbgemm",
        "W1 row-wise Adagrad: FBGEMM EXACT_ROWWISE_ADAGRAD / ours",
        "W1:rowwise_adagrad",
        "fbgemm*",
        "base",
        ">=",
        1.0,
        ("fbgemm*", "sol*"),
        "ceiling: FBGEMM over the kernel's SGD step (the kernel has no row-wise Adagrad; SGD's work is a lower bound)",
    ),
    *(
        Headline(
            f"W1_{o}_bf16",
            f"W1 {lab}: bf16 step / fp32 step (stochastic rounding)",
            f"W1:{o}",
            "bf16",
            "base",
            "<=",
            0.9,
            ("sol_bf16*", "sol*"),
        )
        for o, lab in (("sgd", "SGD"), ("adagrad", "Adagrad"), ("adam", "lazy Adam"))
    ),
    *(
        Headline(
            f"W1_{o}_dynamic",
            f"W1 {lab}: dynamic step / static step",
            f"W1:{o}",
            "dynamic",
            "base",
            "<=",
            1.3,
            ("sol_dynamic*", "sol*"),
            "ceiling: the kernel's keyed step over its static step, its index laid out as a dynamic table's within "
            "its memory target (row numbers in the buckets; each key, count and last step in its row's record, "
            "counted by the probe)",
        )
        for o, lab in (("sgd", "SGD"), ("adagrad", "Adagrad"))
    ),
    Headline(
        "W1_lookup_dynamic",
        "W1 lookup: dynamic / static",
        "W1:lookup",
        "dynamic",
        "base",
        "<=",
        1.2,
        ("sol_dynamic*", "sol*"),
        "ceiling: the kernel's keyed lookup (a dynamic table's index layout, one probe per id, then the gather) over "
        "its lookup",
    ),
    Headline(
        "W1_lookup_tf",
        "W1 lookup: tf.nn.embedding_lookup / ours",
        "W1:lookup",
        "tf_lookup",
        "base",
        ">=",
        2.0,
        ("tf_lookup", "sol_tf"),
        "ceiling: TensorFlow's lookup over the kernel's lookup as the one op of a tf.function (the least a lookup "
        "run by TensorFlow can cost)",
    ),
    Headline(
        "W1_tracking",
        "W1 Adagrad: tracked step / untracked step",
        "W1:adagrad",
        "tracked",
        "base",
        "<=",
        1.02,
        note="the base's own step and tables, with tracking on for the block (two tables differ by as much as "
        "tracking costs)",
    ),
    *(
        Headline(
            f"{w}_{o}_threads",
            f"{w} {lab}: 1 thread / 2 threads",
            f"{w}:{o}",
            "base",
            "ours_2t",
            ">=",
            1.6,
            ("sol", "sol_2t"),
        )
        for w in ("W1", "W4")
        for o, lab in (("sgd", "SGD"), ("adagrad", "Adagrad"), ("adam", "lazy Adam"))
    ),
)

# The engines each group times against its base, by the headlines that read them (derived, so a new headline
# needs no second list).
GROUPS: tuple[str, ...] = tuple(dict.fromkeys(h.group for h in HEADLINES))


def engines_of(group: str) -> list[str]:
    """The engines ``group`` needs beside its base: every one a headline or ceiling of the group names."""
    names: list[str] = []
    for h in HEADLINES:
        if h.group != group:
            continue
        for e in (h.num, h.den, *(h.ceiling if isinstance(h.ceiling, tuple) else ())):
            variants = BEST_OF.get(e, (e,))
            names += [v for v in variants if v != "base" and v not in names]
    return names


# ----------------------------------------------------------------------------------------------- statistics


def _pick(group_res: dict, engine: str) -> tuple[str | None, list[float] | None]:
    """(the engine's name, its pair ratios: its ms over the adjacent ours block's ms) in ``group_res``; ``base`` is
    1 in every round; a ``BEST_OF`` name the best of its engines."""
    rounds = group_res.get("rounds", 0)
    if engine == "base":
        return "base", [1.0] * rounds
    cands = BEST_OF.get(engine, (engine,))
    live = [(c, group_res["engines"][c]["ratios"]) for c in cands if group_res["engines"].get(c, {}).get("ratios")]
    if not live:
        return None, None
    return min(live, key=lambda cr: pairs.quantile(cr[1], 0.5))


def evaluate(h: Headline, result: dict) -> dict:
    """One headline's figure from a run's groups: stats of its per-round ratios, its ceiling, met / missed."""
    g = result["groups"].get(h.group)
    rec = {"key": h.key, "label": h.label, "target": f"{h.op} {h.limit:g}", "note": h.note}
    if g is None or "error" in g:
        rec["status"] = "not measured"
        rec["why"] = (g or {}).get("error", "group not run")
        return rec
    num_name, num = _pick(g, h.num)
    den_name, den = _pick(g, h.den)
    if num is None or den is None:
        missing = h.num if num is None else h.den
        rec["status"] = "not measured"
        first = BEST_OF.get(missing, (missing,))[0]
        rec["why"] = g["engines"].get(first, {}).get("error", f"engine {missing} not measured")
        return rec
    rec["engines"] = [num_name, den_name]
    rec.update(pairs.pair_stats(pairs.ratio_of_ratios(num, den)))
    ok = rec["median"] <= h.limit if h.op == "<=" else rec["median"] >= h.limit
    rec["status"] = "met" if ok else "missed"
    if isinstance(h.ceiling, tuple):
        cn, cnum = _pick(g, h.ceiling[0])
        cd, cden = _pick(g, h.ceiling[1])
        if cnum is not None and cden is not None:
            c = pairs.pair_stats(pairs.ratio_of_ratios(cnum, cden))
            rec["ceiling"] = {"median": c["median"], "q1": c["q1"], "q3": c["q3"], "n": c["n"], "engines": [cn, cd]}
    elif isinstance(h.ceiling, float):
        rec["ceiling"] = {"median": h.ceiling}
    if rec["status"] == "missed" and "ceiling" in rec:
        c = rec["ceiling"]["median"]
        rec["above_ceiling"] = c > h.limit if h.op == "<=" else c < h.limit
    return rec


def step_ms(result: dict, key: str) -> dict[str, float]:
    """The median ms a step of each of the two engines headline ``key`` divides, in a run (``ours`` from the blocks
    next to the other engine's): which engine moved when two runs disagree. {} when the run lacks them (a figure
    not measured, a run without per-block times, a headline no longer defined)."""
    h = next((x for x in HEADLINES if x.key == key), None)
    g = result.get("groups", {}).get(h.group) if h is not None else None
    if not g or "error" in g:
        return {}
    names = [_pick(g, h.num)[0], _pick(g, h.den)[0]]
    if None in names:
        return {}
    other = next((n for n in names if n != "base"), None)
    out = {}
    for n in names:
        vals = g["engines"][other].get("base_ms") if n == "base" else g["engines"][n].get("ms")
        if not vals:
            return {}
        out["ours" if n == "base" else n] = pairs.quantile(vals, 0.5)
    return out


def compare(a: dict, b: dict, tolerance: float = AGREEMENT) -> list[dict]:
    """Per headline measured in both runs: the two medians, how far apart, whether within ``tolerance``, and each
    run's step times of the two engines (``step_ms``)."""
    rows = []
    bk = {r["key"]: r for r in b["headlines"]}
    for ra in a["headlines"]:
        rb = bk.get(ra["key"])
        if rb is None or "median" not in ra or "median" not in rb:
            rows.append({"key": ra["key"], "label": ra["label"], "agree": None})
            continue
        d = pairs.agreement(ra["median"], rb["median"])
        rows.append(
            {
                "key": ra["key"],
                "label": ra["label"],
                "a": ra["median"],
                "b": rb["median"],
                "apart": d,
                "agree": d <= tolerance,
                "ms_a": step_ms(a, ra["key"]),
                "ms_b": step_ms(b, ra["key"]),
            }
        )
    return rows


# ----------------------------------------------------------------------------------------------- engines


def _local(step_fn, warmup: int):
    for _ in range(warmup):
        step_fn()
    return pairs.LocalEngine(step_fn)


class _Context:
    """The workers of one run (started on first use, one per workload and setting), the group's in-process kernel
    and the run's options."""

    def __init__(self, smoke: bool, fbgemm_python: str | None, warmup: int):
        self.smoke, self.fbgemm_python, self.warmup = smoke, fbgemm_python, warmup
        self.workers: dict[tuple, object] = {}
        # The group's InProcessKernels by (workload, optimizer, storage, keyed): sol_local, sol_tf and sol_tf_halves
        # step the same tables.
        self.kernels: dict[tuple, object] = {}

    def worker(self, key: tuple, start):
        if key not in self.workers:
            self.workers[key] = start()
        return self.workers[key]

    def local_kernel(self, wl, optimizer: str, storage: str = "fp32", keyed: bool = False):
        """The group's in-process kernel of this setting (built on first use, freed by ``close_local_kernels``);
        ``keyed`` steps on the dynamic benchmark's keys (W1's fingerprints)."""
        key = (wl.name, optimizer, storage, keyed)
        if key not in self.kernels:
            from benchmarks import speed_of_light as sol

            keys = [_dynamic_keys(wl.name, self.smoke)] if keyed else None
            self.kernels[key] = sol.InProcessKernel(
                wl, optimizer, warmup=self.warmup, storage=storage, keys=keys, key_index=DYNAMIC_KEY_INDEX
            )
        return self.kernels[key]

    def close_local_kernels(self) -> None:
        for kernel in self.kernels.values():
            kernel.close()
        self.kernels.clear()

    def close_workload(self, workload: str) -> None:
        for key in [k for k in self.workers if k[1] == workload]:
            self.workers.pop(key).close()

    def close(self) -> None:
        for w in self.workers.values():
            w.close()
        self.workers.clear()
        self.close_local_kernels()


def _dynamic_keys(workload: str, smoke: bool):
    """The row keys of the dynamic benchmark's table (W1's: farmhash fingerprints of its ids)."""
    from benchmarks import dynamic_benchmark as dyn

    if workload != "W1":
        raise ValueError(f"the dynamic engines run W1 only, not {workload}")
    return dyn.make_workload(smoke)[2]


def _build_engine(name: str, workload: str, opt: str, wl, ctx: _Context, base=None):
    """Engine ``name`` of group ``workload:opt`` (local or a worker's), warmed; ``base`` the group's ours."""
    from benchmarks import speed_of_light as sol

    w = ctx.warmup
    kernel_opt = "sgd" if opt == "rowwise_adagrad" else opt
    if name in ("sol", "sol_bf16", "sol_2t", "sol_dynamic"):
        worker = ctx.worker(("sol", workload), lambda: sol.worker(wl, warmup=w))
        keys = "ids"
        if name == "sol_dynamic":
            sol.write_keys(worker.scratch, [_dynamic_keys(workload, ctx.smoke)])
            keys = sol.WORKER_KEYS[DYNAMIC_KEY_INDEX]
        worker.prepare(
            name,
            optimizer=kernel_opt,
            storage="bf16" if name == "sol_bf16" else "fp32",
            threads=2 if name == "sol_2t" else 1,
            keys=keys,
        )
        return worker.engine(name)
    if name in ("fbgemm", "fbgemm_hp"):
        from benchmarks.peers import fbgemm

        if ctx.fbgemm_python is None:
            raise RuntimeError("FBGEMM absent: no interpreter with torch + fbgemm_gpu (--fbgemm-python)")
        hp = name == "fbgemm_hp"
        worker = ctx.worker((name, workload), lambda: fbgemm.worker(ctx.fbgemm_python, wl, warmup=w, huge_pages=hp))
        worker.prepare(opt, optimizer=opt)
        return worker.engine(opt)
    if name == "ours_2t":
        from benchmarks.workers import Worker

        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        worker = ctx.worker(
            ("ours_2t", "all"),
            lambda: Worker(
                [sys.executable, "-m", "benchmarks.ours_worker", "--threads", "2"], cwd=root, label="ours (2 threads)"
            ),
        )
        worker.prepare(f"{workload}_{opt}", workload=workload, optimizer=opt, smoke=int(ctx.smoke), warmup=w)
        return worker.engine(f"{workload}_{opt}")
    if name == "bf16":
        import tensorflow as tf

        from benchmarks import low_precision_benchmark as lp

        return _local(lp.fused_step(wl, opt, tf.bfloat16, "stochastic"), w)
    if name == "tracked":
        from benchmarks.tracked_blocks import TrackedBlocks

        if base is None or opt == "lookup":
            raise ValueError("tracked: needs the group's fused step (ours) as its base")
        return TrackedBlocks(base)
    if name == "dynamic":
        from benchmarks import dynamic_benchmark as dyn

        _, keys, vocab_keys = dyn.make_workload(ctx.smoke)
        if opt == "lookup":
            return _local(dyn.dynamic_lookup_step(wl, keys, vocab_keys), w)
        return _local(dyn.dynamic_step(wl, keys, vocab_keys, opt), w)
    if name == "tf_lookup":
        from benchmarks.peers import tf_native as tn

        return _local(tn.lookup_step(wl), w)
    if name in ("sol_local", "sol_tf", "sol_tf_halves"):
        kernel = ctx.local_kernel(wl, kernel_opt)
        if name == "sol_local":
            return _local(kernel.step, w)
        return _local(kernel.tensorflow_step(halves=name == "sol_tf_halves"), w)
    if name in ("sol_bf16_local", "sol_dynamic_local"):
        storage = "bf16" if name == "sol_bf16_local" else "fp32"
        return _local(ctx.local_kernel(wl, kernel_opt, storage, keyed=name == "sol_dynamic_local").step, w)
    raise ValueError(f"engine: unknown {name!r}")


def _base(workload: str, opt: str, wl, warmup: int):
    from benchmarks import ours

    if opt == "lookup":
        return _local(ours.lookup_step(wl), warmup)
    return _local(ours.fused_step(wl, opt), warmup)


def run_group(
    group: str, ctx: _Context, rounds: int, block_s: float, log=print, warm_s: float = 0.0, first: int = 0
) -> dict:
    """Builds the group's engines, sizes their blocks, times ``rounds`` rounds (each block after ``warm_s`` of
    untimed steps of its engine; ``first`` the index of the first, `pairs.run_pairs`); returns its record."""
    from benchmarks import workloads as wls

    workload, opt = group.split(":")
    wl = wls.WORKLOADS[workload](smoke=ctx.smoke)
    out: dict = {"workload": workload, "optimizer": opt, "engines": {}}
    t0 = time.time()
    try:
        base = _base(workload, opt, wl, ctx.warmup)
    except Exception as e:
        return {**out, "error": f"ours: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    engines = {}
    for name in engines_of(group):
        try:
            engines[name] = _build_engine(name, workload, opt, wl, ctx, base)
        except Exception as e:  # an engine that cannot run is reported, the others still are
            out["engines"][name] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
    steps = {"base": 1 if ctx.smoke else pairs.size_blocks(base, block_s, 0)}
    for name, eng in list(engines.items()):
        try:
            steps[name] = 1 if ctx.smoke else pairs.size_blocks(eng, block_s, 0)
        except Exception as e:
            out["engines"][name] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
            del engines[name]
    warm = {} if ctx.smoke else pairs.warm_steps(steps, block_s, warm_s)
    try:
        res = pairs.run_pairs(base, engines, steps, rounds, warm, first)
    finally:
        for eng in engines.values():  # a worker's state goes with its group (the worker serves the next one)
            if hasattr(eng, "worker"):
                try:
                    eng.worker.drop(eng.name)
                except Exception:
                    pass
        ctx.close_local_kernels()
    out["rounds"] = rounds
    out["base_steps"] = steps["base"]
    out["warm_steps"] = warm
    for name, r in res.items():
        out["engines"][name] = {**r, "steps": steps[name]}
    out["seconds"] = time.time() - t0
    log(f"{group}: {len(engines)} engines x {rounds} pairs in {out['seconds']:.0f} s")
    return out


def pass_rounds(pairs_per_ratio: int, passes: int) -> list[int]:
    """The rounds of each pass: ``pairs_per_ratio`` split as evenly as it goes, the first passes taking the rest
    (never a pass of no round: fewer passes when there are fewer pairs)."""
    if pairs_per_ratio < 1 or passes < 1:
        raise ValueError(f"pass_rounds: pairs and passes must be >= 1, got {pairs_per_ratio} and {passes}")
    passes = min(passes, pairs_per_ratio)
    return [pairs_per_ratio // passes + (1 if p < pairs_per_ratio % passes else 0) for p in range(passes)]


def merge_passes(records: list[dict]) -> dict:
    """One group's record from its passes' records (``run_group``'s, in order): every pass's pairs in order
    (``rounds`` added; each engine's ``ratios``, ``ms`` and ``base_ms`` joined) and ``passes``, one summary a pass.

    A figure pairs its engines round by round, so an engine that failed in one pass is reported with that pass's
    error ("pass N: ..." when there are several) and no pairs; a pass in which the whole group failed adds no
    pairs (its error is in its summary); a group that failed in every pass keeps the first pass's error."""
    summaries = []
    for p, rec in enumerate(records):
        summary = {"pass": p + 1, "rounds": rec.get("rounds", 0), "seconds": rec.get("seconds")}
        summary.update({k: rec[k] for k in ("error", "base_steps", "warm_steps") if k in rec})
        summaries.append(summary)
    ok = [(p, r) for p, r in enumerate(records) if "error" not in r]
    if not ok:
        return {**records[0], "passes": summaries}
    out = {k: ok[0][1][k] for k in ("workload", "optimizer")}
    out.update({"rounds": sum(r["rounds"] for _, r in ok), "engines": {}, "passes": summaries})
    for name in dict.fromkeys(n for _, r in ok for n in r["engines"]):
        recs = [r["engines"].get(name, {}) for _, r in ok]
        failed = [(p, r["engines"].get(name, {})) for p, r in ok if "ratios" not in r["engines"].get(name, {})]
        if failed:
            p, e = failed[0]
            where = f"pass {p + 1}: " if len(records) > 1 else ""
            out["engines"][name] = {"error": where + e.get("error", "not run")}
            continue
        out["engines"][name] = {k: [x for e in recs for x in e[k]] for k in ("ratios", "ms", "base_ms")}
        out["engines"][name]["steps"] = [e.get("steps") for e in recs]
    out["seconds"] = sum(r.get("seconds", 0.0) for r in records)
    return out


def run(
    pairs_per_ratio: int = 21,
    block_ms: float = 60.0,
    warm_ms: float = pairs.WARM_S * 1e3,
    smoke: bool = False,
    fbgemm_python: str | None = None,
    groups: tuple[str, ...] = GROUPS,
    log=print,
    passes: int = PASSES,
) -> dict:
    """Runs every group in ``passes`` passes (``pass_rounds``); returns {"meta", "groups", "headlines"}."""
    from benchmarks import suite

    opts = suite.Options(smoke=smoke)
    meta = suite.host_meta(opts)
    split = pass_rounds(pairs_per_ratio, passes)
    meta.update(
        {
            "method": "interleaved pairs",
            "pairs": pairs_per_ratio,
            "passes": len(split),
            "block_ms": block_ms,
            "warm_ms": warm_ms,
        }
    )
    ctx = _Context(smoke, fbgemm_python, warmup=1 if smoke else 3)
    result = {"meta": meta, "groups": {}}
    per_pass: dict[str, list] = {g: [] for g in groups}
    t0 = time.time()
    try:
        for p, rounds in enumerate(split):
            first = sum(split[:p])
            for workload in dict.fromkeys(g.split(":")[0] for g in groups):
                for g in [g for g in groups if g.startswith(workload + ":")]:
                    log(f"pass {p + 1}/{len(split)}: {g}")
                    per_pass[g].append(run_group(g, ctx, rounds, block_ms / 1e3, log, warm_ms / 1e3, first))
                    gc.collect()
                ctx.close_workload(workload)  # each pass builds every engine afresh, workers included
    finally:
        ctx.close()
    result["groups"] = {g: merge_passes(recs) for g, recs in per_pass.items() if recs}
    meta["wall_s"] = time.time() - t0
    meta["host"]["load_avg_at_end"] = os.getloadavg()
    result["headlines"] = [evaluate(h, result) for h in HEADLINES if h.group in groups]
    return result


# ----------------------------------------------------------------------------------------------- report


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _passes_clause(passes: int) -> str:
    if passes == 1:
        return "engine, all of a figure's pairs in one stretch; "
    return (
        f"engine; a figure's pairs come from {passes} passes over all the figures, each with every engine built "
        "afresh; "
    )


def markdown(result: dict) -> str:
    """HEADLINE.md: one row per headline ratio."""
    m = result["meta"]
    host = m.get("host", {})
    lines = [
        "# Headline ratios (interleaved pairs)",
        "",
        f"Run {m.get('date_utc', '?')} UTC on {host.get('cpu', '?')} ({host.get('logical_cpus', '?')} logical CPUs, "
        f"load average at start {host.get('load_avg_at_start', ['?'])[0]}, at end "
        f"{host.get('load_avg_at_end', ['?'])[0]}), TensorFlow {m.get('tensorflow', '?')}, "
        f"{m.get('wall_s', 0):.0f} s.",
        "",
        "Each figure is the median of per-pair ratios: every block of ours (about "
        f"{m.get('block_ms', 0):g} ms of steps) is timed next to a block of the other engine, which of the two "
        f"first alternating, and every block follows {m.get('warm_ms', 0):g} ms of untimed steps of its own "
        + _passes_clause(m.get("passes", 1))
        + "the spread is the interquartile range of the pair ratios, *level* when it straddles 1. "
        "Each one-thread engine of the kernel (static, bf16, keyed) is the faster of its worker process and its "
        "step called directly in this process, in the figures and their ceilings (the two-thread kernel runs in its "
        "worker only); the kernel's keyed step (the dynamic ceilings) indexes its keys as our dynamic tables do, "
        "within their memory target; FBGEMM the faster of its runs with and without huge pages. "
        "A ceiling is the same ratio for the speed-of-light kernel's engines in the same rounds (what this machine "
        "shows possible for the target); for ours over the kernel, the kernel's step as two ops of a tf.function "
        "(its forward half, then its backward half, as a training step must run them) over the kernel's step called "
        "directly, both in this process (no training step run by TensorFlow costs less than its work run that way).",
        "",
        "| target | measured (median [IQR]) | pairs | status | vs 1 | ceiling |",
        "|---|---|---:|---|---|---|",
    ]
    for r in result["headlines"]:
        if "median" not in r:
            lines.append(f"| {r['label']} {r['target']} | — | 0 | not measured: {r.get('why', '')} | | |")
            continue
        status = r["status"] if r["status"] == "met" else f"**{r['status']}**"
        if r.get("above_ceiling"):
            status += " (target above the ceiling)"
        vs1 = "level" if r["level"] else ("below 1" if r["q3"] < 1 else "above 1")
        c = r.get("ceiling")
        ceiling = (
            "—" if c is None else (_fmt(c["median"]) + (f" [{_fmt(c['q1'])}-{_fmt(c['q3'])}]" if "q1" in c else ""))
        )
        lines.append(
            f"| {r['label']} {r['target']} | {_fmt(r['median'])} [{_fmt(r['q1'])}-{_fmt(r['q3'])}] | {r['n']} | "
            f"{status} | {vs1} | {ceiling} |"
        )
    errors = [
        f"- {g} {e}: {rec['error']}"
        for g, grp in result["groups"].items()
        for e, rec in grp.get("engines", {}).items()
        if "error" in rec
    ]
    if errors:
        lines += ["", "Engines that did not run:", "", *errors]
    return "\n".join(lines) + "\n"


def compare_markdown(rows: list[dict], tolerance: float = AGREEMENT) -> str:
    lines = [
        f"| ratio | run A | run B | apart | within {tolerance:.0%} | ms a step, run A / run B |",
        "|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        if r["agree"] is None:
            lines.append(f"| {r['label']} | — | — | — | not in both | |")
            continue
        agree = "yes" if r["agree"] else "**no**"
        ms_a, ms_b = r.get("ms_a", {}), r.get("ms_b", {})
        ms = "; ".join(f"{e} {ms_a[e]:.3g} / {ms_b[e]:.3g}" for e in ms_a if e in ms_b) or "—"
        lines.append(f"| {r['label']} | {_fmt(r['a'])} | {_fmt(r['b'])} | {r['apart']:.1%} | {agree} | {ms} |")
    return "\n".join(lines) + "\n"


def write(result: dict, out: str) -> list[str]:
    os.makedirs(out, exist_ok=True)
    jpath, mpath = os.path.join(out, "headline.json"), os.path.join(out, "HEADLINE.md")
    with open(jpath, "w") as f:
        json.dump(result, f, indent=1)
    with open(mpath, "w") as f:
        f.write(markdown(result))
    return [jpath, mpath]


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(prog="python -m benchmarks.headline", description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=21, help="pairs per ratio (rounds per group, over all passes)")
    p.add_argument(
        "--passes",
        type=int,
        default=PASSES,
        help="passes over all the groups, each timing its share of the pairs with a fresh build of every engine",
    )
    p.add_argument("--block-ms", type=float, default=60.0, help="target length of one block")
    p.add_argument(
        "--warm-ms",
        type=float,
        default=pairs.WARM_S * 1e3,
        help="untimed steps of an engine right before each of its blocks, in ms (0: none)",
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 2 pairs: an end-to-end check")
    p.add_argument("--out", default=None, help="output directory (default: a new scratch directory)")
    p.add_argument("--fbgemm-python", default=None, help="interpreter with torch + fbgemm-gpu-cpu")
    p.add_argument("--no-fbgemm", action="store_true", help="skip FBGEMM (its figures read 'not measured')")
    p.add_argument("--groups", default="", help=f"comma-separated groups among {', '.join(GROUPS)}")
    p.add_argument(
        "--compare",
        nargs=2,
        metavar="JSON",
        help="run nothing: do two headline.json files agree within 15%% (with --out: also DIR/AGREEMENT.md)?",
    )
    args = p.parse_args(argv)
    if args.compare:
        runs = []
        for path in args.compare:
            with open(path, encoding="utf-8") as f:
                runs.append(json.load(f))
        rows = compare(*runs)
        text = compare_markdown(rows)
        print(text, end="")
        if args.out:
            dates = " and ".join(r["meta"].get("date_utc", "?") + " UTC" for r in runs)
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "AGREEMENT.md"), "w", encoding="utf-8") as f:
                f.write(f"# Two headline runs ({dates})\n\nA figure agrees when max / min - 1 <= {AGREEMENT:.0%}.\n\n")
                f.write(text)
            print("wrote", os.path.join(args.out, "AGREEMENT.md"))
        return 0 if all(r["agree"] is not False for r in rows) else 1
    groups = tuple(g for g in args.groups.split(",") if g) or GROUPS
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        p.error(f"--groups: unknown {bad}; choose from {GROUPS}")
    if args.pairs < 1:
        p.error("--pairs must be >= 1")
    if args.passes < 1:
        p.error("--passes must be >= 1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from benchmarks.peers import fbgemm

    fb = None if args.no_fbgemm else fbgemm.find_python(args.fbgemm_python)
    result = run(
        pairs_per_ratio=2 if args.smoke else args.pairs,
        block_ms=args.block_ms,
        warm_ms=args.warm_ms,
        smoke=args.smoke,
        fbgemm_python=fb if fb is not None and fbgemm.available(fb)[0] else None,
        groups=groups,
        log=lambda m: print(m, flush=True),
        passes=1 if args.smoke else args.passes,
    )
    out = args.out or tempfile.mkdtemp(prefix="tf_embed_ops_headline_")
    written = write(result, out)
    from benchmarks import readme_speed

    if os.path.realpath(out) == os.path.realpath(os.path.dirname(readme_speed.HEADLINE)) and not args.smoke:
        written.append(readme_speed.update_readme())  # the README's speed paragraph quotes the committed run
    for path in written:
        print("wrote", path)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
