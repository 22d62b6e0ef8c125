"""Turns the suite's result dict into JSON files, a markdown report and PNG plots.

Files written into the output directory:

* ``suite.json`` — everything; ``W1.json`` ... ``W4.json``, ``sweeps.json``, ``threads.json``, ``lookup.json``,
  ``accumulator_suite.json`` (``accumulator.json`` belongs to the standalone accumulator_benchmark.py),
  ``bandwidth.json``, ``parity.json`` — the same records split by section.
* ``REPORT.md`` — the tables, the targets marked met / missed, and the plots.
* ``w1_engines.png``, ``speedups.png``, ``sweeps.png`` — small PNGs (matplotlib, Agg backend) the README embeds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from benchmarks import checkpoint_benchmark, report_dynamic, report_serving, report_serving_quant, tiered_benchmark

ENGINE_LABELS = {
    "ours": "tf_embed_ops (fused)",
    "keras": "Keras 3 optimizer",
    "raw_op": "tf.raw_ops sparse apply",
    "fbgemm": "FBGEMM TBE (CPU)",
    "fbgemm_rowwise": "FBGEMM row-wise Adagrad",
    "tf_lookup": "tf.nn.embedding_lookup(_sparse)",
    "keras_rs": "keras-rs DistributedEmbedding on CPU (the model's Adam)",
    "ours_keras_rs": "tf_embed_ops.keras.DistributedEmbedding (table Adam)",
    "speed_of_light": "speed-of-light kernel (C++, no framework)",
    "tf_empty_step": "empty tf.function step",
    "ours_one_id": "ours, fused SGD step on one id",
}
OPT_LABELS = {
    "sgd": "SGD",
    "adagrad": "Adagrad",
    "adagrad_momentum": "AdagradMomentum",
    "adam": "Adam (lazy)",
    "adam_nonlazy": "Adam (non-lazy)",
    "ftrl": "FTRL",
    "momentum": "Momentum",
    "rms_prop": "RMSProp",
    "centered_rms_prop": "CenteredRMSProp",
    "rowwise_adagrad": "RowWiseAdagrad",
    "lookup": "lookup only",
}
PEERS = ("keras", "raw_op", "fbgemm", "fbgemm_rowwise", "speed_of_light")


# --------------------------------------------------------------------------------------------------- helpers
def _index(runs: list[dict], section: str) -> dict[tuple[str, str, str], dict]:
    return {(r["workload"], r["optimizer"], r["engine"]): r for r in runs if r.get("section") == section}


def _find(recs: list[dict], **match) -> dict | None:
    """The first record whose fields equal ``match``."""
    return next((r for r in recs if all(r.get(k) == v for k, v in match.items())), None)


def _ms(rec: dict | None) -> str:
    if rec is None:
        return "—"
    if "error" in rec:
        return "n/a"
    return f"{rec['median_ms']:.3g} ± {rec['iqr_ms'] / 2:.2g}"


def _ratio(peer: dict | None, mine: dict | None) -> float | None:
    if not peer or not mine or "median_ms" not in peer or "median_ms" not in mine or mine["median_ms"] <= 0:
        return None
    return peer["median_ms"] / mine["median_ms"]


def _fmt_ratio(x: float | None) -> str:
    if x is None:
        return "—"
    return f"**{x:.3g}x**" if x >= 1 else f"{x:.2g}x"


def _peer_cell(peer: dict | None, mine: dict | None) -> str:
    if peer is None:
        return "—"
    if "error" in peer:
        return "n/a"
    return f"{peer['median_ms']:.3g} ({_fmt_ratio(_ratio(peer, mine))})"


def _rate(x: float | None) -> str:
    if not x:
        return "—"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


# --------------------------------------------------------------------------------------------------- targets
@dataclasses.dataclass(frozen=True)
class Target:
    """One target of the report: ``measured = num's median_ms / den's median_ms`` (a speedup: a peer's time, or
    ours at one thread, over ours), or, with ``fraction``, that record's fraction of the bandwidth bound.

    Records are picked by matching fields (``_rec``).  Met when measured >= goal; "not measured" when a record is
    missing or failed.  Adding a target is one line in ``TARGETS``.
    """

    name: str
    goal: float
    how: str
    num: dict | None = None
    den: dict | None = None
    fraction: dict | None = None


def _rec(workload: str, optimizer: str, engine: str = "ours", section: str | None = None, **extra) -> dict:
    """The fields that pick one run record (section defaults to the workload's own section)."""
    return {"section": section or workload, "workload": workload, "optimizer": optimizer, "engine": engine, **extra}


# The speed targets, measured against the speed-of-light kernel (benchmarks/speed_of_light.cc: the step's work as
# one hand-written loop) on W1 and W4 for the lazy optimizers it implements; against FBGEMM for SGD and Adagrad;
# serving lookups against tf.nn.embedding_lookup; two threads against one; plus the earlier Keras 3 Adam targets.
_SOL_OPTIMIZERS = ("sgd", "adagrad", "adam")
TARGETS: list[Target] = (
    [
        Target(
            f"{w} {OPT_LABELS[o]}: >= 0.8x the speed-of-light kernel",
            0.8,
            "speed-of-light ms / ours ms",
            _rec(w, o, "speed_of_light"),
            _rec(w, o),
        )
        for w in ("W1", "W4")
        for o in _SOL_OPTIMIZERS
    ]
    + [
        Target(
            f"{w} SGD: >= 1.3x FBGEMM EXACT_SGD",
            1.3,
            "FBGEMM EXACT_SGD ms / ours ms",
            _rec(w, "sgd", "fbgemm"),
            _rec(w, "sgd"),
        )
        for w in ("W1", "W2", "W4")
    ]
    + [
        Target(
            "W1 element-wise Adagrad: >= 2.5x FBGEMM",
            2.5,
            "FBGEMM EXACT_ADAGRAD ms / ours ms",
            _rec("W1", "adagrad", "fbgemm"),
            _rec("W1", "adagrad"),
        ),
        Target(
            "W1 RowWiseAdagrad: >= 1.0x FBGEMM EXACT_ROWWISE_ADAGRAD",
            1.0,
            "FBGEMM EXACT_ROWWISE_ADAGRAD ms / our RowWiseAdagrad ms",
            _rec("W1", "adagrad", "fbgemm_rowwise"),
            _rec("W1", "rowwise_adagrad"),
        ),
        Target(
            "W1 serving lookup: >= 2x tf.nn.embedding_lookup",
            2.0,
            "tf.nn.embedding_lookup ms / our lookup ms (Lookup section)",
            _rec("W1", "lookup", "tf_lookup", section="lookup"),
            _rec("W1", "lookup", section="lookup"),
        ),
    ]
    + [
        Target(
            f"{w} {OPT_LABELS[o]}: 2 threads >= 1.6x 1 thread",
            1.6,
            "ours ms at 1 thread / ours ms at 2 threads (Threads section)",
            _rec(w, o, section="threads", threads=1),
            _rec(w, o, section="threads", threads=2),
        )
        for w in ("W1", "W4")
        for o in ("sgd", "adagrad", "adam")
    ]
    + [
        Target(
            "W1 Adam (lazy): >= 100x Keras 3 Adam",
            100.0,
            "Keras 3 Adam ms / our lazy Adam ms",
            _rec("W1", "adam", "keras"),
            _rec("W1", "adam"),
        ),
        Target(
            "W1 Adam (non-lazy): >= 100x Keras 3 Adam",
            100.0,
            "same update rule on every row",
            _rec("W1", "adam_nonlazy", "keras"),
            _rec("W1", "adam_nonlazy"),
        ),
        Target(
            "W1 Adam (non-lazy): within 2x of the bandwidth bound",
            0.5,
            "bound ms / ours ms (>= 0.5; every row is read and written: a streaming pass the bound models well)",
            fraction=_rec("W1", "adam_nonlazy"),
        ),
    ]
)


def _ceiling(runs: list[dict], t: Target) -> float | None:
    """The most the target's ratio could show on this machine, from the speed-of-light kernel's time.

    A speedup over a peer: the peer's time over the kernel's (no engine beats a hand-written loop of the same
    work); a ratio to the kernel: 1; two threads over one: the kernel's own 2-thread speedup. Where the kernel has
    no such step (an optimizer or a lookup it does not implement), the peer's time over our bandwidth bound.
    """
    if t.fraction is not None:
        return 1.0
    num, den = _find(runs, **t.num), _find(runs, **t.den)
    if t.num.get("engine") == "speed_of_light":
        return 1.0
    if t.num.get("engine") == "ours":  # threads: ours at 1 over ours at 2 -> the kernel's 1 over its 2
        return _ratio(
            _find(runs, **{**t.num, "engine": "speed_of_light"}), _find(runs, **{**t.den, "engine": "speed_of_light"})
        )
    sol = _find(runs, **{**t.den, "engine": "speed_of_light"})
    if num and sol and "median_ms" in num and "median_ms" in sol:
        return num["median_ms"] / sol["median_ms"]
    bound = (den or {}).get("bound", {}).get("bound_ms")
    if num and "median_ms" in num and bound:
        return num["median_ms"] / bound
    return None


def targets(result: dict) -> list[dict]:
    """Every target of ``TARGETS`` with its measured value, met / missed / not measured, and its ceiling."""
    runs = result["runs"]
    out = []
    for t in TARGETS:
        if t.fraction is not None:
            rec = _find(runs, **t.fraction)
            measured = rec.get("fraction_of_bound") if rec and "error" not in rec else None
        else:
            measured = _ratio(_find(runs, **t.num), _find(runs, **t.den))
        status = "not measured" if measured is None else ("met" if measured >= t.goal else "missed")
        out.append(
            {
                "target": t.name,
                "measured": measured,
                "goal": t.goal,
                "status": status,
                "how": t.how,
                "ceiling": _ceiling(runs, t),
            }
        )
    return out


# --------------------------------------------------------------------------------------------------- markdown
def _workload_table(result: dict, name: str) -> list[str]:
    idx = _index(result["runs"], name)
    opts = []
    for _, o, _ in idx:
        if o not in opts:
            opts.append(o)
    if not opts:
        return []
    lines = [
        "| optimizer | ours ms/step (median ± IQR/2) | unique rows/s | fraction of bound | Keras 3 ms (speedup) "
        "| raw ops ms (speedup) | FBGEMM ms (speedup) | FBGEMM row-wise ms (speedup) "
        "| speed of light ms (fraction reached) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for o in opts:
        mine = idx.get((name, o, "ours"))
        frac = mine.get("fraction_of_bound") if mine and "error" not in mine else None
        cells = [
            OPT_LABELS.get(o, o),
            _ms(mine),
            _rate(mine.get("unique_rows_per_s") if mine else None),
            f"{frac:.2f}" if frac is not None else "—",
        ]
        cells += [_peer_cell(idx.get((name, o, p)), mine) for p in PEERS]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _keras_rs_lines(result: dict) -> list[str]:
    """keras-rs's layer as it runs off TPU against ours from the same configs, per workload and optimizer."""
    runs = [r for r in result["runs"] if r.get("engine") in ("keras_rs", "ours_keras_rs")]
    if not runs:
        return []
    out = [
        "## keras-rs `DistributedEmbedding` on CPU",
        "",
        f"{ENGINE_LABELS['keras_rs']} against {ENGINE_LABELS['ours_keras_rs']}, same configs, same run "
        "(speedup = keras-rs time / ours).",
        "",
        "| workload | optimizer | keras-rs (ms) | ours (ms) | speedup |",
        "|---|---|---|---|---|",
    ]
    pairs = sorted({(r["workload"], r["optimizer"]) for r in runs})
    for workload, optimizer in pairs:
        peer = _find(runs, workload=workload, optimizer=optimizer, engine="keras_rs")
        mine = _find(runs, workload=workload, optimizer=optimizer, engine="ours_keras_rs")
        out.append(
            f"| {workload} | {OPT_LABELS.get(optimizer, optimizer)} | {_ms(peer)} | {_ms(mine)} | "
            f"{_fmt_ratio(_ratio(peer, mine))} |"
        )
    return out + [""]


def _errors(result: dict) -> list[str]:
    lines = []
    for r in result["runs"]:
        if "error" in r:
            lines.append(
                f"- {r.get('workload', r.get('section'))} / {OPT_LABELS.get(r.get('optimizer'), '')} / "
                f"{ENGINE_LABELS.get(r.get('engine'), r.get('engine'))}: `{r['error']}`"
            )
    return lines


def _load_at_end(meta: dict) -> str:
    """The report line's ', at end X' when the run recorded its final load average (older JSON did not)."""
    end = meta["host"].get("load_avg_at_end")
    return f", at end {end[0]:.2f}" if end else ""


def markdown(result: dict, plots: list[str]) -> str:
    meta, peers = result["meta"], result["peers"]
    bw = result.get("bandwidth")
    out = ["# tf_embed_ops benchmark report", ""]
    out.append(
        f"Run {meta['date_utc']} UTC on {meta['host']['cpu'] or 'unknown CPU'} "
        f"({meta['host']['logical_cpus']} logical CPUs, load average at start "
        f"{meta['host']['load_avg_at_start'][0]:.2f}{_load_at_end(meta)}), TensorFlow {meta['tensorflow']}, "
        f"{meta['threads']} intra-op thread(s){', **smoke sizes**' if meta['smoke'] else ''}. "
        f"Each figure is the median over {meta['blocks']} alternating blocks (spread: interquartile range); "
        "speedup = peer ms / ours ms (bold when we are faster)."
    )
    if meta.get("load_by_section"):
        out.append("")
        out.append(
            "Load average (1 min) as each section started (the run's own process adds about 1; the threads "
            "section's two-thread child about 2): "
            + ", ".join(f"{name} {at} UTC {load:.2f}" for name, at, load in meta["load_by_section"])
            + "."
        )
    out.append("")
    fb = peers.get("fbgemm", {})
    state = "**available**" if fb.get("available") else "**absent**"
    out.append(f"- FBGEMM peer: {state} — {fb.get('note', '')}")
    if not peers.get("ours", {}).get("available", True):
        out.append(f"- **Our op library did not load**: {peers['ours']['note']}")
    if bw:
        when = ", best of the probes at the start and the end of the run" if result.get("bandwidth_probes") else ""
        out.append(
            f"- Bandwidth probe ({bw['threads']} thread(s), {bw['buffer_mb']} MiB buffers{when}): "
            f"streaming read "
            f"{bw['stream_read_gbs']:.1f} GB/s, write {bw['stream_write_gbs']:.1f} GB/s, copy "
            f"{bw['stream_copy_gbs']:.1f} GB/s; random-row read-modify-write "
            + ", ".join(f"{r['random_rmw_gbs']:.1f} GB/s @ dim {r['dim']}" for r in bw["rows"])
            + "."
        )
    else:
        out.append(f"- Bandwidth probe unavailable: {meta.get('bandwidth_error', 'not run')}")
    out.append("")

    tg = targets(result)
    if any(t["status"] != "not measured" for t in tg) or "W1" in result["workloads"]:
        out += [
            "## Targets",
            "",
            "*Ceiling* = what the speed-of-light kernel (the step's work as one hand-written C++ loop, same ids) "
            "shows possible on this machine: for a speedup over a peer, the peer's time over the kernel's; for two "
            "threads, the kernel's own 2-thread speedup; where the kernel lacks the step, the peer's time over our "
            "bandwidth bound. A target above its ceiling cannot be met by any kernel of this design here.",
            "",
            "| target | measured | status | ceiling | how |",
            "|---|---|---|---|---|",
        ]
        for t in tg:
            m = "—" if t["measured"] is None else f"{t['measured']:.3g}"
            c = "—" if t.get("ceiling") is None else f"{t['ceiling']:.3g}"
            status = {"met": "met", "missed": "**missed**", "not measured": "not measured"}[t["status"]]
            out.append(f"| {t['target']} | {m} | {status} | {c} | {t['how']} |")
        out.append("")

    for name in ("W1", "W2", "W3", "W4"):
        if name not in result["workloads"]:
            continue
        wl = result["workloads"][name]
        out += [
            f"## {name}: {wl['description']}",
            "",
            f"{wl['num_ids']:,} ids per step, {sum(wl['unique_rows']):,} distinct rows touched.",
            "",
        ]
        out += _workload_table(result, name)
        out.append("")

    lk = [r for r in result["runs"] if r.get("section") == "lookup"]
    if lk:
        out += [
            "## Lookup only (serving)",
            "",
            "| workload | ours ms | TF ms (speedup) | TF op | fraction of bound |",
            "|---|---|---|---|---|",
        ]
        for wname in sorted({r["workload"] for r in lk}):
            mine = next((r for r in lk if r["workload"] == wname and r["engine"] == "ours"), None)
            peer = next((r for r in lk if r["workload"] == wname and r["engine"] == "tf_lookup"), None)
            frac = mine.get("fraction_of_bound") if mine else None
            out.append(
                f"| {wname} | {_ms(mine)} | {_peer_cell(peer, mine)} | {peer.get('detail', '') if peer else ''}"
                f" | {'—' if frac is None else f'{frac:.2f}'} |"
            )
        out.append("")

    floor = {r["engine"]: r for r in result["runs"] if r.get("section") == "floor"}
    if floor:
        w1 = {r["optimizer"]: r for r in result["runs"] if r.get("section") == "W1" and r.get("engine") == "ours"}
        sgd = w1.get("sgd")
        share = (
            f" — {floor['ours_one_id']['median_ms'] / sgd['median_ms']:.0%} of our W1 SGD step"
            if sgd and "median_ms" in sgd and "median_ms" in floor.get("ours_one_id", {})
            else ""
        )
        out += [
            "## Dispatch floor",
            "",
            "What a step costs before any row is touched, through the same harness: an empty `tf.function`, and "
            "our fused SGD step on one id (input normalisation, two op calls, config and variable look-ups)"
            f"{share}. The speed-of-light kernel has no such floor.",
            "",
            "| step | ms |",
            "|---|---|",
        ]
        out += [f"| {ENGINE_LABELS.get(e, e)} | {_ms(r)} |" for e, r in floor.items()]
        out.append("")

    sweep = [r for r in result["runs"] if str(r.get("section", "")).startswith("sweep:")]
    if sweep:
        out += [
            "## Scaling (W1 with one knob moved)",
            "",
            "ms/step of ours; in brackets the speedup over the raw-op path and over FBGEMM (same optimizer).",
            "",
        ]
        for axis in sorted({r["axis"] for r in sweep}):
            recs = [r for r in sweep if r["axis"] == axis]
            opts = sorted({r["optimizer"] for r in recs}, key=list(OPT_LABELS).index)
            points = sorted({r["point"] for r in recs})
            out.append(f"| {axis} | " + " | ".join(OPT_LABELS[o] for o in opts) + " |")
            out.append("|---" * (len(opts) + 1) + "|")
            for p in points:
                cells = []
                for o in opts:
                    mine = _find(recs, point=p, optimizer=o, engine="ours")
                    extra = []
                    for e, lbl in (("raw_op", "raw"), ("fbgemm", "FBGEMM")):
                        r = _ratio(_find(recs, point=p, optimizer=o, engine=e), mine)
                        if r is not None:
                            extra.append(f"{_fmt_ratio(r)} {lbl}")
                    cells.append(f"{_ms(mine)}" + (f" ({', '.join(extra)})" if extra else ""))
                out.append(f"| {p:g} | " + " | ".join(cells) + " |")
            out.append("")

    th = [r for r in result["runs"] if r.get("section") == "threads"]
    if th:
        out += [
            "## Threads (W1, W4)",
            "",
            "| threads | workload | optimizer | ours ms | raw ops ms (speedup) | Keras ms (speedup) "
            "| FBGEMM ms (speedup) | speed of light ms (speedup) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for t in sorted({r.get("threads", 0) for r in th}):
            recs = [r for r in th if r.get("threads") == t]
            for r in recs:
                if "engine" in r and r["engine"] == "all":
                    out.append(f"| {t} | — | — | failed: `{r['error']}` | | | | |")
            for w in sorted({r["workload"] for r in recs if "workload" in r}):
                for o in [o for o in OPT_LABELS if any(r.get("optimizer") == o for r in recs)]:
                    mine = _find(recs, workload=w, optimizer=o, engine="ours")
                    if mine is None:
                        continue
                    cells = [
                        _peer_cell(_find(recs, workload=w, optimizer=o, engine=e), mine)
                        for e in ("raw_op", "keras", "fbgemm", "speed_of_light")
                    ]
                    out.append(f"| {t} | {w} | {OPT_LABELS[o]} | {_ms(mine)} | " + " | ".join(cells) + " |")
        out.append("")

    acc = result.get("accumulator")
    if acc:
        out += ["## SparseConditionalAccumulator", ""]
        if "error" in acc:
            out.append(f"Not measured: {acc['error']}")
        else:
            c = acc["config"]
            out += [
                f"One round = {c['applies']} applies of {c['rows']:,} rows x {c['width']} float32, then one take "
                "(TF1 graph, same session; ours also eagerly).",
                "",
                "| case | TensorFlow ms | ours (graph) ms (speedup) | ours (eager) ms (speedup) |",
                "|---|---|---|---|",
            ]
            for case, row in acc["cases"].items():
                if "error" in row:
                    out.append(f"| {case} | error: `{row['error']}` | | |")
                    continue
                tfr = row.get("tensorflow")
                out.append(
                    f"| {case} | {_ms(tfr)} | {_ms(row.get('tf_embed_ops_graph'))} "
                    f"({_fmt_ratio(_ratio(tfr, row.get('tf_embed_ops_graph')))}) | "
                    f"{_ms(row.get('tf_embed_ops_eager'))} "
                    f"({_fmt_ratio(_ratio(tfr, row.get('tf_embed_ops_eager')))}) |"
                )
        out.append("")

    par = result.get("parity")
    if par:
        out += [
            "## Parity (same work)",
            "",
            "Ours and a peer (the raw-op path: tables and slots; the speed-of-light kernel: tables) start from "
            "the same state, take the same steps on small versions of the workloads, and their state is "
            "compared: the ratios above compare engines computing the same update.",
            "",
            "| workload | optimizer | peer | max abs difference | largest update |",
            "|---|---|---|---|---|",
        ]
        for r in par:
            head = (
                f"| {r['workload']} | {OPT_LABELS.get(r['optimizer'], r['optimizer'])} | "
                f"{ENGINE_LABELS[r.get('peer', 'raw_op')]} |"
            )
            if "error" in r:
                out.append(f"{head} not run: `{r['error'][:160]}` | |")
            else:
                out.append(f"{head} {r['max_abs_diff']:.2g} | {r['max_abs_update']:.2g} |")
        out.append("")
    out += _keras_rs_lines(result)
    if plots:
        out += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    errs = _errors(result)
    if errs:
        out += ["## Engines that did not run", ""] + errs + [""]
    out += [
        "## Method",
        "",
        "- One step = forward (look up + combine), then backward + optimizer update given a fixed upstream "
        "gradient for the activations, on the same ids for every engine (Zipf ids scattered over the vocabulary "
        "by a fixed permutation). Hyper-parameters are the TPU ones (no Adam bias correction, Adagrad without "
        "epsilon). TensorFlow engines run in a `tf.function`; FBGEMM runs its module's forward and "
        "`backward(grad)`, which applies its fused optimizer.",
        "- Ours, Keras 3 and the raw-op path run in one process and alternate block by block; FBGEMM runs in its "
        "own interpreter (torch cannot share one with TensorFlow) right after, on the same ids.",
        "- Fraction of bound = (least bytes the step must move / measured bandwidth) / measured time; rows "
        "touched by the update are costed at the probe's random-row read-modify-write bandwidth, activations, "
        "upstream gradients and ids at the streaming copy bandwidth (benchmarks/bandwidth.py).",
        "",
    ]
    out += report_dynamic.section(result)
    out += report_serving_quant.section(result)
    out += report_serving.section(result)
    out += checkpoint_benchmark.section(result)
    out += tiered_benchmark.section(result)
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------- plots
def plot(result: dict, out_dir: str) -> list[str]:
    """Writes the PNGs; returns their file names (empty if matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return []
    files = []
    colors = {
        "ours": "#1b9e77",
        "keras": "#d95f02",
        "raw_op": "#7570b3",
        "fbgemm": "#e7298a",
        "fbgemm_rowwise": "#e6ab02",
        "tf_lookup": "#666666",
    }

    idx = _index(result["runs"], "W1")
    opts = [o for o in OPT_LABELS if any(k[1] == o for k in idx)]
    if opts:
        fig, ax = plt.subplots(figsize=(8, 3.6), dpi=80)
        engines = [
            e
            for e in ("ours", "fbgemm", "fbgemm_rowwise", "raw_op", "keras")
            if any(("W1", o, e) in idx and "median_ms" in idx[("W1", o, e)] for o in opts)
        ]
        width = 0.8 / max(1, len(engines))
        for j, e in enumerate(engines):
            xs, ys = [], []
            for i, o in enumerate(opts):
                r = idx.get(("W1", o, e))
                if r and "median_ms" in r:
                    xs.append(i + (j - (len(engines) - 1) / 2) * width)
                    ys.append(r["median_ms"])
            ax.bar(xs, ys, width, label=ENGINE_LABELS[e], color=colors[e])
        ax.set_yscale("log")
        ax.set_xticks(range(len(opts)))
        ax.set_xticklabels([OPT_LABELS[o] for o in opts], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("ms / step (log)")
        ax.set_title(result["workloads"]["W1"]["description"], fontsize=9, pad=22)
        handles, names = ax.get_legend_handles_labels()
        fig.legend(
            handles, names, fontsize=7, loc="upper center", ncol=len(names), frameon=False, bbox_to_anchor=(0.5, 0.93)
        )
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "w1_engines.png"))
        plt.close(fig)
        files.append("w1_engines.png")

    # Speedup of ours over each peer, per workload and optimizer.
    rows = []
    for name in ("W1", "W2", "W3", "W4"):
        wi = _index(result["runs"], name)
        for o in OPT_LABELS:
            mine = wi.get((name, o, "ours"))
            for p in ("keras", "raw_op", "fbgemm"):
                r = _ratio(wi.get((name, o, p)), mine)
                if r is not None:
                    rows.append((name, o, p, r))
    if rows:
        fig, ax = plt.subplots(figsize=(8, 3.6), dpi=80)
        labels = sorted({(n, o) for n, o, _, _ in rows}, key=lambda k: (k[0], list(OPT_LABELS).index(k[1])))
        for j, p in enumerate(("keras", "raw_op", "fbgemm")):
            pts = [
                (i + (j - 1) * 0.27, r)
                for i, lab in enumerate(labels)
                for (n, o, q, r) in rows
                if (n, o) == lab and q == p
            ]
            xs, ys = [x for x, _ in pts], [y for _, y in pts]
            if xs:
                ax.bar(xs, ys, 0.27, label=f"vs {ENGINE_LABELS[p]}", color=colors[p])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels([f"{n} {OPT_LABELS[o]}" for n, o in labels], rotation=60, ha="right", fontsize=6)
        ax.set_ylabel("speedup (peer ms / ours ms, log)", fontsize=8)
        handles, names = ax.get_legend_handles_labels()
        fig.legend(handles, names, fontsize=7, loc="upper center", ncol=3, frameon=False)
        fig.tight_layout(rect=(0, 0, 1, 0.93))
        fig.savefig(os.path.join(out_dir, "speedups.png"))
        plt.close(fig)
        files.append("speedups.png")

    sweep = [r for r in result["runs"] if str(r.get("section", "")).startswith("sweep:") and "median_ms" in r]
    if sweep:
        axes_names = sorted({r["axis"] for r in sweep})
        ncols = min(2, len(axes_names))
        nrows = math.ceil(len(axes_names) / ncols)
        fig, axs = plt.subplots(nrows, ncols, figsize=(8, 2.8 * nrows), dpi=80, squeeze=False)
        styles = {"sgd": "-", "adagrad": "--", "adam": ":"}
        for k, axis in enumerate(axes_names):
            ax = axs[k // ncols][k % ncols]
            for e, o in sorted({(r["engine"], r["optimizer"]) for r in sweep if r["axis"] == axis}):
                pts = sorted(
                    (r["point"], r["median_ms"])
                    for r in sweep
                    if r["axis"] == axis and r["engine"] == e and r["optimizer"] == o
                )
                label = ENGINE_LABELS[e] if e == "fbgemm_rowwise" else f"{ENGINE_LABELS.get(e, e)} {OPT_LABELS[o]}"
                ax.plot(
                    [p for p, _ in pts],
                    [m for _, m in pts],
                    styles.get(o, "-"),
                    marker="o",
                    ms=3,
                    color=colors.get(e, "gray"),
                    label=label,
                )
            if axis != "zipf":
                ax.set_xscale("log")
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel(axis, fontsize=8)
            ax.set_ylabel("ms / step", fontsize=8)
            ax.tick_params(labelsize=7)
        for k in range(len(axes_names), nrows * ncols):
            axs[k // ncols][k % ncols].axis("off")
        handles, labels = axs[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, fontsize=6, loc="lower center", ncol=4)
        fig.tight_layout(rect=(0, 0.12 if nrows > 1 else 0.2, 1, 1))
        fig.savefig(os.path.join(out_dir, "sweeps.png"))
        plt.close(fig)
        files.append("sweeps.png")
    return files


# --------------------------------------------------------------------------------------------------- files
def _dump(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=False, default=float)
    os.replace(tmp, path)


def write(result: dict, out_dir: str, with_report: bool = True) -> list[str]:
    """Writes the JSON files (and, unless ``with_report`` is False, REPORT.md and the PNGs); returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    result = dict(result, targets=targets(result))
    written = []
    _dump(os.path.join(out_dir, "suite.json"), result)
    written.append("suite.json")
    common = {"meta": result["meta"], "peers": result["peers"]}
    sections: dict[str, list] = {}
    for r in result["runs"]:
        key = r["section"].split(":")[0] + "s" if r["section"].startswith("sweep:") else r["section"]
        sections.setdefault(key, []).append(r)
    for key, runs in sections.items():
        wl = {k: v for k, v in result["workloads"].items() if k == key or key == "sweeps" and ":" in k}
        _dump(os.path.join(out_dir, f"{key}.json"), {**common, "workloads": wl, "runs": runs})
        written.append(f"{key}.json")
    if result.get("bandwidth"):
        _dump(os.path.join(out_dir, "bandwidth.json"), {**common, "bandwidth": result["bandwidth"]})
        written.append("bandwidth.json")
    if result.get("parity"):
        _dump(os.path.join(out_dir, "parity.json"), {**common, "parity": result["parity"]})
        written.append("parity.json")
    if result.get("accumulator"):
        _dump(os.path.join(out_dir, "accumulator_suite.json"), {**common, "accumulator": result["accumulator"]})
        written.append("accumulator_suite.json")
    if result.get("lifecycle"):
        _dump(os.path.join(out_dir, "lifecycle.json"), {**common, "lifecycle": result["lifecycle"]})
        written.append("lifecycle.json")
    written += report_dynamic.write_json(result, out_dir, common)
    written += report_serving_quant.write_json(result, out_dir, common)
    written += report_serving.write_json(result, out_dir, common)
    if with_report:
        plots = plot(result, out_dir)
        with open(os.path.join(out_dir, "REPORT.md"), "w", encoding="utf-8") as f:
            f.write(markdown(result, plots))
        written += ["REPORT.md"] + plots
    return [os.path.join(out_dir, w) for w in written]
