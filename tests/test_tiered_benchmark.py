"""The `tiered` benchmark section runs end to end at smoke sizes and reports what docs/benchmarks.md says."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_the_tiered_section_runs_and_reports(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "benchmarks", "--smoke", "--no-fbgemm", "--no-speed-of-light", "--blocks", "1"]
    cmd += ["--only", "tiered", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / "suite.json", encoding="utf-8") as f:
        result = json.load(f)["tiered"]
    step = result["step"]
    for engine in ("in_memory", "tiered", "tiered_prefetch"):
        assert step["timing"][engine]["median_ms"] > 0, engine
    for engine in ("tiered", "tiered_prefetch"):
        assert 0.0 <= step[engine]["hit_rate"] <= 1.0
        assert step[engine]["capacity_rows"] == step["sizes"]["cache_rows"]
    assert result["memory"]["peak_rss_mb"] >= result["memory"]["baseline_rss_mb"] > 0
    report = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    assert "## Tiered tables (W1, Adagrad, a cache of" in report
