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

from tests.benchmarks_import import import_benchmark as _import

# The benchmark suite runs in a subprocess: the slow tier.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
        TF_EMBED_OPS_BENCH_CACHE=str(out / "cache"),
    )
    cmd = [
        sys.executable,
        "-m",
        "benchmarks",
        "--smoke",
        "--no-fbgemm",
        "--blocks",
        "1",
        "--only",
        "W1,W2,sweeps,accumulator",
        "--optimizers",
        "sgd,adagrad,lookup",
        "--out",
        str(out),
    ]
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
    assert {(r["workload"], r["engine"]) for r in lookup} == {
        ("W1", "ours"),
        ("W1", "tf_lookup"),
        ("W2", "ours"),
        ("W2", "tf_lookup"),
    }
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
    assert statuses["W1 SGD: >= 1.3x FBGEMM EXACT_SGD"] == "not measured"  # FBGEMM was off
    assert statuses["W1 Adagrad: >= 0.8x the speed-of-light kernel"] in ("met", "missed")
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
    par = {(r["workload"], r["optimizer"], r.get("peer", "raw_op")): r for r in _load(out, "parity.json")["parity"]}
    rec = par[(workload, optimizer, "raw_op")]
    assert "error" not in rec, rec.get("error")
    assert rec["max_abs_update"] > 1e-5  # the steps did change the tables
    assert rec["max_abs_diff"] <= 1e-6 + 1e-3 * rec["max_abs_update"]


