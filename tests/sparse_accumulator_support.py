"""Test support for the sparse accumulator suites: execution modes, the helpers the
suites call them through, and an independent numpy reference.

The reference is written from the semantics (docs/sparse_accumulator.md, canonical mode), not from the kernels:
per-row sums and counts, a row's count growing by one per gradient touching it, duplicates within one
gradient summed first, rows returned in ascending order.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_embed_ops.sparse_accumulator import SparseConditionalAccumulator


class EagerRunner:
    """Runs each call eagerly."""

    name = "eager"

    def make(self, *args, **kwargs) -> SparseConditionalAccumulator:
        return SparseConditionalAccumulator(*args, **kwargs)

    def run(self, fn):
        return _to_numpy(fn())

    def close(self):
        pass


class FunctionRunner(EagerRunner):
    """Creates accumulators eagerly, runs each call inside a fresh tf.function (the handle is captured)."""

    name = "function"

    def run(self, fn):
        def body():
            out = fn()
            return tf.constant(0) if out is None or isinstance(out, tf.Operation) else out

        out = tf.function(body)()
        return _to_numpy(out)


class GraphRunner:
    """TF1 style: one graph and one session; each call adds ops to the graph and runs them."""

    name = "graph"

    def __init__(self):
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph)

    def make(self, *args, **kwargs) -> SparseConditionalAccumulator:
        with self.graph.as_default():
            return SparseConditionalAccumulator(*args, **kwargs)

    def run(self, fn):
        with self.graph.as_default():
            out = fn()
        if out is None:
            return None
        result = self.session.run(out)
        return None if isinstance(out, tf.Operation) else result

    def close(self):
        self.session.close()


RUNNERS = {"eager": EagerRunner, "function": FunctionRunner, "graph": GraphRunner}


IA = tf.errors.InvalidArgumentError


@pytest.fixture(params=sorted(RUNNERS), name="runner")
def runner_fixture(request):
    """`runner`: each execution mode of RUNNERS (import `runner_fixture` into a test module to use it)."""
    r = RUNNERS[request.param]()
    yield r
    r.close()


def count(runner, acc) -> int:
    return int(runner.run(lambda: acc.num_accumulated()))


def take(runner, acc, n=1):
    return runner.run(lambda: tuple(acc.take_grad(n, timeout=30.0)))


def apply(runner, acc, indices, values, grad_shape=None, local_step=0):
    return runner.run(lambda: acc.apply_grad(indices, values, grad_shape=grad_shape, local_step=local_step))


def assert_take(result, indices, values, shape):
    """A take's (indices, values, shape) is the one expected."""
    got_indices, got_values, got_shape = result
    np.testing.assert_array_equal(got_indices, np.asarray(indices, np.int64))
    np.testing.assert_allclose(got_values, np.asarray(values, got_values.dtype), rtol=1e-6)
    np.testing.assert_array_equal(got_shape, np.asarray(shape, np.int64))


def _to_numpy(out):
    if out is None or isinstance(out, tf.Operation):
        return None
    if isinstance(out, tf.IndexedSlices):
        return tf.compat.v1.IndexedSlicesValue(out.values.numpy(), out.indices.numpy(), out.dense_shape.numpy())
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)


class ReferenceAccumulator:
    """numpy model of one accumulator (docs/sparse_accumulator.md, canonical mode), for valid inputs only."""

    def __init__(self, mean: bool = True, dim0: int = -1, dtype=np.float64):
        self.mean = mean
        self.dim0 = dim0
        self.dtype = dtype
        self.counter = 0
        self.global_step = 0
        self.rows: dict[int, np.ndarray] = {}
        self.counts: dict[int, int] = {}
        self.row_shape: tuple[int, ...] | None = None

    def apply(self, indices, values, local_step: int = 0) -> None:
        values = np.asarray(values, dtype=self.dtype)
        if local_step < self.global_step:
            return
        if self.counter == 0:
            self.rows, self.counts, self.row_shape = {}, {}, values.shape[1:]
        canonical: dict[int, np.ndarray] = {}
        for i, index in enumerate(np.asarray(indices, dtype=np.int64).tolist()):
            canonical[index] = values[i].copy() if index not in canonical else canonical[index] + values[i]
        for index, row in canonical.items():
            if index in self.rows:
                self.rows[index] = self.rows[index] + row
                self.counts[index] += 1
            else:
                self.rows[index] = row
                self.counts[index] = 1
        self.counter += 1

    def take(self):
        """Returns (indices, values, dense_shape) and resets, as a completed take does."""
        order = sorted(self.rows)
        rows = [self.rows[i] / self.dtype(self.counts[i]) if self.mean else self.rows[i] for i in order]
        values = np.array(rows, dtype=self.dtype).reshape((len(order),) + tuple(self.row_shape))
        shape = np.array([self.dim0] + list(self.row_shape), dtype=np.int64)
        self.counter = 0
        self.global_step += 1
        return np.array(order, dtype=np.int64), values, shape
