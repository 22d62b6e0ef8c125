"""benchmarks/scale_model.py: the step model of docs/distributed_performance.md ("Choosing a mode at scale"),
checked term by term on a workload small enough to count by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import scale_model
from benchmarks import workloads as wls


def _workload() -> wls.Workload:
    # One 8-row table of dim 2 over 2 hosts (rows 0-3 and 4-7): ids 0, 0, 1 on host 0 and 5 on host 1.
    ids = np.array([0, 0, 1, 5], dtype=np.int64)
    return wls.Workload("tiny", "", [wls.Table("t", 8, 2)], [wls.Feature("f", 0, ids)])


def test_bytes_imbalance_and_capacity_by_hand():
    r = scale_model.step_model(_workload(), hosts=2, bandwidth=1e6, dense_bytes=0.0, compute_s=1e-3, cv=0.0)
    row = 8 + 8 * 2  # an id, its row and its gradient row
    assert r["ps_bytes"] == pytest.approx(3 * row / 2)  # 3 distinct ids, half of them remote
    assert r["collective_bytes"] == pytest.approx(4 * row / 2)  # 4 ids routed
    assert r["ps_imbalance"] == pytest.approx(2 / 1.5)  # shard 0 has 2 distinct ids, the mean is 1.5
    assert r["capacity_factor"] == pytest.approx(3 / 2)  # shard 0 receives 3 ids, the mean is 2
    assert r["straggler"] == 1.0
    latency = scale_model.LATENCY_S
    network = r["ps_bytes"] * r["ps_imbalance"] / 1e6
    assert r["ps_step_s"] == pytest.approx(max(1e-3 + 4 * latency + network, 1e-3 + 4 * scale_model.REQUEST_COST_S))
    synchronous = 1e-3 + (3 + 2 * math.log2(2)) * latency
    assert r["collective_distinct_step_s"] == pytest.approx(synchronous + network)
    assert r["collective_step_s"] == pytest.approx(synchronous + r["collective_bytes"] * 1.5 / 1e6)


def test_dense_weights_straggler_and_server_load():
    base = dict(bandwidth=1e6, compute_s=1e-3)
    r = scale_model.step_model(_workload(), hosts=2, dense_bytes=1000.0, cv=0.1, request_cost_s=0.0, **base)
    assert r["dense_bytes"] == pytest.approx(2 * 1000.0 / 2)
    assert r["straggler"] == pytest.approx(1 + 0.1 * math.sqrt(2 * math.log(2)))
    assert r["ps_bound"] == "network"
    busy = scale_model.step_model(_workload(), hosts=2, dense_bytes=0.0, cv=0.0, request_cost_s=1.0, **base)
    assert busy["ps_bound"] == "server" and busy["ps_step_s"] == pytest.approx(1e-3 + 2 * 2 * 1.0)


def test_measured_compute_reads_the_committed_suite():
    seconds, cv = scale_model.measured_compute("W1")
    assert 0 < seconds < 1 and 0 <= cv < 5
    with pytest.raises(ValueError, match="no measured 'nope' step of W1"):
        scale_model.measured_compute("W1", "nope")
