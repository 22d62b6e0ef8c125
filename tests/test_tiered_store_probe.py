"""The store probe (benchmarks/tiered_store_probe.py) at a tiny size, so it cannot rot.

No timing thresholds. What is checked: every engine this machine can build runs, replays the same I/O, and reads
back the record last written of every row (the probe exits non-zero otherwise); in the steady state each miss
evicts a dirty row, so writes equal reads; bad input is refused by the program.
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from benchmarks import tiered_store_probe as probe

# It compiles a C++ program: the slow tier.
pytestmark = pytest.mark.slow


@pytest.fixture()
def bench_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_EMBED_OPS_BENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_every_engine_replays_the_same_io_and_reads_back_what_it_wrote(bench_cache):
    result = probe.run(rounds=1, steps=30, warmup=20, vocab=20_000, batch=2_048, directory=str(bench_cache))
    engines = probe.available_engines()
    assert set(result["summary"]) == set(engines)
    assert [r["engine"] for r in result["runs"]] == list(engines)
    reads = {s["reads_per_step"] for s in result["summary"].values()}
    writes = {s["writes_per_step"] for s in result["summary"].values()}
    assert len(reads) == 1 and len(writes) == 1, result["summary"]  # the same simulated I/O for every engine
    assert reads.pop() > 0
    # The cache (2,000 rows) is full after the warm-up: every miss evicts a row a step updated.
    assert result["summary"][engines[0]]["reads_per_step"] == result["summary"][engines[0]]["writes_per_step"]
    for run in result["runs"]:
        assert run["median_ms"] > 0 and run["timed_steps"] == 10
    assert not [p for p in os.listdir(bench_cache) if p.startswith("tiered_store_probe_")], "scratch left behind"


def test_the_program_refuses_an_id_out_of_range(bench_cache):
    binary = probe.build()
    ids = bench_cache / "ids.bin"
    np.array([0, 5, 10, 3], np.int64).tofile(ids)  # 10 is outside [0, 10)
    proc = subprocess.run(
        [binary, "rowfile", str(bench_cache), str(ids), "2", "2", "10", str(probe.RECORD_BYTES), "4", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "out of range" in proc.stderr, proc.stderr
