"""`python -m benchmarks` never overwrites the committed report unless asked: without --out it writes into a new
scratch directory; --out benchmarks/results replaces the report and rewrites the README's speed paragraph."""

from __future__ import annotations

import os

import pytest
import tensorflow as tf

from benchmarks import __main__ as bench_main
from benchmarks import readme_speed, report, suite


@pytest.fixture()
def fake_run(monkeypatch):
    """The suite and the writers replaced by recorders: only the choice of directory is under test."""
    calls = {"write": [], "readme": 0}
    monkeypatch.setattr(suite, "run", lambda opts, log: {"meta": {}, "runs": []})
    # main() fixes TensorFlow's thread pools for a measurement; this test process must keep its own.
    monkeypatch.setattr(tf.config.threading, "set_intra_op_parallelism_threads", lambda n: None)
    monkeypatch.setattr(tf.config.threading, "set_inter_op_parallelism_threads", lambda n: None)

    def write(result, out_dir, with_report=True):
        calls["write"].append(out_dir)
        return [os.path.join(out_dir, "REPORT.md")]

    def update_readme():
        calls["readme"] += 1
        return "README.md"

    monkeypatch.setattr(report, "write", write)
    monkeypatch.setattr(readme_speed, "update_readme", update_readme)
    return calls


def test_default_output_is_a_new_scratch_directory(fake_run, capsys):
    assert bench_main.main(["--no-fbgemm"]) == 0
    (out,) = fake_run["write"]
    assert os.path.realpath(out) != os.path.realpath(bench_main.COMMITTED_OUT)
    assert os.path.basename(out).startswith("tf_embed_ops_bench_") and os.path.isdir(out)
    assert fake_run["readme"] == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "--out benchmarks/results` replaces the committed report" in printed
    os.rmdir(out)


def test_committed_directory_only_when_asked_and_then_the_readme_follows(fake_run):
    assert bench_main.main(["--no-fbgemm", "--out", bench_main.COMMITTED_OUT]) == 0
    assert fake_run["write"] == [bench_main.COMMITTED_OUT] and fake_run["readme"] == 1


def test_a_smoke_run_into_the_committed_directory_leaves_the_readme_alone(fake_run):
    assert bench_main.main(["--smoke", "--no-fbgemm", "--out", bench_main.COMMITTED_OUT]) == 0
    assert fake_run["readme"] == 0
