"""The report's PNG plots (matplotlib, Agg backend): our engine against its peers on W1, our speedups over each peer,
and the sweeps."""

from __future__ import annotations

import math
import os

from benchmarks import report_format as fmt

__all__ = ["plot"]


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

    idx = fmt.index(result["runs"], "W1")
    opts = [o for o in fmt.OPT_LABELS if any(k[1] == o for k in idx)]
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
            ax.bar(xs, ys, width, label=fmt.ENGINE_LABELS[e], color=colors[e])
        ax.set_yscale("log")
        ax.set_xticks(range(len(opts)))
        ax.set_xticklabels([fmt.OPT_LABELS[o] for o in opts], rotation=20, ha="right", fontsize=8)
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
        wi = fmt.index(result["runs"], name)
        for o in fmt.OPT_LABELS:
            mine = wi.get((name, o, "ours"))
            for p in ("keras", "raw_op", "fbgemm"):
                r = fmt.ratio(wi.get((name, o, p)), mine)
                if r is not None:
                    rows.append((name, o, p, r))
    if rows:
        fig, ax = plt.subplots(figsize=(8, 3.6), dpi=80)
        labels = sorted({(n, o) for n, o, _, _ in rows}, key=lambda k: (k[0], list(fmt.OPT_LABELS).index(k[1])))
        for j, p in enumerate(("keras", "raw_op", "fbgemm")):
            pts = [
                (i + (j - 1) * 0.27, r)
                for i, lab in enumerate(labels)
                for (n, o, q, r) in rows
                if (n, o) == lab and q == p
            ]
            xs, ys = [x for x, _ in pts], [y for _, y in pts]
            if xs:
                ax.bar(xs, ys, 0.27, label=f"vs {fmt.ENGINE_LABELS[p]}", color=colors[p])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels([f"{n} {fmt.OPT_LABELS[o]}" for n, o in labels], rotation=60, ha="right", fontsize=6)
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
                engine = fmt.ENGINE_LABELS.get(e, e)
                label = engine if e == "fbgemm_rowwise" else f"{engine} {fmt.OPT_LABELS[o]}"
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
