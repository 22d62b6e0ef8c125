"""The serving_quant section of the report: ``serving_quant.json`` and its markdown (``benchmarks/report.py`` calls
``write_json`` and ``section``; both do nothing when the run had no serving_quant section)."""

from __future__ import annotations

from benchmarks.report_format import write_section_json

TARGETS = {"int8_size": 3.5, "int4_size": 6.0, "latency": 1.2, "int8_auc": 0.001}


def write_json(result: dict, out_dir: str, common: dict) -> list[str]:
    """Writes ``serving_quant.json``; returns its file name in a list (empty without the section)."""
    return write_section_json(result, out_dir, common, "serving_quant", targets=TARGETS)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _size_latency(sl: dict) -> list[str]:
    if "error" in sl:
        return [f"Size and latency did not run: {sl['error']}", ""]
    tables = ", ".join(f"{n} {v[0]} x {v[1]} ({v[2]})" for n, v in sl["tables"].items())
    load = ", ".join(f"{x:.1f}" for x in sl["load_avg"])
    out = [
        f"Tables {tables}; batch {sl['batch']} (about {sl['items_per_sample_mean']} items per sample); latency "
        f"measured in an interpreter where `tf_embed_ops` cannot be imported, exports alternating block by block "
        f"(load average {load}).",
        "",
        "| export | SavedModel | smaller than fp32 | latency (median) | vs fp32 | latency (best block) | vs fp32 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, s in sl["sizes"].items():
        lat = sl["latency"][mode]
        out.append(
            f"| {mode} | {s['saved_model_bytes'] / 2**20:.2f} MiB | {s['ratio_vs_float32']:.2f}x | "
            f"{lat['median_ms']:.3f} ms | {lat['ratio_vs_float32']:.2f}x | "
            f"{lat.get('min_ms', float('nan')):.3f} ms | {lat.get('min_ratio_vs_float32', float('nan')):.2f}x |"
        )
    int8, int4 = sl["sizes"]["int8"]["ratio_vs_float32"], sl["sizes"]["int4"]["ratio_vs_float32"]
    worst = max(v["ratio_vs_float32"] for m, v in sl["latency"].items() if m in ("int8", "int4"))
    out += [
        "",
        f"Targets: int8 >= {TARGETS['int8_size']}x smaller: {int8:.2f}x ({_met(int8 >= TARGETS['int8_size'])}); "
        f"int4 >= {TARGETS['int4_size']}x: {int4:.2f}x ({_met(int4 >= TARGETS['int4_size'])}); "
        f"quantized latency <= {TARGETS['latency']}x fp32: worst median {worst:.2f}x "
        f"({_met(worst <= TARGETS['latency'])}).",
        "",
    ]
    return out


def _ctr(ctr: dict) -> list[str]:
    if "error" in ctr:
        return [f"CTR AUC did not run: {ctr['error']}", ""]
    v = ctr["variants"]
    base = v["float32"]["test_auc"]
    out = ["| CTR export | SavedModel | test AUC | change vs fp32 |", "|---|---:|---:|---:|"]
    for name, r in v.items():
        out.append(
            f"| {name} | {r['saved_model_bytes'] / 2**10:.0f} KiB | {r['test_auc']:.4f} | {r['test_auc'] - base:+.4f} |"
        )
    d8 = abs(v["int8"]["test_auc"] - base)
    out += [
        "",
        f"int8 within {TARGETS['int8_auc']} of fp32: {d8:.4f} ({_met(d8 <= TARGETS['int8_auc'])}).",
        "",
    ]
    return out


def section(result: dict) -> list[str]:
    """The report's markdown lines for the section (empty without it)."""
    sq = result.get("serving_quant")
    if not sq:
        return []
    out = ["## Quantized and pruned serving exports", ""]
    out += _size_latency(sq.get("size_latency", {"error": "missing"}))
    out += _ctr(sq.get("ctr", {"error": "missing"}))
    fb = sq.get("size_latency", {}).get("fbgemm", {"note": "not run"})
    if fb.get("available"):
        out += [f"FBGEMM int-N inference kernels side by side ({fb['note']}):", ""]
        out += ["| FBGEMM weights | lookup latency (median) | vs its fp32 |", "|---|---:|---:|"]
        for mode, v in fb["latency"].items():
            out.append(f"| {mode} | {v['median_ms']:.3f} ms | {v['ratio_vs_fp32']:.2f}x |")
        out.append("")
    else:
        out += [f"FBGEMM int-N inference kernels: {fb['note']}.", ""]
    return out
