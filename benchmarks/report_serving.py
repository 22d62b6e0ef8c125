"""The serving-delta section of the report: ``serving_delta.json`` and its markdown table (``benchmarks/report.py``
calls ``write_json`` and ``section``; both do nothing when the run had no serving_delta section)."""

from __future__ import annotations

from benchmarks.report_format import write_section_json


def write_json(result: dict, out_dir: str, common: dict) -> list[str]:
    """Writes ``serving_delta.json``; returns its file name in a list (empty without the section)."""
    return write_section_json(result, out_dir, common, "serving_delta")


def section(result: dict) -> list[str]:
    """Markdown lines of the serving-delta section (none without one)."""
    sd = result.get("serving_delta")
    if not sd:
        return []
    p = sd["params"]
    out = [
        "## Serving deltas: trainer to a live servable",
        "",
        f"A static table of {p['vocab']:,} x {p['dim']} float32 and a dynamic table of {p['dynamic_keys']:,} keys, "
        "served by a plain-TensorFlow process (tf_embed_ops not importable) that applies each delta while a second "
        "thread sends lookups of 512 ids. bytes ratio = delta file / (touched rows x (8 + row bytes) + 8 x "
        "evicted); publish-to-servable = writing the delta (rows read, file written and synced) + the serving "
        "process applying it (medians over a point's deltas); memory = peak resident while applying / resident "
        "before (the worst delta); lookups = latency while applying / at rest (median, p99), pooled over a point's "
        "deltas, each at-rest window just before its apply; calls = lookups while applying / at rest; floor = the "
        "lookup p99 ratio beside one thread of the serving process copying rows of a separate 64 MiB table for as "
        "long as each apply took (no lock or row shared with the lookups: what any apply that writes rows costs "
        "them at least on this machine), its windows next to the apply's. Load average during the run: "
        + ", ".join(f"{x:.1f}" for x in sd.get("load_average", []))
        + (f" (measured {sd['measured_utc']})" if "measured_utc" in sd else ""),
        "",
        "| table | touched rows | evicted | deltas | delta MiB | bytes ratio | publish s | apply s "
        "| publish-to-servable s | memory ratio | lookup median ratio | lookup p99 ratio | calls | floor p99 ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sd["points"]:
        out.append(
            f"| {r['table']} | {r['touched_rows']:,} | {r['evicted']:,} | {r['repeats']} | "
            f"{r['bytes'] / 2**20:.2f} | "
            f"{r['bytes_ratio']:.4f} | {r['publish_s']:.2f} | {r['apply_s']:.2f} | {r['publish_to_servable_s']:.2f} | "
            f"{r['memory_ratio']:.3f} | {r['latency_ratio_median']:.2f} | {r['latency_ratio_p99']:.2f} | "
            f"{r['during_calls']:,} / {r['rest_calls']:,} | "
            f"{r['floor_latency_ratio_p99']:.2f} |"
        )
    verdict = "bit-identical to" if sd["bit_identical"] else "NOT equal to"
    out += [
        "",
        f"After the last delta the delta-fed servable is {verdict} "
        "a full version taken at the same state (512 probe lookups, output bytes compared).",
        "",
    ]
    return out
