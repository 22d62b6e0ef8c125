"""The collectives of one collective job: all-to-all, all-reduce and all-gather between the workers' CPUs.

TensorFlow's own collective runtime (the ops behind `MultiWorkerMirroredStrategy`, over its gRPC servers):
`CollectiveAllToAllV2` moves ids, rows and gradients between workers, `CollectiveReduceV2` agrees on
capacities, `CollectiveGatherV2` assembles full tables for a checkpoint. Every call site takes its own range of instance
keys, the same on every worker because every worker traces the same calls in the same order; the ranges lie far
above the keys the strategy hands out, so the two never meet. TensorFlow fixes a key's tensor shape at its first
use, so a call whose shape varies from step to step (an all-to-all padded to the step's capacity) takes the key
`site base + capacity`: one key per shape. Each collective waits for the previous one of this
exchange (a control dependency): the workers run them in one order, and a dead peer is reported after
`timeout_seconds` instead of hanging.

`route` / `unroute` are the bookkeeping around an all-to-all: values grouped by destination worker, each group
padded to a common capacity (as SparseCore pads each partition to `max_ids_per_partition`), and the way back.

Example:
    >>> ex = Exchange(num_workers=2, timeout_seconds=60)
    >>> received = ex.all_to_all(tf.reshape(ids, [2, -1]))   # row d goes to worker d
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import tensorflow as tf

__all__ = ["MAX_CAPACITY", "Exchange", "Route", "place", "route", "unroute"]

# CollectiveKeys of the strategies start at 1 and count up by one per group / instance.
_GROUP_KEY = 0x7E5E0000
_FIRST_INSTANCE_KEY = 1 << 28
# Keys per call site: the largest capacity an all-to-all may have (ids one worker sends to one worker in a step).
MAX_CAPACITY = (1 << 22) - 1
_MAX_SITES = ((1 << 31) - _FIRST_INSTANCE_KEY) >> 22
# Call sites are numbered per process (every worker runs the same program, so they number them alike): two
# exchanges of one process never share a key, whatever shapes they send.
_SITES = itertools.count()


class Exchange:
    """The collectives of the `num_workers` workers' CPU devices (one group), with one timeout."""

    def __init__(self, num_workers: int, timeout_seconds: float, group_key: int = _GROUP_KEY):
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"Argument `num_workers` must be an int >= 1; got {num_workers!r}.")
        if not timeout_seconds > 0:
            raise ValueError(f"Argument `timeout_seconds` must be > 0; got {timeout_seconds!r}.")
        self.num_workers = num_workers
        self.timeout_seconds = float(timeout_seconds)
        self._group_key = group_key
        # Bytes this worker's collectives sent to the others (the payloads, padding included; without the dense
        # gradients' all-reduce, which the strategy runs): what `fit` reports per step.
        self.sent_bytes = tf.Variable(0, dtype=tf.int64, trainable=False, name="collective_sent_bytes")
        self._last: Any = None  # the previous collective's output in the function being traced

    def _count(self, x: tf.Tensor, factor: float) -> None:
        size = tf.cast(tf.size(x, out_type=tf.int64), tf.float64) * x.dtype.size * factor
        self.sent_bytes.assign_add(tf.cast(size, tf.int64))

    def _collective(self, op: Any, x: tf.Tensor, capacity: tf.Tensor | None = None, **attrs: Any) -> tf.Tensor:
        """Runs the collective `op` on `x` in this group, in call order (`_ordered`), with `attrs` of its own."""
        return self._ordered(
            lambda key: op(
                input=x,
                group_size=self.num_workers,
                group_key=self._group_key,
                instance_key=key,
                ordering_token=[],
                communication_hint="ring",
                timeout_seconds=self.timeout_seconds,
                **attrs,
            ),
            capacity,
        )

    def _ordered(self, fn, capacity: tf.Tensor | None = None):
        site = next(_SITES)
        if site >= _MAX_SITES:
            raise ValueError(
                f"More than {_MAX_SITES} collective call sites in one process (tables x traced functions)."
            )
        key = tf.constant(_FIRST_INSTANCE_KEY + (site << 22), tf.int32)
        deps = [self._last] if self._last is not None and _same_graph(self._last) else []
        if capacity is not None:
            deps.append(
                tf.debugging.assert_less_equal(
                    capacity,
                    tf.constant(MAX_CAPACITY, capacity.dtype),
                    message=f"An all-to-all's capacity (ids one worker sends another in a step) exceeds {MAX_CAPACITY}",
                )
            )
        with tf.control_dependencies(deps):
            if capacity is not None:
                key = key + tf.cast(capacity, tf.int32)
            out = fn(key)
        self._last = out
        return out

    def all_to_all(self, x: tf.Tensor, capacity: tf.Tensor | None = None) -> tf.Tensor:
        """`x` is [num_workers, capacity, ...]: row d goes to worker d; returns the same shape, row s from worker s.

        `capacity` (an int64 scalar, x's second dimension) when it varies between steps."""
        if self.num_workers == 1:
            return tf.identity(x)
        self._count(x, (self.num_workers - 1) / self.num_workers)  # every row but its own
        return self._collective(tf.raw_ops.CollectiveAllToAllV2, x, capacity)

    def all_reduce(self, x: tf.Tensor, op: str = "Max") -> tf.Tensor:
        """Elementwise "Max", "Min", "Add" or "Mul" over the workers."""
        if self.num_workers == 1:
            return tf.identity(x)
        self._count(x, 2 * (self.num_workers - 1) / self.num_workers)  # a ring all-reduce
        return self._collective(tf.raw_ops.CollectiveReduceV2, x, merge_op=op, final_op="Id")

    def all_gather(self, x: tf.Tensor, capacity: tf.Tensor | None = None) -> tf.Tensor:
        """Concatenates every worker's `x` (one shape on every worker) along axis 0.

        `capacity` (an int64 scalar, x's first dimension) when it varies between calls."""
        if self.num_workers == 1:
            return tf.identity(x)
        self._count(x, self.num_workers - 1)  # a ring all-gather passes on every other worker's part
        return self._collective(tf.raw_ops.CollectiveGatherV2, x, capacity)


