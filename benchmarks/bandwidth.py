"""The memory-bandwidth limit: the bundled probe, and the bytes each optimizer must move per step.

``probe()`` compiles ``bandwidth_probe.cc`` with the system C++ compiler on first use (into a cache dir, keyed by
the source's hash) and runs it. ``bytes_per_step()`` is the least DRAM traffic a fused step can get away with;
``bound_ms()`` turns the two into the fastest possible step, and a result's *fraction of bound* is
``bound_ms / measured_ms`` (1.0 = running at the memory limit; the W1 target is >= 0.5, within 2x).

The traffic model (fp32, 4 bytes per element; U = distinct rows touched in a table, D = dim, S = optimizer slots,
N = ids, A = activation elements = upstream-gradient elements):

* rows: each touched row of the table and of each slot is read once and written once: ``U * D * 4 * (1 + S) * 2``.
  The forward gather reads the same table rows; a fused step can keep them in cache until the update, so they are
  not counted twice (this makes the bound harder to meet, not easier). Costed at the probe's random-row
  read-modify-write bandwidth for that D.
* streams: activations written and upstream gradients read, ``A * 4 * 2``, the ids (8 bytes) read once for the
  forward and once for the backward, ``N * 8 * 2``, and the row-split vectors. Costed at the streaming copy bandwidth.
* dense optimizers (non-lazy Adam) read and write every row of table and slots: ``V * D * 4 * (1 + S) * 2`` at the
  streaming copy bandwidth, instead of the rows term.

Example:
    >>> bytes_per_step(w1_summary, "adagrad")["rows_bytes"]  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bandwidth_probe.cc")

# Slots per optimizer, as the TPU Load/Retrieve ops order them (docs/semantics.md); "dense" updates every row.
OPTIMIZER_SLOTS = {
    "sgd": 0,
    "adagrad": 1,
    "adagrad_momentum": 2,
    "adam": 2,
    "adam_nonlazy": 2,
    "ftrl": 2,
    "momentum": 1,
    "rms_prop": 2,
    "centered_rms_prop": 3,
    "rowwise_adagrad": 0,  # one float per row (4 bytes next to the row's dim floats): not counted
    "lookup": 0,
}
DENSE_OPTIMIZERS = {"adam_nonlazy"}


def cache_dir() -> str:
    """Where the compiled probe lives: $TF_EMBED_OPS_BENCH_CACHE, else ~/.cache/tf_embed_ops_bench."""
    return os.environ.get(
        "TF_EMBED_OPS_BENCH_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "tf_embed_ops_bench")
    )


def build_probe() -> str:
    """Compiles the probe if needed and returns the binary's path.

    Raises:
        RuntimeError: no C++ compiler, or the compile failed (its stderr is in the message).
    """
    # -ffast-math only lets the read loop vectorise its sum.
    return native_binary(_SOURCE, "bandwidth_probe", ["-ffast-math", "-pthread"])


def _source_text(source: str) -> bytes:
    """The source and the headers it includes from its own folder (``#include "x.h"``), for the cache key."""
    with open(source, "rb") as f:
        text = f.read()
    folder = os.path.dirname(source)
    for header in re.findall(rb'^#include "([^"/]+)"', text, re.MULTILINE):
        path = os.path.join(folder, header.decode())
        if os.path.exists(path):
            text += _source_text(path)
    return text


def native_binary(source: str | list[str], name: str, flags: list[str], libs: tuple[str, ...] | list[str] = ()) -> str:
    """Compiles a standalone benchmark program (or, with ``-shared`` in ``flags``, a library) once per hash of its
    sources and headers (into ``cache_dir()``).

    Returns the binary's path.

    ``source`` is one file or a list of files. -O3 -march=native always: these programs measure what the machine
    can do, and the op library is built for the machine it runs on too. `libs` (e.g. ``-lrocksdb``) follow the
    sources on the command line, where the linker needs them.

    Raises:
        RuntimeError: no C++ compiler, or the compile failed (its stderr is in the message).
    """
    sources = [source] if isinstance(source, str) else list(source)
    text = b"".join(_source_text(s) for s in sources)
    digest = hashlib.sha256(text + " ".join([*flags, *libs]).encode()).hexdigest()[:12]
    binary = os.path.join(cache_dir(), f"{name}_{digest}")
    if os.path.exists(binary):
        return binary
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        raise RuntimeError(f"no C++ compiler (g++/c++/clang++) on PATH to build {name}")
    os.makedirs(cache_dir(), exist_ok=True)
    tmp = binary + f".tmp{os.getpid()}"
    cmd = [cxx, "-std=c++17", "-O3", "-march=native", *flags, "-o", tmp, *sources, *libs]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed to compile ({' '.join(cmd)}): {proc.stderr[-2000:]}")
    os.replace(tmp, binary)
    return binary


def probe(
    threads: int = 1,
    mb: int = 1024,
    reps: int = 3,
    dims: tuple[int, ...] = (8, 16, 32, 64, 128, 256),
    rows_touched: int = 65536,
) -> dict:
    """Runs the probe and returns its JSON (GB/s figures; see bandwidth_probe.cc)."""
    binary = build_probe()
    cmd = [
        binary,
        "--mb",
        str(mb),
        "--threads",
        str(threads),
        "--reps",
        str(reps),
        "--dims",
        ",".join(str(d) for d in dims),
        "--rows_touched",
        str(rows_touched),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(proc.stdout)


# Per-dim figures of the probe: random_rmw_gbs (the one the bound uses) is the larger of the 4 KiB-page and the
# huge-page figures, since the op library asks for huge pages for its tables (cc/lib/huge_pages.h).
_ROW_FIGURES = ("random_rmw_gbs", "sorted_rmw_gbs", "random_rmw_4k_gbs", "random_rmw_huge_gbs")


def best_of(a: dict, b: dict) -> dict:
    """Per figure, the larger of two probe results (same dims): the hardware can do at least that."""
    out = dict(a)
    for key in ("stream_read_gbs", "stream_write_gbs", "stream_copy_gbs"):
        out[key] = max(a[key], b[key])
    rows_b = {r["dim"]: r for r in b["rows"]}
    out["rows"] = [
        {**r, **{k: max(r[k], rows_b[r["dim"]][k]) for k in _ROW_FIGURES if k in r and k in rows_b[r["dim"]]}}
        if r["dim"] in rows_b
        else r
        for r in a["rows"]
    ]
    return out


def rmw_gbs(probe_result: dict, dim: int) -> float:
    """Random-row read-modify-write GB/s at ``dim``, interpolated in log(dim) between measured dims."""
    rows = sorted(probe_result["rows"], key=lambda r: r["dim"])
    if dim <= rows[0]["dim"]:
        return rows[0]["random_rmw_gbs"]
    for lo, hi in zip(rows, rows[1:], strict=False):
        if lo["dim"] <= dim <= hi["dim"]:
            import math

            t = (math.log(dim) - math.log(lo["dim"])) / (math.log(hi["dim"]) - math.log(lo["dim"]))
            return lo["random_rmw_gbs"] + t * (hi["random_rmw_gbs"] - lo["random_rmw_gbs"])
    return rows[-1]["random_rmw_gbs"]


def bytes_per_step(summary: dict, optimizer: str) -> dict:
    """The least bytes one fused step moves, split into random-row and streaming traffic.

    Args:
        summary: ``Workload.summary()``.
        optimizer: a key of ``OPTIMIZER_SLOTS`` ("lookup" = the forward pass alone).

    Returns:
        ``{"rows_bytes": [per table], "stream_bytes": int, "dense_bytes": int}``.
    """
    slots = OPTIMIZER_SLOTS[optimizer]
    dense = optimizer in DENSE_OPTIMIZERS
    rows_bytes, dense_bytes = [], 0
    act_elems = 0
    for f in summary["features"]:
        dim = summary["tables"][f["table"]]["dim"]
        act_elems += f["batch"] * (f["sequence_length"] or 1) * dim
    for t, table in enumerate(summary["tables"]):
        u = summary["unique_rows"][t]
        if optimizer == "lookup":
            rows_bytes.append(u * table["dim"] * 4)  # read only
        elif dense:
            rows_bytes.append(0)
            dense_bytes += table["vocab"] * table["dim"] * 4 * (1 + slots) * 2
        else:
            rows_bytes.append(u * table["dim"] * 4 * (1 + slots) * 2)
    n_ids = summary["num_ids"]
    splits = sum(f["batch"] + 1 for f in summary["features"] if f["kind"] != "single") * 8
    if optimizer == "lookup":
        stream = act_elems * 4 + n_ids * 8 + splits
    else:
        stream = act_elems * 4 * 2 + n_ids * 8 * 2 + splits * 2
    return {"rows_bytes": rows_bytes, "stream_bytes": int(stream), "dense_bytes": int(dense_bytes)}


def bound_ms(summary: dict, optimizer: str, probe_result: dict) -> dict:
    """The fastest step the memory system allows: bytes / bandwidth, per kind of traffic, summed.

    Returns:
        ``{"bound_ms", "bytes", "rows_bytes", "stream_bytes", "dense_bytes"}``.
    """
    b = bytes_per_step(summary, optimizer)
    copy_gbs = probe_result["stream_copy_gbs"]
    ms = 0.0
    for t, table in enumerate(summary["tables"]):
        ms += b["rows_bytes"][t] / (rmw_gbs(probe_result, table["dim"]) * 1e9) * 1e3
    ms += (b["stream_bytes"] + b["dense_bytes"]) / (copy_gbs * 1e9) * 1e3
    total = sum(b["rows_bytes"]) + b["stream_bytes"] + b["dense_bytes"]
    return {
        "bound_ms": ms,
        "bytes": int(total),
        "rows_bytes": int(sum(b["rows_bytes"])),
        "stream_bytes": b["stream_bytes"],
        "dense_bytes": b["dense_bytes"],
    }
