"""A model of one training step at 8-64 hosts: the parameter-server path against the synchronous collective mode.

Every host runs one worker (its own batch of the workload: weak scaling) and holds 1/N of every table: as a
parameter-server task beside its worker (`ShardedTPUEmbedding`), or as the owner of a shard in the collective mode.
Links are full duplex, `bandwidth` bytes/s each way, on a network without oversubscription. Compute and network
are not overlapped (the same for both modes). Per host and direction (U_t: the distinct ids of a worker's batch in
table t, n_t its ids, D_t the dim, N hosts, a = one message hop):

* parameter servers (compact rows), asynchronous:
  ``bytes = sum_t U_t * (8 + 8 D_t) * (N-1)/N`` (ids and gradient rows out and rows in as a worker, the same the
  other way as a server); ``imbalance`` = the busiest server's bytes over the mean (DIV shards of the workload's
  ids: hot ids make a hot server);
  ``step = max(compute + 4a + (bytes * imbalance + dense) / bandwidth,  compute + 2 N * request_cost)``:
  no barrier, but every server answers a lookup and an update of each of the N workers per step, each costing
  `request_cost` of its CPU (a remote function call), so its load grows with N.
* collective, synchronous, two variants of what is routed:
  all ids (``bytes = sum_t n_t * (8 + 8 D_t) * (N-1)/N``, each destination's slot padded to the busiest shard's
  ids: ``capacity`` = max over shards / mean) or the distinct ids (the parameter-server bytes and imbalance);
  ``step = compute * straggler + (3 + 2 log2 N) a + (bytes * capacity + dense) / bandwidth``: a barrier every
  step waits for the slowest of N hosts, ``straggler = 1 + cv * sqrt(2 ln N)`` (the expected maximum of N normal
  step times with coefficient of variation `cv`); three all-to-all phases and a tree-latency all-reduce.
* dense weights, both modes: ``dense = 2 * dense_bytes * (N-1)/N`` (a ring all-reduce, or reading and updating
  them on the servers).

`compute` is the measured single-process step of the workload (benchmarks/results/W1.json, W4.json: ours,
Adagrad, median) and `cv` the spread of its timed blocks (interquartile range / 1.349 / median). A host does the
same row work in both modes (its shard's rows for N workers, or its own batch's rows), so one `compute` serves both.
`a` (50 us) and `request_cost` (200 us) are assumptions, not measurements.

Usage: python -m benchmarks.scale_model [--hosts 8 16 32 64] [--gbps 25] [--dense-params 1000000]
    [--request-us 200] [--json FILE]
Prints the table of docs/distributed_performance.md ("Choosing a mode at scale").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

from benchmarks import workloads as wls
from tf_embed_ops.distribute import sharding

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
LATENCY_S = 50e-6  # one message hop in a datacenter (gRPC / TCP), an assumption
REQUEST_COST_S = 200e-6  # a parameter server's CPU per request (a remote function call), an assumption


def measured_compute(name: str, optimizer: str = "adagrad") -> tuple[float, float]:
    """(median seconds, coefficient of variation) of our fused step of workload `name` from the committed suite."""
    with open(os.path.join(RESULTS, f"{name}.json"), encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    for r in runs:
        if r.get("engine") == "ours" and r.get("optimizer") == optimizer and r.get("section") == name:
            q1, q3 = np.percentile(r["block_ms"], [25, 75])
            return r["median_ms"] / 1e3, float((q3 - q1) / 1.349 / r["median_ms"])
    raise ValueError(f"no measured '{optimizer}' step of {name} in {RESULTS}")


def shard_loads(ids: np.ndarray, vocab: int, hosts: int) -> tuple[np.ndarray, np.ndarray]:
    """Per DIV shard of a table over `hosts`: (ids it receives, distinct ids it receives)."""
    bounds = np.asarray(sharding.div_shard_boundaries(vocab, sharding.num_table_shards(vocab, hosts)))
    shard = np.searchsorted(bounds[1:-1], ids, side="right")
    distinct = np.unique(ids)
    n = np.bincount(shard, minlength=len(bounds) - 1)
    u = np.bincount(np.searchsorted(bounds[1:-1], distinct, side="right"), minlength=len(bounds) - 1)
    return n, u


def step_model(
    workload: wls.Workload,
    hosts: int,
    bandwidth: float,
    dense_bytes: float,
    compute_s: float,
    cv: float,
    request_cost_s: float = REQUEST_COST_S,
) -> dict:
    """One step of each mode at `hosts` hosts: bytes per host and direction, their imbalance, and seconds."""
    share = (hosts - 1) / hosts
    ps_bytes = coll_bytes = 0.0
    ps_busiest = ps_mean = coll_busiest = coll_mean = 0.0
    for t, table in enumerate(workload.tables):
        ids = np.concatenate([f.ids for f in workload.features if f.table == t])
        row = 8 + 8 * table.dim
        n, u = shard_loads(ids, table.vocab, hosts)
        ps_bytes += u.sum() * row * share
        coll_bytes += n.sum() * row * share
        # Bytes-weighted busiest shard over the mean shard (tables share a host, so add per shard index).
        ps_busiest, ps_mean = ps_busiest + u.max() * row, ps_mean + u.mean() * row
        coll_busiest, coll_mean = coll_busiest + n.max() * row, coll_mean + n.mean() * row
    ps_imbalance, capacity = ps_busiest / ps_mean, coll_busiest / coll_mean
    dense = 2 * dense_bytes * share
    straggler = 1 + cv * math.sqrt(2 * math.log(hosts))
    ps_network = (ps_bytes * ps_imbalance + dense) / bandwidth
    ps_worker = compute_s + 4 * LATENCY_S + ps_network
    ps_server = compute_s + 2 * hosts * request_cost_s
    synchronous = compute_s * straggler + (3 + 2 * math.log2(hosts)) * LATENCY_S
    return {
        "hosts": hosts,
        "ps_bytes": ps_bytes,
        "ps_imbalance": ps_imbalance,
        "collective_bytes": coll_bytes,
        "capacity_factor": capacity,
        "dense_bytes": dense,
        "straggler": straggler,
        "ps_step_s": max(ps_worker, ps_server),
        "ps_bound": "network" if ps_worker >= ps_server else "server",
        "collective_step_s": synchronous + (coll_bytes * capacity + dense) / bandwidth,
        "collective_distinct_step_s": synchronous + ps_network,
    }


def table(
    hosts=(8, 16, 32, 64), gbps: float = 25.0, dense_params: int = 1_000_000, request_cost_s: float = REQUEST_COST_S
) -> list[dict]:
    """The rows of the docs' table: W1 and W4 at every host count."""
    rows = []
    for make in (wls.w1, wls.w4):
        wl = make()
        compute_s, cv = measured_compute(wl.name)
        for n in hosts:
            r = step_model(wl, n, gbps * 1e9 / 8, 4.0 * dense_params, compute_s, cv, request_cost_s)
            rows.append({"workload": wl.name, "compute_s": compute_s, "cv": cv, **r})
    return rows