def _same_graph(t: Any) -> bool:
    if tf.executing_eagerly():
        return False
    return getattr(t, "graph", None) is tf.compat.v1.get_default_graph()


class Route(NamedTuple):
    """Where each value goes: `position[i]` = (destination worker, rank among the values bound there)."""

    position: tf.Tensor  # int64 [n, 2]
    counts: tf.Tensor  # int64 [num_workers]: values per destination


def route(destination: tf.Tensor, num_workers: int) -> Route:
    """Slots of values bound for `destination` (int64 [n], each in [0, num_workers)), in input order per worker.

    The capacity is agreed afterwards from `counts` (every worker's largest count): `place` lays the values out."""
    n = tf.size(destination, out_type=tf.int64)
    order = tf.argsort(destination, stable=True)
    counts = tf.math.bincount(
        tf.cast(destination, tf.int32), minlength=num_workers, maxlength=num_workers, dtype=tf.int64
    )
    starts = tf.cumsum(counts, exclusive=True)
    sorted_destination = tf.gather(destination, order)
    rank_sorted = tf.range(n, dtype=tf.int64) - tf.gather(starts, sorted_destination)
    rank = tf.scatter_nd(tf.cast(order, tf.int64)[:, tf.newaxis], rank_sorted, [n])
    return Route(position=tf.stack([destination, rank], axis=1), counts=counts)


def place(values: tf.Tensor, r: Route, capacity: tf.Tensor, num_workers: int, fill: Any) -> tf.Tensor:
    """[num_workers, capacity, ...]: `values[i]` at `r.position[i]`, `fill` elsewhere (every count <= capacity)."""
    shape = tf.concat([[num_workers, capacity], tf.shape(values, out_type=tf.int64)[1:]], axis=0)
    base = tf.fill(shape, tf.constant(fill, values.dtype))
    return tf.tensor_scatter_nd_update(base, r.position, values)


def unroute(buffer: tf.Tensor, r: Route) -> tf.Tensor:
    """The values at `r`'s slots of a [num_workers, capacity, ...] buffer, in the routed values' order."""
    return tf.gather_nd(buffer, r.position)
