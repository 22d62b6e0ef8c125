"""The forward half of a collective step: ids to their shard's worker, rows back, combined where they were asked.

Per table: the worker's distinct ids (over the table's features) are routed to `id % N` by an all-to-all, each
destination's list padded to the step's capacity; each worker gathers the requested local rows `id // N` from its
shard and returns them by a second all-to-all. The requesting worker then combines the rows per sample with
`tf_embed_ops._xla.lookup`, the op's lookup in stock TensorFlow ops, bit for bit the op's (combiner norm in
float64, per-id factor, sums in input order): the activations equal the single-process layer's.

The per-id rows it combined are kept (`TableLookup.rows`, watched by the step's tape): their gradient is the
per-id contribution `w_i / norm_s * dL/dact[s]` the kernel would compute, which `update` sends to the shards.

Capacity: by default the step's largest list over all workers (an all-reduce: nothing is ever dropped); with
`max_ids_per_worker` a fixed capacity, and a step that needs more stops on every worker with an
InvalidArgumentError naming the table, the capacity and the count.

Example:
    >>> acts, pending = lookup(shards, features, weights=None, tape=tape, max_ids_per_worker=None)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from tf_embed_ops import _xla, embedding_ops
from tf_embed_ops.distribute.collective import exchange as exchange_lib
from tf_embed_ops.distribute.collective.shards import LayerShards
from tf_embed_ops.dynamic import sharding
from tf_embed_ops.engine import lookup as lookup_lib

__all__ = ["TableLookup", "lookup", "owner"]


class TableLookup(NamedTuple):
    """What the backward half needs of one table's lookup."""

    ids: tf.Tensor  # int64 [n]: every id of the table's features, feature after feature, in input order
    feature: tf.Tensor  # int64 [n]: each id's feature, as its index among the table's features
    rows: tf.Tensor  # float32 [n, dim]: each id's row as the lookup combined it (watched)
    capacity: tf.Tensor  # int64: the gradients' per-destination capacity (agreed by every worker)


def owner(ids: tf.Tensor, num_workers: int, dynamic: bool) -> tf.Tensor:
    """The worker holding each id's row: `id % N` (static), `shard_of_keys(key, N)` (dynamic)."""
    if dynamic:
        return tf.cast(sharding.shard_of_keys(ids, num_workers), tf.int64)
    return ids % num_workers


def _dynamic_rows(group, asked: tf.Tensor, dim: int) -> tf.Tensor:
    """The rows of the keys other workers asked this worker for ([N, C, 2]: key, 1 or padding), [N, C, dim]; the
    training lookup inserts new keys as one process's lookup does (rows a function of the key)."""
    flat = tf.reshape(asked, [-1, 2])
    valid = tf.equal(flat[:, 1], 1)
    keys = tf.boolean_mask(flat[:, 0], valid)
    feature = embedding_ops.FeatureInput(
        sample_indices_or_row_splits=tf.zeros([0], tf.int64),
        ids=keys,
        weights=tf.zeros([0], tf.float32),
        sample_shape=tf.shape(keys, out_type=tf.int64),
    )
    (rows,) = group.lookup([feature], training=True)
    positions = tf.where(valid)
    shape = tf.concat([tf.shape(asked, out_type=tf.int64)[:2], [dim]], axis=0)
    return tf.reshape(tf.scatter_nd(positions, rows, tf.stack([tf.size(valid, out_type=tf.int64), dim])), shape)


class _Rows:
    """A table for `_xla.lookup` that answers a feature's ids with the rows already fetched for them, in order."""

    def __init__(self, rows: tf.Tensor):
        self._rows = rows

    def gather_rows(self, ids: tf.Tensor) -> tf.Tensor:
        del ids  # the rows were fetched for exactly these ids, in this order
        return self._rows


