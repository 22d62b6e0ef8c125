"""The TensorFlow-native composition of a dynamic table: what a TensorFlow user builds today without a plugin.

`tf.lookup.experimental.MutableHashTable` maps each 64-bit key to a row of ordinary `tf.Variable`s (the weights
and the optimizer slots), new keys get the next free row, and the update is the same sparse-apply kernel as
the static raw-op peer (`peers/tf_native.py`): `tf.unique` + `unsorted_segment_sum` de-duplication, then
`ResourceSparseApply*`. The variables are sized for `capacity` rows up front (growing a `tf.Variable` means
copying it), which is the composition's usual form.

Example:
    >>> step = training_step(keys, upstream, dim=8, capacity=1000, optimizer="adagrad")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from benchmarks.peers import tf_native as tn

OPTIMIZERS = ("sgd", "adagrad")


class NativeDynamicTable:
    """MutableHashTable key -> row, a [capacity, dim] weights variable and one variable per optimizer slot."""

    def __init__(self, dim: int, capacity: int, slot_inits: list[float], seed: int = 5):
        self.index = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1)
        self.weights = tf.Variable(tf.random.stateless_uniform([capacity, dim], [seed, 0], -0.05, 0.05))
        self.slots = [tf.Variable(tf.fill([capacity, dim], v)) for v in slot_inits]
        self.next_row = tf.Variable(tf.constant(0, tf.int64))
        self.capacity = capacity

    def prefill(self, keys: np.ndarray) -> None:
        """Gives every key a row, in order (what a table that has seen these keys holds)."""
        n = int(keys.shape[0])
        if n > self.capacity:
            raise ValueError(f"prefill: {n} keys for a capacity of {self.capacity}")
        self.index.insert(tf.constant(keys, tf.int64), tf.range(n, dtype=tf.int64))
        self.next_row.assign(n)

    def rows_inserting(self, keys: tf.Tensor) -> tf.Tensor:
        """Rows of `keys`, giving new keys the next free rows (the training lookup)."""
        uniq, idx = tf.unique(keys)
        rows = tf.reshape(self.index.lookup(uniq), [-1])  # the hash table's output has no static shape
        missing = rows < 0
        new_keys = tf.boolean_mask(uniq, missing)
        new_rows = self.next_row.read_value() + tf.range(tf.size(new_keys, out_type=tf.int64), dtype=tf.int64)
        with tf.control_dependencies([self.index.insert(new_keys, new_rows)]):
            self.next_row.assign_add(tf.size(new_keys, out_type=tf.int64))
        rows = tf.tensor_scatter_nd_update(rows, tf.where(missing), new_rows)
        return tf.gather(rows, idx)

    def rows(self, keys: tf.Tensor) -> tf.Tensor:
        return tf.reshape(self.index.lookup(keys), tf.shape(keys))


def training_step(
    keys: np.ndarray, upstream: tf.Tensor, dim: int, capacity: int, optimizer: str, prefill: np.ndarray | None = None
) -> Callable[[], tf.Tensor]:
    """One step: insert-or-find the rows, gather, tape gradient, de-duplicate, sparse-apply."""
    if optimizer not in OPTIMIZERS:
        raise NotImplementedError(f"no TF-native dynamic peer for {optimizer}")
    table = NativeDynamicTable(dim, capacity, {"sgd": [], "adagrad": [tn.ADAGRAD_INIT]}[optimizer])
    if prefill is not None:
        table.prefill(prefill)
    ids = tf.constant(keys, tf.int64)

    @tf.function
    def step():
        rows = table.rows_inserting(ids)
        with tf.GradientTape() as tape:
            acts = tf.gather(table.weights, rows)
        grad = tape.gradient(acts, table.weights, output_gradients=upstream)
        uniq, idx = tf.unique(grad.indices)
        g = tf.math.unsorted_segment_sum(grad.values, idx, tf.shape(uniq)[0])
        lr = tf.constant(tn.LR)
        if optimizer == "sgd":
            op = tf.raw_ops.ResourceScatterSub(resource=table.weights.handle, indices=uniq, updates=lr * g)
        else:
            op = tf.raw_ops.ResourceSparseApplyAdagradV2(
                var=table.weights.handle,
                accum=table.slots[0].handle,
                lr=lr,
                epsilon=tf.constant(0.0),
                grad=g,
                indices=uniq,
            )
        with tf.control_dependencies([op]):
            return tf.identity(acts)

    step.table = table
    return step


def lookup_step(keys: np.ndarray, dim: int, capacity: int, prefill: np.ndarray) -> Callable[[], tf.Tensor]:
    """Serving: hash-table lookup (no insert) + gather, zeros for keys without a row."""
    table = NativeDynamicTable(dim, capacity, [])
    table.prefill(prefill)
    ids = tf.constant(keys, tf.int64)

    @tf.function
    def step():
        rows = table.rows(ids)
        found = rows >= 0
        vals = tf.gather(table.weights, tf.maximum(rows, 0))
        return vals * tf.cast(found, tf.float32)[:, tf.newaxis]

    step.table = table
    return step
