"""The README's speed paragraph, generated from the committed benchmark report (benchmarks/results/REPORT.md).

The README quotes the report rather than restating numbers by hand, so the two cannot drift apart:
``python -m benchmarks --out benchmarks/results`` rewrites the paragraph with the report, and
tests/test_docs_readme.py checks that the committed README holds exactly what this module generates.
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT = os.path.join(ROOT, "benchmarks", "results", "REPORT.md")
# The interleaved-pairs run (python -m benchmarks --headline --out benchmarks/results), when one is committed.
HEADLINE = os.path.join(ROOT, "benchmarks", "results", "headline.json")
README = os.path.join(ROOT, "README.md")
BEGIN = "<!-- speed: generated from benchmarks/results/REPORT.md by benchmarks/readme_speed.py; do not edit -->"
END = "<!-- /speed -->"


def _table(lines: list[str], start: int) -> list[dict]:
    """The markdown table after line `start`, as dicts keyed by the header cells."""
    i = start
    while not lines[i].startswith("|"):
        i += 1
    header = [c.strip() for c in lines[i].strip("|\n").split("|")]
    rows = []
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("|\n").split("|")), strict=False)))
    return rows


def _speedup(cell: str) -> float:
    """`3.69 (**2.65x**)` or `2.81 (0.97x)` -> the speedup (peer ms / ours ms)."""
    match = re.search(r"\(\**([0-9.]+)x\**\)", cell)
    if not match:
        raise ValueError(f"no speedup in report cell {cell!r}")
    return float(match.group(1))


def figures(report_text: str) -> dict:
    """The numbers the paragraph quotes, read from the report."""
    lines = report_text.splitlines()
    run = re.search(r"^Run (\S+ \d\d:\d\d)\S* UTC on .*?\((\d+) logical CPUs", report_text, re.M)
    if not run:
        raise ValueError("REPORT.md: no 'Run <date> UTC on ... (N logical CPUs' line")
    targets = _table(lines, lines.index("## Targets"))
    w1_heading = next(i for i, line in enumerate(lines) if line.startswith("## W1:"))
    w1 = {row["optimizer"]: row for row in _table(lines, w1_heading)}

    def column(name: str) -> str:
        return next(k for k in next(iter(w1.values())) if k.startswith(name))

    keras, raw, fbgemm = column("Keras 3"), column("raw ops"), column("FBGEMM ms")
    return {
        "date": run.group(1),
        "cpus": int(run.group(2)),
        "workload": lines[w1_heading].removeprefix("## W1: "),
        "targets_met": sum(1 for t in targets if t["status"] == "met"),
        "targets_not_comparable": sum(1 for t in targets if t["status"].startswith("not comparable")),
        "targets": len(targets),
        "lazy_adam_vs_keras": _speedup(w1["Adam (lazy)"][keras]),
        "raw": {name: _speedup(w1[name][raw]) for name in ("FTRL", "Adagrad", "SGD")},
        "fbgemm": {name: _speedup(w1[name][fbgemm]) for name in ("Adagrad", "SGD")},
    }


def _x(value: float) -> str:
    return f"{value:.3g}x"


def paragraph(report_text: str, with_fbgemm: bool = True) -> str:
    """The full report's figures; `with_fbgemm=False` leaves its FBGEMM ratios to the interleaved run, whose
    pairs measure them more reliably than the report's one-after-the-other blocks."""
    f = figures(report_text)
    fbgemm = ", ".join(f"{name} {_x(v)}" + ("" if v >= 1 else " (FBGEMM is faster)") for name, v in f["fbgemm"].items())
    fbgemm_clause = f"; against FBGEMM: {fbgemm}" if with_fbgemm else ""
    n = f["targets_not_comparable"]
    not_comparable = f" ({n} not comparable: its 1- and 2-thread runs saw different machine states)" if n else ""
    return (
        "Measured side by side with the TensorFlow-native peers and FBGEMM's CPU kernels in one run "
        "(`python -m benchmarks`; full report in [benchmarks/results/REPORT.md](benchmarks/results/REPORT.md), "
        "method in [docs/benchmarks.md](docs/benchmarks.md)). "
        f"From that report (run {f['date']} UTC, {f['cpus']} logical CPUs), on the headline workload W1 "
        f"({f['workload']}), as speedups (the peer's time / ours): lazy Adam is {_x(f['lazy_adam_vs_keras'])} "
        f"Keras 3 Adam; {', '.join(f['raw'])} are {', '.join(_x(v) for v in f['raw'].values())} the "
        f"`tf.raw_ops` sparse-apply path{fbgemm_clause}. "
        f"{f['targets_met']} of the report's {f['targets']} targets are met{not_comparable}; it says which are "
        "missed and why."
    )


def headline_sentence(result: dict) -> str:
    """The interleaved-pairs figures the paragraph quotes (benchmarks/headline.py's result)."""
    by_key = {r["key"]: r for r in result["headlines"]}

    def fig(key: str) -> str:
        r = by_key.get(key, {})
        return f"{r['median']:.3g}x" if "median" in r else "not measured"

    measured = [r for r in result["headlines"] if "median" in r]
    met = sum(1 for r in measured if r["status"] == "met")
    pairs = min((r["n"] for r in measured), default=0)
    return (
        f"By interleaved pairs ([HEADLINE.md](benchmarks/results/HEADLINE.md), run {result['meta']['date_utc'][:16]} "
        f"UTC, {pairs} pairs a figure): our W1 step takes {fig('W1_sgd_sol')} (SGD), {fig('W1_adagrad_sol')} "
        f"(Adagrad) and {fig('W1_adam_sol')} (lazy Adam) the speed-of-light kernel's time; FBGEMM's SGD takes "
        f"{fig('W1_sgd_fbgemm')} ours on W1 and its row-wise Adagrad {fig('W1_rowwise_fbgemm')}; {met} of its "
        f"{len(measured)} targets {'is' if met == 1 else 'are'} met."
    )


def block(report_text: str, headline: dict | None = None) -> str:
    if headline is None:
        text = paragraph(report_text)
    else:
        text = paragraph(report_text, with_fbgemm=False) + " " + headline_sentence(headline)
    return f"{BEGIN}\n{text}\n{END}"


def committed_headline(path: str = HEADLINE) -> dict | None:
    """The committed headline.json, or None when none is committed."""
    if not os.path.exists(path):
        return None
    import json

    with open(path, encoding="utf-8") as f:
        return json.load(f)


def current_block(readme_text: str) -> str:
    start, end = readme_text.find(BEGIN), readme_text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README.md has no {BEGIN} ... {END} block")
    return readme_text[start : end + len(END)]


def update_readme(readme: str = README, report: str = REPORT) -> str:
    """Rewrites the README's generated block from the report; returns the README's path."""
    with open(report, encoding="utf-8") as f:
        new = block(f.read(), committed_headline())
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    text = text.replace(current_block(text), new)
    with open(readme, "w", encoding="utf-8") as f:
        f.write(text)
    return readme
