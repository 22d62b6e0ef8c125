"""Sparse accumulator throughput: tf_embed_ops.SparseConditionalAccumulator vs TensorFlow's own (graph mode).

One round = 32 applies of 16,384 sorted unique rows x 64 float32, then one take of the aggregate.
  disjoint:    apply k covers rows [16384 k, 16384 (k+1))  (TensorFlow's merge copies every held row per apply)
  overlapping: every apply draws its rows from the same 32,768-row range (about half of each apply overlaps)
Both accumulators run in one TF1 graph and session over the same gradients held in variables (so feeding
and slicing cost nothing), rounds alternate between them, and the median over repeats is reported.  Ours is also timed
eagerly (its native mode; TensorFlow's cannot run eagerly).  Writes benchmarks/results/accumulator.json.

  python benchmarks/accumulator_benchmark.py [--repeats 5] [--applies 32] [--rows 16384] [--width 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import tensorflow as tf

from tf_embed_ops.sparse_accumulator import SparseConditionalAccumulator

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "accumulator.json")


def make_gradients(case: str, applies: int, rows: int, width: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    if case == "disjoint":
        indices = np.stack([np.arange(k * rows, (k + 1) * rows) for k in range(applies)])
    else:
        indices = np.stack([np.sort(rng.choice(2 * rows, size=rows, replace=False)) for _ in range(applies)])
    values = rng.standard_normal((applies, rows, width), dtype=np.float32)
    return indices.astype(np.int64), values


def time_graph(indices: np.ndarray, values: np.ndarray, repeats: int) -> dict[str, list[float]]:
    applies = indices.shape[0]
    times: dict[str, list[float]] = {"tensorflow": [], "tf_embed_ops_graph": []}
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        # One variable per apply: reading a resource variable costs no copy, so only the accumulators are timed.
        idx_in = tf.compat.v1.placeholder(tf.int64, indices.shape[1:])
        val_in = tf.compat.v1.placeholder(tf.float32, values.shape[1:])
        idx_vars = [tf.compat.v1.Variable(idx_in, trainable=False, use_resource=True) for _ in range(applies)]
        val_vars = [tf.compat.v1.Variable(val_in, trainable=False, use_resource=True) for _ in range(applies)]
        for k in range(applies):
            sess.run([idx_vars[k].initializer, val_vars[k].initializer], {idx_in: indices[k], val_in: values[k]})
        step = tf.compat.v1.placeholder(tf.int64, [])
        accs = {
            "tensorflow": tf.compat.v1.SparseConditionalAccumulator(tf.float32, shape=[None, values.shape[2]]),
            "tf_embed_ops_graph": SparseConditionalAccumulator(tf.float32, shape=[None, values.shape[2]]),
        }
        graphs = {}
        for name, acc in accs.items():
            apply_ops = [acc.apply_grad(idx_vars[k], val_vars[k], local_step=step) for k in range(applies)]
            take = acc.take_grad(applies)
            graphs[name] = (apply_ops, take)
        for r in range(repeats + 1):  # round 0 warms up
            for name, (apply_ops, take) in graphs.items():
                start = time.perf_counter()
                sess.run(apply_ops, {step: r})
                out = sess.run(take)
                elapsed = time.perf_counter() - start
                assert out.indices.shape[0] == np.unique(indices).size
                if r:
                    times[name].append(elapsed)
    return times


def time_eager(indices: np.ndarray, values: np.ndarray, repeats: int) -> list[float]:
    idx = [tf.constant(i) for i in indices]
    val = [tf.constant(v) for v in values]
    acc = SparseConditionalAccumulator(tf.float32, shape=[None, values.shape[2]])
    times = []
    for r in range(repeats + 1):
        start = time.perf_counter()
        for i, v in zip(idx, val, strict=True):
            acc.apply_grad(i, v, local_step=r)
        out = acc.take_grad(len(idx))
        out.values.numpy()
        elapsed = time.perf_counter() - start
        if r:
            times.append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--applies", type=int, default=32)
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()
    report = {"config": vars(args), "cases": {}}
    print(
        f"{'case':12s} {'TensorFlow ms':>14s} {'ours graph ms':>14s} {'ours eager ms':>14s} "
        f"{'speedup graph':>14s} {'speedup eager':>14s}"
    )
    for case in ("disjoint", "overlapping"):
        indices, values = make_gradients(case, args.applies, args.rows, args.width)
        graph_times = time_graph(indices, values, args.repeats)
        eager_times = time_eager(indices, values, args.repeats)
        medians = {name: statistics.median(t) * 1e3 for name, t in graph_times.items()}
        medians["tf_embed_ops_eager"] = statistics.median(eager_times) * 1e3
        row = {
            "median_ms": medians,
            "all_ms": {
                **{k: [x * 1e3 for x in v] for k, v in graph_times.items()},
                "tf_embed_ops_eager": [x * 1e3 for x in eager_times],
            },
            "speedup_graph": medians["tensorflow"] / medians["tf_embed_ops_graph"],
            "speedup_eager": medians["tensorflow"] / medians["tf_embed_ops_eager"],
        }
        report["cases"][case] = row
        print(
            f"{case:12s} {medians['tensorflow']:14.1f} {medians['tf_embed_ops_graph']:14.1f} "
            f"{medians['tf_embed_ops_eager']:14.1f} {row['speedup_graph']:13.2f}x {row['speedup_eager']:13.2f}x"
        )
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS + ".tmp", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    os.replace(RESULTS + ".tmp", RESULTS)
    print("wrote", RESULTS)


if __name__ == "__main__":
    main()
