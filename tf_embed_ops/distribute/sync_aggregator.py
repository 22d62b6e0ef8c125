"""Synchronous training of sharded tables: workers' sparse gradients meet in accumulators on the parameter servers.

The SyncReplicasOptimizer pattern, for embedding tables.  Every table shard gets a
`tf_embed_ops.SparseConditionalAccumulator` (reduction SUM, the TPU engine's cross-replica rule) on the
parameter server that owns the shard.  Once an aggregator is attached, a worker's `emb.apply_gradients(grads)`
no longer updates the tables: it turns the activation gradients into per-row gradients (de-duplicated on the
worker, so only touched rows travel) and applies them to the shards' accumulators, tagged with the global step
the worker read when it looked the rows up.  The chief's `take_and_apply()` waits for `replicas_to_aggregate`
gradients in every accumulator, runs the fused update once per shard with the summed rows (on the shard's own
server), and advances the global step.

Stale rule: a gradient tagged with a step below the accumulator's step (a worker that looked up the tables
before the last update) is dropped by the accumulator, so a late worker can never apply an out-of-date
gradient to the next round.

A round with K workers therefore updates the tables exactly as one `apply_gradients` of the single-process
class over the K batches together (the TPU sums across replicas; scale the loss yourself if you want a mean).

Example:
    >>> with strategy.scope():
    ...   emb = ShardedTPUEmbedding(feature_config, tf.tpu.experimental.embedding.Adagrad(0.1))
    ...   emb.build(per_replica_batch_size=64)
    ...   aggregator = SyncSparseAggregator(emb, replicas_to_aggregate=2)
    >>> for batches in rounds:
    ...   for b in batches: coordinator.schedule(worker_step, args=(b,))   # worker_step calls emb.apply_gradients
    ...   aggregator.take_and_apply()                                        # the chief: one synchronous update
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat, embedding_ops
from tf_embed_ops.distribute import partition
from tf_embed_ops.distribute.sharded_embedding import ShardedTPUEmbedding, place_variables_on, rounding_for_plan
from tf_embed_ops.sparse_accumulator import SparseConditionalAccumulator

__all__ = ["SyncSparseAggregator"]


def _apply_config(server_config: bytes) -> bytes:
    """The server's config with one feature per local table: the aggregated rows of that table, one id each."""
    config = _tf_compat.tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration()
    config.ParseFromString(server_config)
    del config.feature_descriptor[:]
    for j, table in enumerate(config.table_descriptor):
        feature = config.feature_descriptor.add()
        feature.name = f"{table.name}_aggregated_rows"
        feature.table_id = j
        feature.input_shape.append(1)  # descriptive: the kernels take the row count from the inputs
    return config.SerializeToString()


class _RuntimeState:
    """The aggregator's accumulators and compiled round functions (recreated per process, never checkpointed)."""

    def __init__(self, embedding):
        self.embedding = embedding  # not a checkpoint child: checkpoint the embedding beside the aggregator
        self.accumulators = None
        self.round_functions = {}