def lookup(
    shards: LayerShards, features: Any, weights: Any, tape: tf.GradientTape, max_ids_per_worker: int | None
) -> tuple[Any, list]:
    """Activations of `features` (the layer's input nest) and, per table, its `TableLookup`.

    Must run in a function traced identically on every worker (the collectives pair up by order)."""
    ex = shards.exchange
    n = ex.num_workers
    inputs, _ = shards.layer.embedding.normalize_inputs(features, weights)
    acts: list = [None] * len(inputs)
    pending = []
    for t, table in enumerate(shards.tables):
        positions = shards.table_features[t]
        ids = tf.concat([tf.cast(inputs[i].ids, tf.int64) for i in positions], axis=0)
        sizes = [tf.size(inputs[i].ids, out_type=tf.int64) for i in positions]
        feature = tf.concat([tf.fill([s], tf.constant(k, tf.int64)) for k, s in enumerate(sizes)], axis=0)
        unique, index = tf.unique(ids, out_idx=tf.int64)
        dynamic = shards.is_dynamic(t)
        request = exchange_lib.route(owner(unique, n, dynamic), n)
        every = exchange_lib.route(owner(ids, n, dynamic), n)  # the gradients' route, now to agree on sizes
        if dynamic:  # any int64 key is valid
            bad = tf.constant(0, tf.int64)
        else:
            bad = tf.reduce_sum(tf.cast((ids < 0) | (ids >= table.vocabulary_size), tf.int64))
        agreed = ex.all_reduce(tf.stack([tf.reduce_max(request.counts), tf.reduce_max(every.counts), bad, -bad]), "Max")
        checks = [
            tf.debugging.assert_equal(
                agreed[2],
                tf.constant(0, tf.int64),
                message=(
                    f"Table {table.name!r}: ids must be in [0, {table.vocabulary_size}) (the table's "
                    "vocabulary_size); a worker's batch holds ids outside it (max count of such ids over the workers "
                    "shown); nothing was changed"
                ),
            )
        ]
        capacity, grad_capacity = agreed[0], agreed[1]
        if max_ids_per_worker is not None:
            for count in (agreed[0], agreed[1]):
                checks.append(
                    tf.debugging.assert_less_equal(
                        count,
                        tf.constant(max_ids_per_worker, tf.int64),
                        message=(
                            f"Table {table.name!r}: a worker sends more ids to one worker than max_ids_per_worker="
                            f"{max_ids_per_worker} allows (the count is the first value shown); raise "
                            "max_ids_per_worker or leave it None (capacity per step); nothing was changed"
                        ),
                    )
                )
            capacity = grad_capacity = tf.constant(max_ids_per_worker, tf.int64)
        with tf.control_dependencies(checks):
            # Every use of a capacity waits for the checks (the gradients' exchange included).
            capacity, grad_capacity = tf.identity(capacity), tf.identity(grad_capacity)
            if dynamic:
                # (key, 1); padding (-1, -1): a key may be any int64, -1 included.
                keyed = tf.stack([unique, tf.ones_like(unique)], axis=1)
                asked = ex.all_to_all(exchange_lib.place(keyed, request, capacity, n, -1), capacity)
            else:
                asked = ex.all_to_all(exchange_lib.place(unique // n, request, capacity, n, -1), capacity)
        if dynamic:
            found = _dynamic_rows(shards.dynamic_group(t), asked, table.dim)
        else:
            shard_table = shards.shard.variables[table.name]["parameters"]
            found = tf.cast(tf.gather(shard_table, tf.maximum(asked, 0)), tf.float32)
        answered = ex.all_to_all(found, capacity)
        rows = tf.gather(exchange_lib.unroute(answered, request), index)
        tape.watch(rows)
        per_feature = tf.split(rows, tf.stack(sizes), axis=0) if len(positions) > 1 else [rows]
        for i, feature_rows in zip(positions, per_feature, strict=True):
            dense = inputs[i].sample_indices_or_row_splits.shape.as_list() == [0]
            acts[i] = _xla.lookup(inputs[i], dense, _Rows(feature_rows), table.dim, table.combiner)
        pending.append(TableLookup(ids=ids, feature=feature, rows=rows, capacity=grad_capacity))
    acts = lookup_lib.reshape_activations(acts, shards.features)
    return tf.nest.pack_sequence_as(shards.layer.feature_config, acts), pending
