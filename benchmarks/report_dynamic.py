"""The dynamic-table section of the report: ``dynamic.json`` and the markdown tables (``benchmarks/report.py`` calls
``write_json`` and ``section``; both do nothing when the run had no dynamic section)."""

from __future__ import annotations

from benchmarks.report_format import write_section_json

LABELS = {
    "ours_static": "tf_embed_ops static table (row ids), the baseline",
    "ours_dynamic": "tf_embed_ops dynamic table (64-bit keys)",
    "tf_native_dynamic": "TF-native: MutableHashTable + tf.Variable + sparse apply",
    "tfra": "TFRA dynamic embedding (own venv)",
    "ours_static_lookup": "tf_embed_ops static table (row ids), the baseline",
    "ours_dynamic_lookup": "tf_embed_ops dynamic table (64-bit keys), no insert",
    "tf_native_dynamic_lookup": "TF-native: MutableHashTable lookup + gather",
}
ORDER = (
    "ours_static",
    "ours_dynamic",
    "tf_native_dynamic",
    "ours_static_lookup",
    "ours_dynamic_lookup",
    "tf_native_dynamic_lookup",
    "tfra",
)


def write_json(result: dict, out_dir: str, common: dict) -> list[str]:
    """Writes ``dynamic.json``; returns its file name in a list (empty without a dynamic section)."""
    return write_section_json(result, out_dir, common, "dynamic")


def _cell(rec: dict | None) -> str:
    if rec is None:
        return "—"
    if "error" in rec:
        return f"error: {rec['error'][:120]}".replace("|", "/")
    return f"{rec['median_ms']:.2f} ± {rec['iqr_ms']:.2f}"


def section(result: dict) -> list[str]:
    """Markdown lines of the dynamic-table section (none without one)."""
    dyn = result.get("dynamic")
    if not dyn:
        return []
    wl = dyn["workload"]
    out = [
        "## Dynamic tables: W1 on 64-bit keys",
        "",
        f"{wl['description']}; keys = {wl['keys']} ({wl['distinct_keys']:,} distinct in the batch). Every dynamic "
        "table is prefilled with the whole vocabulary's keys, so the steps measure the steady state. ms/step "
        "(median ± IQR); ratio = engine / our static table.",
        "",
        "| step | engine | ms/step | ratio to static |",
        "|---|---|---|---|",
    ]
    runs = dyn["runs"]
    for kind, opt in [("training", o) for o in ("sgd", "adagrad")] + [("lookup", "lookup")]:
        recs = {r["engine"]: r for r in runs if r["kind"] == kind and r["optimizer"] == opt}
        if not recs:
            continue
        base = recs.get("ours_static" if kind == "training" else "ours_static_lookup")
        for engine in ORDER:
            rec = recs.get(engine)
            if rec is None:
                continue
            ratio = (
                f"{rec['median_ms'] / base['median_ms']:.2f}x"
                if base and "median_ms" in base and "median_ms" in rec
                else "—"
            )
            label = LABELS.get(engine, engine) + (f" ({rec['detail']})" if rec.get("detail") else "")
            out.append(f"| {opt} | {label} | {_cell(rec)} | {ratio} |")
    t = dyn.get("tfra", {})
    out += ["", f"- TFRA peer: {'**available**' if t.get('available') else '**absent**'} — {t.get('note', '')}"]
    mem = [m for m in dyn.get("memory", []) if "bytes_per_row" in m]
    if mem:
        out += [
            "",
            "| optimizer | rows | bytes per row | floats per row | overhead | target |",
            "|---|---|---|---|---|---|",
        ]
        for m in mem:
            out.append(
                f"| {m['optimizer']} | {m['rows']:,} | {m['bytes_per_row']:.1f} | {m['float_bytes_per_row']} | "
                f"{m['overhead_bytes_per_row']:.1f} | ≤ {m['target_bytes_per_row']} "
                f"({'met' if m['met'] else 'missed'}) |"
            )
    if dyn.get("targets"):
        out += ["", "| target | value | status |", "|---|---|---|"]
        for tgt in dyn["targets"]:
            v = tgt["value"]
            if v is None:
                value = "—"
            elif tgt["target"].startswith("memory"):
                value = f"{v:.1f} B"
            else:
                value = f"{v:.2f}x"
            out.append(f"| {tgt['target']} | {value} | {tgt['status']} |")
    out.append("")
    return out
