"""A smoke-sized run of the benchmark suite (``python -m benchmarks --smoke``), so the suite cannot rot.

Tiny sizes, one block, no FBGEMM: asserts that every output file is written and well formed, that each engine
produced a positive timing or an explicit error, and that the report marks the targets. No timing thresholds: a
smoke run on a shared CI machine measures nothing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               TF_EMBED_OPS_BENCH_CACHE=str(out / "cache"))
    cmd = [sys.executable, "-m", "benchmarks", "--smoke", "--no-fbgemm", "--blocks", "1", "--only",
           "W1,W2,sweeps,accumulator", "--optimizers", "sgd,adagrad,lookup", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout


def _load(out, name):
    with open(out / name, encoding="utf-8") as f:
        return json.load(f)


def test_writes_every_file(smoke_run):
    out, stdout = smoke_run
    for name in ("suite.json", "W1.json", "W2.json", "lookup.json", "sweeps.json", "bandwidth.json", "REPORT.md"):
        assert (out / name).is_file(), f"{name} missing; stdout:\n{stdout[-2000:]}"
        assert (out / name).stat().st_size > 0


@pytest.mark.parametrize("workload", ["W1", "W2"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_training_records_have_positive_timings(smoke_run, workload, optimizer):
    out, _ = smoke_run
    runs = [r for r in _load(out, f"{workload}.json")["runs"] if r["optimizer"] == optimizer]
    engines = {r["engine"]: r for r in runs}
    assert {"ours", "raw_op", "keras"} <= set(engines), sorted(engines)
    for engine, rec in engines.items():
        assert "error" not in rec, f"{engine}: {rec.get('error')}"
        assert rec["median_ms"] > 0 and rec["q1_ms"] <= rec["median_ms"] <= rec["q3_ms"]
        assert len(rec["block_ms"]) == 1 and all(x > 0 for x in rec["block_ms"])
        assert rec["unique_rows_per_s"] > 0
    bound = engines["ours"]["bound"]
    assert bound["bytes"] > 0 and bound["bound_ms"] > 0
    assert engines["ours"]["fraction_of_bound"] == pytest.approx(bound["bound_ms"] / engines["ours"]["median_ms"])


def test_lookup_and_sweeps(smoke_run):
    out, _ = smoke_run
    lookup = _load(out, "lookup.json")["runs"]
    assert {(r["workload"], r["engine"]) for r in lookup} == {("W1", "ours"), ("W1", "tf_lookup"),
                                                              ("W2", "ours"), ("W2", "tf_lookup")}
    assert all(r["median_ms"] > 0 for r in lookup)
    sweeps = _load(out, "sweeps.json")["runs"]
    axes = {r["axis"] for r in sweeps}
    assert axes == {"vocab", "batch"}
    assert all(r["median_ms"] > 0 for r in sweeps if r["engine"] == "ours")


def test_bandwidth_probe_and_absent_fbgemm_are_reported(smoke_run):
    out, _ = smoke_run
    suite = _load(out, "suite.json")
    bw = suite["bandwidth"]
    assert bw["stream_copy_gbs"] > 0 and all(r["random_rmw_gbs"] > 0 for r in bw["rows"])
    assert suite["peers"]["fbgemm"]["available"] is False
    report = (out / "REPORT.md").read_text()
    assert "FBGEMM peer: **absent**" in report


def test_report_marks_every_target(smoke_run):
    out, _ = smoke_run
    suite = _load(out, "suite.json")
    statuses = {t["target"]: t["status"] for t in suite["targets"]}
    assert statuses["W1 SGD: >= FBGEMM"] == "not measured"  # FBGEMM was off
    assert statuses["W1 Adagrad: >= 8x the raw-op path"] in ("met", "missed")
    report = (out / "REPORT.md").read_text()
    assert "## Targets" in report and "## W1:" in report and "## W2:" in report
    # Every markdown table row has as many cells as its header.
    lines = report.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|---"):
            width = lines[i - 1].count("|")
            j = i + 1
            while j < len(lines) and lines[j].startswith("|"):
                assert lines[j].count("|") == width, lines[j]
                j += 1


def test_accumulator_section(smoke_run):
    out, _ = smoke_run
    acc = _load(out, "accumulator_suite.json")["accumulator"]
    assert "error" not in acc, acc.get("error")
    assert set(acc["cases"]) == {"disjoint", "overlapping"}
    for case in acc["cases"].values():
        for engine in ("tensorflow", "tf_embed_ops_graph", "tf_embed_ops_eager"):
            assert case[engine]["median_ms"] > 0
    assert "## SparseConditionalAccumulator" in (out / "REPORT.md").read_text()


@pytest.mark.parametrize("workload", ["W1", "W2"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_ours_and_raw_op_peer_compute_the_same_update(smoke_run, workload, optimizer):
    out, _ = smoke_run
    par = {(r["workload"], r["optimizer"]): r for r in _load(out, "parity.json")["parity"]}
    rec = par[(workload, optimizer)]
    assert "error" not in rec, rec.get("error")
    assert rec["max_abs_update"] > 1e-5  # the steps did change the tables
    assert rec["max_abs_diff"] <= 1e-6 + 1e-3 * rec["max_abs_update"]


def test_plots_are_pngs(smoke_run):
    pytest.importorskip("matplotlib")
    out, _ = smoke_run
    for name in ("w1_engines.png", "speedups.png", "sweeps.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"![{name}]({name})" in (out / "REPORT.md").read_text()
