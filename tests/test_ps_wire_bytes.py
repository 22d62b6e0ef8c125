"""Bytes on the wire of the parameter-server path: what each server's calls receive and return, counted by
`benchmarks.ps_wire_bytes`, grow with the step's distinct ids, not with its batch, and match the formula."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import ps_wire_bytes
from benchmarks import workloads as wls


@pytest.mark.parametrize("make", [wls.w1, wls.w4], ids=["W1", "W4"])
@pytest.mark.parametrize("servers", [2, 3])
def test_bytes_are_distinct_ids_times_dim_not_batch(make, servers):
    workload = make(smoke=True)
    once = ps_wire_bytes.measure(workload, servers)
    doubled = ps_wire_bytes.measure(workload, servers, repeat=2)  # same distinct ids, twice the ids and samples
    assert once["total"] == ps_wire_bytes.formula(workload, servers, "compact")
    assert doubled["total"] == once["total"]
    assert len(once["per_server"]) == servers
    # Full-shape partials would have doubled, and cost more than the compact rows.
    full, full_doubled = (ps_wire_bytes.formula(workload, servers, "full", repeat=r) for r in (1, 2))
    assert full_doubled > 1.9 * full and full > once["total"]


def test_formula_counts_each_term():
    workload = wls.Workload(
        "tiny",
        "",
        [wls.Table("t", 100, 4)],
        [wls.Feature("f", 0, np.array([5, 5, 7], dtype="int64"))],
    )
    # Two distinct ids over two servers: each id 8 bytes, its row out and its gradient row in (2 x 4 x 4 bytes),
    # and a 16-byte sample shape per server and table.
    assert ps_wire_bytes.formula(workload, 2, "compact") == 2 * (8 + 32) + 2 * 16
    # Three ids (id 8 + weight 4 + two coordinates 16), and per server the 8-byte sample shape and the activation
    # and its gradient over the 3 samples (2 x 3 x 4 x 4 bytes).
    assert ps_wire_bytes.formula(workload, 2, "full") == 3 * 28 + 2 * (8 + 96)
    with pytest.raises(ValueError, match="protocol"):
        ps_wire_bytes.formula(workload, 2, "other")