class SyncSparseAggregator(_tf_compat.AutoTrackable):
    """Synchronous (SyncReplicas-style) updates of a `ShardedTPUEmbedding` through sparse accumulators.

    Creating the aggregator attaches it to `embedding`: from then on `embedding.apply_gradients` feeds the
    accumulators and only `take_and_apply` changes the tables.  `global_step` (an int64 variable on the first
    parameter server) is tracked, so checkpoint the aggregator beside the embedding.

    Example:
        >>> aggregator = SyncSparseAggregator(emb, replicas_to_aggregate=2)
        >>> aggregator.take_and_apply()   # on the chief, after scheduling two worker steps
    """

    def __init__(self, embedding: ShardedTPUEmbedding, replicas_to_aggregate: int):
        """Creates the global step and attaches to `embedding`.

        The accumulators (one per table shard, on the shard's server, starting at `global_step`) are created
        at first use: the first worker step, `take_and_apply` or `initialize_steps`.

        Args:
          embedding: a `ShardedTPUEmbedding` (built here if it is not yet).
          replicas_to_aggregate: gradients each round waits for (>= 1), usually the number of workers.

        Raises:
          ValueError: if `embedding` is not a ShardedTPUEmbedding, already has an aggregator, has a dynamic table
            or a table with no optimizer, or `replicas_to_aggregate` < 1.
        """
        if not isinstance(embedding, ShardedTPUEmbedding):
            raise ValueError(f"Argument `embedding` must be a ShardedTPUEmbedding; got {type(embedding).__name__}.")
        if embedding.aggregator is not None:
            raise ValueError("Argument `embedding` already has a SyncSparseAggregator attached.")
        if embedding.dynamic_group is not None:
            names = ", ".join(repr(t.name) for t in embedding.dynamic_group.table_configs)
            raise ValueError(
                f"Argument `embedding` has dynamic tables ({names}); synchronous aggregation supports static tables "
                "only (dynamic tables train asynchronously, each shard on its own server)."
            )
        if (
            not isinstance(replicas_to_aggregate, int)
            or isinstance(replicas_to_aggregate, bool)
            or (replicas_to_aggregate < 1)
        ):
            raise ValueError(f"Argument `replicas_to_aggregate` must be an int >= 1; got {replicas_to_aggregate!r}.")
        for table in embedding.table_configs:
            if table.optimizer is None:
                raise ValueError(f"Table {table.name!r} has no optimizer; synchronous training needs one.")
        with tf.init_scope():
            embedding.build()
        self._replicas_to_aggregate = replicas_to_aggregate
        strategy = embedding.strategy
        scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
        first = embedding.devices[0]
        with tf.init_scope(), scope, tf.device(first), place_variables_on(first):
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="sync_global_step")
        # Runtime state outside checkpoint tracking (AutoTrackable would track lists/dicts set as attributes).
        self._runtime = _RuntimeState(embedding)
        embedding.attach_aggregator(self)

    @property
    def _embedding(self) -> ShardedTPUEmbedding:
        return self._runtime.embedding

    @property
    def replicas_to_aggregate(self) -> int:
        """Gradients each round waits for."""
        return self._replicas_to_aggregate

    def _server_accumulators(self) -> list:
        """Per server plan: one SUM accumulator per local table shard, created on that server (once)."""
        if self._runtime.accumulators is None:
            emb = self._embedding
            accumulators = []
            with tf.init_scope():
                for plan in emb.server_plans:
                    per_table = []
                    with tf.device(emb.devices[plan.task]):
                        for t in plan.tables:
                            table = emb.table_configs[t]
                            rows = emb.row_boundaries[t][plan.task + 1] - emb.row_boundaries[t][plan.task]
                            acc = SparseConditionalAccumulator(
                                tf.float32,
                                shape=[rows, table.dim],
                                reduction_type="SUM",
                                name=f"{table.name}_{plan.task}_grad_accumulator",
                            )
                            acc.set_global_step(self.global_step.read_value())
                            per_table.append(acc)
                    accumulators.append(per_table)
            self._runtime.accumulators = accumulators
        return self._runtime.accumulators

    def initialize_steps(self) -> None:
        """Sets every accumulator's step to `global_step` (call on the chief after restoring a checkpoint).

        Gradients tagged with an older step are dropped from then on.
        """
        step = self.global_step.read_value()
        for per_table in self._server_accumulators():
            for acc in per_table:
                acc.set_global_step(step)

    # ------------------------------------------------------------------ worker side

    def push_gradients(self, gradients: list, inputs: list, parts: list, local_step: tf.Tensor) -> list:
        """Applies the per-row gradients of one worker step to the shard accumulators (called by the embedding).

        Returns the apply ops (empty eagerly)."""
        emb = self._embedding
        flat_features = tf.nest.flatten(emb.feature_config)
        accumulators = self._server_accumulators()
        ops = []
        for plan, per_table in zip(emb.server_plans, accumulators, strict=True):
            combiners = emb.shard_combiners(plan)
            for j, t in enumerate(plan.tables):
                ids, rows = [], []
                for f in plan.features:
                    if emb.table_index[flat_features[f].table.name] != t:
                        continue
                    f_ids, f_rows = partition.row_gradients(parts[f][plan.task], combiners[j], gradients[f])
                    ids.append(f_ids)
                    rows.append(f_rows)
                # De-duplicate on the worker: one row per touched id crosses the network.
                unique, position = tf.unique(tf.concat(ids, axis=0), out_idx=tf.int64)
                summed = tf.math.unsorted_segment_sum(tf.concat(rows, axis=0), position, tf.size(unique))
                with tf.device(emb.devices[plan.task]):
                    op = per_table[j].apply_grad(unique, summed, local_step=local_step)
                if op is not None:
                    ops.append(op)
        return ops

    def apply_gradients(self, gradients: Any, local_step: Any = None) -> None:
        """Worker side: `embedding.apply_gradients(gradients)`, optionally tagging the gradient with `local_step`.

        Args:
          gradients: as `ShardedTPUEmbedding.apply_gradients`.
          local_step: the global step the gradient was computed at; default: the step read by the `dequeue`
            of this batch.  A step below the accumulators' is stale and dropped.
        """
        with self._embedding.gradients_tagged_with(local_step):
            self._embedding.apply_gradients(gradients)

    # ------------------------------------------------------------------ chief side

    def take_and_apply(self, timeout: float | None = None) -> tf.Tensor:
        """Chief side: waits for `replicas_to_aggregate` gradients per shard, applies their sum, advances the step.

        Eagerly, the round runs as one `tf.function`: a blocking take issued as a plain eager op would hold the
        parameter server's eager executor, and the workers' steps, queued behind it, would never arrive.

        Args:
          timeout: seconds each take may wait (None: no limit).

        Returns:
          The new global step (int64 scalar).

        Raises:
          tf.errors.DeadlineExceededError: if `timeout` passes first.  No table changes (every update waits for
            all takes), but shards whose take had already completed lose this round's gradients.
        """
        if tf.executing_eagerly():
            self._server_accumulators()  # create them eagerly, outside the trace
            key = None if timeout is None else float(timeout)
            if key not in self._runtime.round_functions:
                self._runtime.round_functions[key] = tf.function(functools.partial(self._take_and_apply, timeout=key))
            return self._runtime.round_functions[key]()
        return self._take_and_apply(timeout)

    def _take_and_apply(self, timeout: float | None) -> tf.Tensor:
        emb = self._embedding
        accumulators = self._server_accumulators()
        learning_rates = [tf.cast(fn(), tf.float32) for fn in emb.dynamic_learning_rates]
        rounding = emb.rounding_arguments()  # 16-bit tables: one rounding step per applied step
        taken = []
        with tf.name_scope("sync_take"):
            for plan, per_table in zip(emb.server_plans, accumulators, strict=True):
                with tf.device(emb.devices[plan.task]):
                    taken.append([acc.take_grad(self._replicas_to_aggregate, timeout=timeout) for acc in per_table])
        updates = []
        with tf.name_scope("sync_apply"), tf.control_dependencies([t.values for per in taken for t in per]):
            for plan, per_table in zip(emb.server_plans, taken, strict=True):
                tables, slots = emb.shard_variables(plan)
                inputs = [
                    embedding_ops.FeatureInput(
                        tf.zeros([0], tf.int64),
                        t.indices,
                        tf.zeros([0], tf.float32),
                        tf.shape(t.indices, out_type=tf.int64),
                    )
                    for t in per_table
                ]
                with tf.device(emb.devices[plan.task]):
                    updates.append(
                        embedding_ops.send_tpu_embedding_gradients(
                            [t.values for t in per_table],
                            [learning_rates[tag] for tag in plan.tags],
                            inputs,
                            tables,
                            slots,
                            _apply_config(plan.config),
                            combiners=["sum"] * len(per_table),
                            **rounding_for_plan(plan, rounding),
                        )
                    )
        emb.advance_rounding_step(updates)
        with tf.control_dependencies([u for u in updates if u is not None]):
            self.global_step.assign_add(1)
        return self.global_step.read_value()
