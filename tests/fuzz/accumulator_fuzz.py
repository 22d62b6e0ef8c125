"""Sparse-accumulator fuzzer: random sequences of valid and malformed applies, takes and global-step updates
against the numpy reference of tests/sparse_accumulator_support.py.

Checks: no crash or hang; a rejected call raises InvalidArgument (op) or ValueError/TypeError (wrapper) and
changes nothing: num_accumulated stays, and every take returns exactly (float64, integer-valued gradients: sums
are exact) what the reference computes from the accepted gradients alone; malformed gradients are rejected
even when stale.
"""

from __future__ import annotations

import random
import time

import numpy as np
import tensorflow as tf
from sparse_accumulator_support import ReferenceAccumulator

from tf_embed_ops.sparse_accumulator import SparseConditionalAccumulator

from ._harness import Budget, Report, Watchdog

EXPECTED = (tf.errors.InvalidArgumentError, ValueError, TypeError)


def _valid(rng: random.Random, rows: int, dim: int):
    n = rng.randint(0, 5)
    indices = np.array([rng.randrange(rows) for _ in range(n)], np.int64)
    values = np.array([[rng.randint(-4, 4) for _ in range(dim)] for _ in range(n)], np.float64).reshape([n, dim])
    return indices, values


def _malformed(rng: random.Random, rows: int, dim: int):
    """Arguments of apply_grad that the accumulator must reject, and a name for the report."""
    indices, values = _valid(rng, rows, dim)
    if not len(indices):
        indices, values = np.array([0], np.int64), np.zeros([1, dim])
    kind = rng.randrange(7)
    shape = [rows, dim]
    if kind == 0:
        indices = indices.copy()
        indices[rng.randrange(len(indices))] = rng.choice([rows, -1, 2**62, -(2**63)])
    elif kind == 1:
        values = np.zeros([len(indices) + rng.choice([1, -1]), dim])
    elif kind == 2:
        values = np.zeros([len(indices), dim + rng.choice([1, 2])])
    elif kind == 3:
        shape = rng.choice([[rows + 1, dim], [rows, dim + 1], [rows]])
    elif kind == 4:
        indices = indices.reshape([-1, 1])
    elif kind == 5:
        values = np.zeros([len(indices)])  # rank 1
    else:
        values = tf.constant(values, tf.float32)  # a tensor of another dtype (numpy input is converted)
    return ("indices", "values_count", "values_dim", "shape", "indices_rank", "values_rank", "dtype")[kind], (
        indices,
        values,
        shape,
    )


def _check_take(acc, ref: ReferenceAccumulator, count: int, report: Report, history) -> None:
    indices, values, shape = acc.take_grad(count)
    want = ref.take()
    got = (indices.numpy(), values.numpy(), shape.numpy())
    if not all(np.array_equal(g, w) and g.dtype == w.dtype for g, w in zip(got, want, strict=True)):
        report.fail("take differs from the reference of the accepted gradients", (history[-10:], got, want))


def run(seconds: float, seed: int = 0, max_inputs: int | None = None) -> Report:
    rng = random.Random(seed)
    report = Report("accumulator", seed)
    budget = Budget(seconds, max_inputs)
    start = time.monotonic()
    with Watchdog() as watchdog:
        while budget.more():
            rows, dim = rng.randint(1, 12), rng.randint(1, 3)
            mean = rng.random() < 0.5
            acc = SparseConditionalAccumulator(tf.float64, shape=[rows, dim], reduction_type="MEAN" if mean else "SUM")
            ref = ReferenceAccumulator(mean=mean, dim0=rows)
            history = []
            for _ in range(rng.randint(5, 40)):
                if not budget.more():
                    break
                budget.count += 1
                watchdog.kick()
                op = rng.random()
                step = ref.global_step + rng.choice([0, 0, 0, 1, -1])
                if op < 0.45:
                    indices, values = _valid(rng, rows, dim)
                    acc.apply_grad(indices, values, [rows, dim], local_step=step)
                    ref.apply(indices, values, local_step=step)
                    report.accepted += 1
                    history.append(("apply", indices.tolist(), values.tolist(), step))
                elif op < 0.85:
                    name, (indices, values, shape) = _malformed(rng, rows, dim)
                    report.bump(name)
                    try:
                        acc.apply_grad(indices, values, shape, local_step=step)
                        report.fail("a malformed gradient was accepted", (name, indices, values, shape, step))
                    except EXPECTED:
                        report.rejected += 1
                    except Exception as e:
                        report.fail(f"{type(e).__name__}: {e}", (name, indices, values, shape))
                    history.append(("rejected", name))
                elif op < 0.92:
                    try:
                        acc.take_grad(rng.choice([0, -1, -(2**31)]))
                        report.fail("take_grad with num_required <= 0 was accepted", None)
                    except EXPECTED:
                        report.rejected += 1
                else:
                    report.bump("take")
                    if ref.counter:
                        _check_take(acc, ref, rng.randint(1, ref.counter), report, history)
                        report.accepted += 1
                if int(acc.num_accumulated()) != ref.counter:
                    report.fail("num_accumulated differs from the reference", history[-10:])
                    break
            if ref.counter:
                _check_take(acc, ref, ref.counter, report, history)
    report.inputs = budget.count
    report.seconds = time.monotonic() - start
    return report
