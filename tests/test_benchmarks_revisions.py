"""`python -m benchmarks.revisions`: our steps at two checkouts, interleaved (benchmarks/revisions.py).

The case parser and the refusals run here; a smoke-sized comparison of this checkout with itself (two worker
processes, each importing the checkout it is pointed at) runs in the slow tier. No timing thresholds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.benchmarks_import import import_benchmark

revisions = import_benchmark("revisions")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cases_parse_in_order():
    assert revisions.parse_cases("W1:sgd, dyn:adagrad") == [("W1", "sgd"), ("dyn", "adagrad")]
    assert len(revisions.parse_cases(revisions.DEFAULT_CASES)) == 6


def test_a_case_may_run_with_tracking_on():
    assert revisions.parse_cases("W1:adagrad+tracked") == [("W1", "adagrad+tracked")]


def test_a_case_may_time_the_lookup_alone():
    assert revisions.parse_cases("dyn:lookup,W1:lookup") == [("dyn", "lookup"), ("W1", "lookup")]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("W1:adagrad+traced", "variant 'traced'"),
        ("W1:+tracked", "variant 'tracked'"),
        ("dyn:sgd+tracked", r"\+tracked runs a static workload"),
        ("W1:lookup+tracked", r"\+tracked runs a training step, not lookup"),
    ],
)
def test_an_unknown_variant_or_a_tracked_dynamic_case_is_refused(text, words):
    with pytest.raises(ValueError, match=words):
        revisions.parse_cases(text)


@pytest.mark.parametrize("text", ["W1", "W1:", ":sgd", "W1:sgd,,W4:sgd"])
def test_a_malformed_case_is_refused_naming_it(text):
    with pytest.raises(ValueError, match="is not WORKLOAD:OPTIMIZER"):
        revisions.parse_cases(text)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], "--before is required"),
        (["--before", "/nonexistent"], "is not a tf_embed_ops checkout"),
        (["--before", ROOT, "--pairs", "0"], "--pairs must be >= 1"),
        (["--before", ROOT, "--threads", "0"], "--threads must be >= 1"),
        (["--before", ROOT, "--cases", "W1"], "is not WORKLOAD:OPTIMIZER"),
    ],
)
def test_bad_arguments_exit_with_a_message(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        revisions.main(argv)
    assert e.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.slow
def test_a_smoke_comparison_of_a_checkout_with_itself(tmp_path):
    out = tmp_path / "revisions.json"
    cmd = [sys.executable, "-m", "benchmarks.revisions", "--before", ROOT, "--after", ROOT, "--smoke"]
    cmd += ["--cases", "W1:sgd+tracked,dyn:adagrad,dyn:lookup", "--pairs", "2", "--block-ms", "5", "--json", str(out)]
    cmd += ["--threads", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert sorted(results) == ["W1_sgd+tracked", "dyn_adagrad", "dyn_lookup"]
    for name, r in results.items():
        assert r["after_over_before"]["n"] == 2, name
        assert r["before_ms"] > 0 and r["after_ms"] > 0 and r["steps_per_block"] >= 1, name
        assert f"{name}: after / before" in proc.stdout
