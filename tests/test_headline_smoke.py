"""A smoke-sized headline run (``python -m benchmarks --headline --smoke``): the persistent workers (the
speed-of-light kernel, ours at two threads) and the in-process engines (the kernel among them) end to end, so the
method cannot rot.

No timing thresholds: every headline must come out with a pair count and a status, or say why it was not
measured, and two runs' files must be comparable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_headline_smoke_run_reports_every_target(tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
        TF_EMBED_OPS_BENCH_CACHE=str(tmp_path / "cache"),
    )
    out = tmp_path / "hl"
    cmd = [sys.executable, "-m", "benchmarks", "--headline", "--smoke", "--no-fbgemm", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "headline.json", encoding="utf-8") as f:
        result = json.load(f)
    from benchmarks import headline

    assert [r["key"] for r in result["headlines"]] == [h.key for h in headline.HEADLINES]
    for r in result["headlines"]:
        if "fbgemm" in r["key"]:
            assert r["status"] == "not measured" and "FBGEMM absent" in r["why"], r
            continue
        assert r["status"] in ("met", "missed"), r
        assert r["n"] == 2 and r["median"] > 0, r
    # The kernel's and ours' workers answered: the ceilings that divide their engines are there.
    keys = {r["key"]: r for r in result["headlines"]}
    assert keys["W1_sgd_threads"]["ceiling"]["n"] == 2 and keys["W1_adam_bf16"]["ceiling"]["n"] == 2
    # And the kernel stepping in this process, alone and run by TensorFlow (as two ops for a training step).
    for key in ("W1_sgd_sol", "W4_adam_sol"):
        assert keys[key]["ceiling"]["engines"] == ["sol_tf_halves", "sol_local"] and keys[key]["ceiling"]["n"] == 2
    assert keys["W1_lookup_tf"]["ceiling"]["engines"] == ["tf_lookup", "sol_tf"]
    # The keyed and bf16 kernels, each the faster of its worker and its in-process run.
    for key, engine in (
        ("W1_sgd_dynamic", "sol_dynamic"),
        ("W1_lookup_dynamic", "sol_dynamic"),
        ("W1_sgd_bf16", "sol_bf16"),
    ):
        num, den = keys[key]["ceiling"]["engines"]
        assert num in (engine, engine + "_local") and den in ("sol", "sol_local") and keys[key]["ceiling"]["n"] == 2
    assert "| W1 SGD: ours / speed-of-light kernel <= 1.25 |" in (out / "HEADLINE.md").read_text()
    assert headline.compare(result, result)[0]["agree"] is True