@pytest.mark.parametrize("workload", ["W1", "W2"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_speed_of_light_kernel_runs_and_does_our_work(smoke_run, workload, optimizer):
    out, _ = smoke_run
    runs = _load(out, f"{workload}.json")["runs"]
    rec = next(r for r in runs if r["optimizer"] == optimizer and r["engine"] == "speed_of_light")
    assert "error" not in rec, rec.get("error")
    assert rec["median_ms"] > 0 and rec["unique_rows_per_s"] > 0
    par = [r for r in _load(out, "parity.json")["parity"] if r.get("peer") == "speed_of_light"]
    rec = next(r for r in par if r["workload"] == workload and r["optimizer"] == optimizer)
    assert "error" not in rec, rec.get("error")
    assert rec["max_abs_update"] > 1e-5
    assert rec["max_abs_diff"] <= 1e-6 + 1e-3 * rec["max_abs_update"]


def test_dispatch_floor_and_speed_of_light_targets(smoke_run):
    out, _ = smoke_run
    floor = {r["engine"]: r for r in _load(out, "floor.json")["runs"]}
    assert set(floor) == {"tf_empty_step", "ours_one_id"}
    assert all(r["median_ms"] > 0 for r in floor.values())
    suite = _load(out, "suite.json")
    by_name = {t["target"]: t for t in suite["targets"]}
    sol = by_name["W1 SGD: >= 0.8x the speed-of-light kernel"]
    assert sol["status"] in ("met", "missed") and sol["ceiling"] == 1.0
    report = (out / "REPORT.md").read_text()
    assert "## Dispatch floor" in report and "speed-of-light kernel" in report


def test_plots_are_pngs(smoke_run):
    pytest.importorskip("matplotlib")
    out, _ = smoke_run
    for name in ("w1_engines.png", "speedups.png", "sweeps.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"![{name}]({name})" in (out / "REPORT.md").read_text()


def test_rerender_reproduces_the_report_and_rederives_targets(smoke_run, tmp_path):
    """`--rerender DIR` runs nothing: from suite.json alone it writes the same REPORT.md, and a target whose status
    suite.json got wrong is derived again from the measurements."""
    out, _ = smoke_run
    copy = tmp_path / "copy"
    copy.mkdir()
    with open(out / "suite.json", encoding="utf-8") as f:
        result = json.load(f)
    first = next(t for t in result["targets"] if t["status"] in ("met", "missed"))
    first["status"] = "met" if first["status"] == "missed" else "missed"  # a stale status: must not survive
    with open(copy / "suite.json", "w", encoding="utf-8") as f:
        json.dump(result, f)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "benchmarks", "--rerender", str(copy)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (copy / "REPORT.md").read_text() == (out / "REPORT.md").read_text()
    assert not (copy / "REPORT.md").samefile(out / "REPORT.md")


# ---------------------------------------------------------------------------------------------- the suite's pieces
# Pure-Python parts the report's numbers rest on, checked against hand computations.


@pytest.mark.parametrize(
    "optimizer, slots, dense",
    [("sgd", 0, False), ("adagrad", 1, False), ("adam", 2, False), ("ftrl", 2, False), ("adam_nonlazy", 2, True)],
)
def test_bytes_per_step_matches_the_traffic_model(optimizer, slots, dense):
    bandwidth = _import("bandwidth")
    v, d, n, u = 1000, 16, 300, 120
    summary = {
        "tables": [{"name": "t0", "vocab": v, "dim": d}],
        "unique_rows": [u],
        "num_ids": n,
        "features": [{"table": 0, "kind": "single", "batch": n, "sequence_length": 0}],
    }
    b = bandwidth.bytes_per_step(summary, optimizer)
    assert b["stream_bytes"] == n * d * 4 * 2 + n * 8 * 2  # activations out + upstream in, ids read twice
    if dense:
        assert b["rows_bytes"] == [0] and b["dense_bytes"] == v * d * 4 * (1 + slots) * 2
    else:
        assert b["rows_bytes"] == [u * d * 4 * (1 + slots) * 2] and b["dense_bytes"] == 0
    probe = {"stream_copy_gbs": 10.0, "rows": [{"dim": 8, "random_rmw_gbs": 2.0}, {"dim": 32, "random_rmw_gbs": 8.0}]}
    # dim 16 sits halfway between 8 and 32 in log(dim): 5 GB/s.
    assert bandwidth.rmw_gbs(probe, 16) == pytest.approx(5.0)
    bound = bandwidth.bound_ms(summary, optimizer, probe)
    expect = (b["rows_bytes"][0] / 5e9 + (b["stream_bytes"] + b["dense_bytes"]) / 10e9) * 1e3
    assert bound["bound_ms"] == pytest.approx(expect)


def test_sequence_and_bag_features_count_their_activations():
    bandwidth = _import("bandwidth")
    summary = {
        "tables": [{"name": "t0", "vocab": 100, "dim": 4}],
        "unique_rows": [10],
        "num_ids": 60,
        "features": [{"table": 0, "kind": "sequence", "batch": 3, "sequence_length": 20}],
    }
    b = bandwidth.bytes_per_step(summary, "sgd")
    assert b["stream_bytes"] == 3 * 20 * 4 * 4 * 2 + 60 * 8 * 2 + 4 * 8 * 2  # + row splits (batch + 1) twice


def test_summarize_quartiles():
    harness = _import("harness")
    s = harness.summarize([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s["q1_ms"], s["median_ms"], s["q3_ms"], s["iqr_ms"]) == (2.0, 3.0, 4.0, 2.0)


def test_time_alternating_rotates_and_reports_failures():
    harness = _import("harness")
    calls = []
    res = harness.time_alternating(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b"), "bad": lambda: 1 / 0},
        steps={"a": 2, "b": 1},
        blocks=3,
        warmup=1,
    )
    assert res["bad"]["error"].startswith("ZeroDivisionError")
    assert len(res["a"]["block_ms"]) == 3 and len(res["b"]["block_ms"]) == 3
    timed = calls[2:]  # after one warmup call each
    assert timed == ["a", "a", "b", "b", "a", "a", "a", "a", "b"]  # blocks start with a, then b, then a


@pytest.mark.parametrize("s", [0.8, 1.05, 1.4])
def test_zipf_ids_follow_the_law(s):
    import numpy as np

    workloads = _import("workloads")
    vocab, n = 1000, 200_000
    ids = workloads.zipf_ids(np.random.default_rng(0), vocab, n, s)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < vocab
    # Frequencies by rank: the permutation scatters ids but keeps the law, so sorted counts follow k^-s.
    counts = np.sort(np.bincount(ids, minlength=vocab))[::-1]
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    expected = n * ranks ** (-s) / np.sum(ranks ** (-s))
    assert counts[0] == pytest.approx(expected[0], rel=0.05)
    assert counts[9] == pytest.approx(expected[9], rel=0.15)
    # Hot ids are scattered, not packed into the first rows.
    hottest = np.argsort(np.bincount(ids, minlength=vocab))[::-1][:10]
    assert hottest.max() > 100