def markdown(rows: list[dict]) -> str:
    out = [
        "| workload | hosts | PS MB/host | PS imbalance | PS step ms (bound) | all ids: MB/host | capacity "
        "| all ids: step ms | distinct ids: step ms | straggler | fastest |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        steps = {
            "PS": r["ps_step_s"],
            "collective (all ids)": r["collective_step_s"],
            "collective (distinct ids)": r["collective_distinct_step_s"],
        }
        out.append(
            f"| {r['workload']} | {r['hosts']} | {r['ps_bytes'] / 1e6:.2f} | {r['ps_imbalance']:.2f} | "
            f"{r['ps_step_s'] * 1e3:.1f} ({r['ps_bound']}) | {r['collective_bytes'] / 1e6:.2f} | "
            f"{r['capacity_factor']:.2f} | {r['collective_step_s'] * 1e3:.1f} | "
            f"{r['collective_distinct_step_s'] * 1e3:.1f} | {r['straggler']:.2f} | {min(steps, key=steps.get)} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--gbps", type=float, default=25.0, help="link bandwidth per direction, Gb/s")
    p.add_argument("--dense-params", type=int, default=1_000_000, help="float32 dense weights all-reduced per step")
    p.add_argument("--request-us", type=float, default=REQUEST_COST_S * 1e6, help="a server's CPU per request, us")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    rows = table(tuple(args.hosts), args.gbps, args.dense_params, args.request_us * 1e-6)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
