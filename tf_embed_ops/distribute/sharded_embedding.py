"""`ShardedTPUEmbedding`: the mid-level API with tables row-sharded over parameter servers.

Under `tf.distribute.experimental.ParameterServerStrategy`, each table (and each optimizer slot) is split into
contiguous DIV row ranges (`sharding.div_shard_sizes`), shard p living on ``/job:ps/task:p``.  A step never moves
a table, and each server gets only what it owns: the worker partitions the ids by owning shard
(`partition.partition_feature`) and sends each server the distinct ids of each of its tables
(`partition.distinct_rows`); the server's forward op returns their rows, which the worker combines into the
activations (`partition.combine_rows`); in `apply_gradients` the worker sums one gradient row per distinct id
(`partition.summed_row_gradients`) and the server's fused backward+optimizer op applies them.  The worker's sums
run in the kernels' order, so the numbers are those of servers combining and accumulating themselves, and a step
updates the tables exactly as the single-process class does (up to float summation order across shards in the
forward pass; see docs/distributed.md).

Checkpoints: each table and slot is a `ShardedVariable` tracked under the same name as in the single-process
class (``<table>``, ``<table>/<slot>``), and `ShardedVariable` saves its shards as slices of the full
``[vocabulary_size, dim]`` tensor under one key, as TensorFlow does for TPU tables.  So a checkpoint moves both
ways between this class (with any number of servers) and `tf_embed_ops.TPUEmbedding` / TensorFlow's classes.

Without a strategy, `num_shards` shards are created on the current device: the same code path on one machine
(used by the tests to check the sharded math without a cluster).

Example:
    >>> strategy = tf_embed_ops.distribute.create_local_cluster(num_workers=2, num_ps=2)
    >>> coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    >>> with strategy.scope():
    ...   emb = ShardedTPUEmbedding(feature_config, tf.tpu.experimental.embedding.Adagrad(0.1))
    ...   emb.build(per_replica_batch_size=128)
    >>> @tf.function
    ... def step(ids):
    ...   emb.enqueue({"watched": ids})
    ...   with tf.GradientTape() as tape:
    ...     acts = emb.dequeue(); tape.watch(acts); loss = tf.reduce_sum(acts["watched"] ** 2)
    ...   emb.apply_gradients(tape.gradient(loss, acts))
    >>> coordinator.schedule(step, args=(ids,)); coordinator.join()
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf

from tf_embed_ops import _tf_compat, embedding_ops, low_precision, table_config
from tf_embed_ops import config as config_lib
from tf_embed_ops import tpu_embedding as mid_level
from tf_embed_ops.distribute import partition, server_plan, sharded_groups, sharding

__all__ = ["ShardedTPUEmbedding"]


class _DeviceAnchor(NamedTuple):
    """Stands in for a variable in `colocate_with`: ParameterServerStrategy then places the new variable on
    `device` instead of its round-robin choice (it reads only `.device`, and `.name` for its log line)."""

    device: str
    name: str


def place_variables_on(device: str | None):
    """A variable-creator scope that asks the active strategy to put new variables on `device`.

    ParameterServerStrategy ignores `tf.device` (it places variables round-robin) but honours `colocate_with`;
    without a strategy the default creator ignores `colocate_with`, and the enclosing `tf.device` applies.
    """

    def creator(next_creator, **kwargs):
        if device is not None and tf.distribute.has_strategy():
            kwargs["colocate_with"] = _DeviceAnchor(device, f"tf_embed_ops_shard_on_{device}")
        return next_creator(**kwargs)

    return tf.variable_creator_scope(creator)


def _parameter_server_count() -> int:
    """Parameter-server tasks of the cluster this process is connected to.

    ParameterServerStrategy does not expose its cluster resolver (`strategy.cluster_resolver` is None), but
    connecting to the cluster registers every remote device, so count the distinct ps tasks among them.
    """
    tasks = set()
    for device in tf.config.list_logical_devices():
        spec = tf.DeviceSpec.from_string(device.name)
        if spec.job == "ps":
            tasks.add(spec.task)
    return len(tasks)


def _same_inputs(a: list, b: list) -> bool:
    """Whether two lists of feature inputs hold the same tensors: the front end's walk hands dequeue and
    apply_gradients each its own list of one step's inputs, so the lists themselves differ."""
    if a is b:
        return True
    if len(a) != len(b):
        return False
    flat_a, flat_b = tf.nest.flatten(a), tf.nest.flatten(b)
    return len(flat_a) == len(flat_b) and all(x is y for x, y in zip(flat_a, flat_b, strict=True))


class _StepCache:
    """The servers' calls (`(plans, calls)`), the last step's partition (`(inputs, parts, step)`) and distinct rows
    (`parts`, `distinct`): dequeue and apply_gradients of one step share them. A plain holder: a trackable object's
    list or dict attribute is a wrapper copy, so `is` would not find the lists again."""

    def __init__(self):
        self.calls = None
        self.partition = None
        self.parts = None
        self.distinct = None


class _SyncState:
    """The attached SyncSparseAggregator (if any) and an explicit local step for the next apply_gradients."""

    def __init__(self):
        self.aggregator = None
        self.forced_local_step = None


def rounding_for_plan(plan: Any, rounding: dict) -> dict:
    """`TPUEmbedding.rounding_arguments()` restricted to a server's tables (its local table order). A server keys
    its tables' rounding by their local positions (the op's default: a sharded run draws other bits than an
    unsharded one anyway, its rows being shard-local; docs/low_precision.md), so the embedding-wide
    `rounding_table_ids` are dropped."""
    if not rounding:
        return {}
    local = {k: v for k, v in rounding.items() if k != "rounding_table_ids"}
    return {**local, "rounding": [rounding["rounding"][t] for t in plan.tables]}


class ShardedTPUEmbedding(mid_level.TPUEmbedding):
    """`tf_embed_ops.TPUEmbedding` with every table row-sharded over parameter servers.

    Same constructor arguments, methods and checkpoint keys as `tf_embed_ops.TPUEmbedding`; `embedding_tables`
    and the slot variables are `ShardedVariable`s (iterate them for the per-server shards).  Create (or
    `build`) it under the strategy's scope; call `enqueue`/`dequeue`/`apply_gradients` inside functions
    scheduled with `ClusterCoordinator.schedule` (or on the coordinator itself).

    Example:
        >>> with strategy.scope():
        ...   emb = ShardedTPUEmbedding(feature_config, tf.tpu.experimental.embedding.SGD(0.1))
        >>> [v.device for v in emb.embedding_tables[table]]   # one shard per parameter server
    """

    # Its kinds of tables (`backends.protocol.TableGroup`): the front end's walk runs them unchanged. Dynamic tables
    # are sharded by key over the same servers (docs/dynamic_tables.md); tiered ones are refused by name.
    _BACKENDS: tuple = (sharded_groups.UnshardableTiered, sharded_groups.ShardedDynamicGroup)
    _IN_MEMORY_GROUP: type = sharded_groups.ShardedStaticGroup

    def __init__(
        self,
        feature_config: Any,
        optimizer: Any = None,
        pipeline_execution_with_tensor_core: bool = False,
        *,
        strategy: Any = None,
        num_shards: int | None = None,
    ):
        """Creates the object; variables are created by `build` (or the first `enqueue`).

        Args:
          feature_config: as `tf_embed_ops.TPUEmbedding`.
          optimizer: as `tf_embed_ops.TPUEmbedding` (a `slot_variable_creation_fn` is not supported).
          pipeline_execution_with_tensor_core: as `tf_embed_ops.TPUEmbedding`.
          strategy: a `ParameterServerStrategy`; defaults to the strategy whose scope is active, if any.
          num_shards: shards per table (at most the vocabulary size). Defaults to the number of parameter
            servers; without a strategy, to 1, all shards on the current device.

        Raises:
          ValueError: as `tf_embed_ops.TPUEmbedding`; for a strategy that is not a ParameterServerStrategy, a
            `num_shards` out of range, or a table optimizer with a `slot_variable_creation_fn`.
        """
        super().__init__(feature_config, optimizer, pipeline_execution_with_tensor_core)
        if strategy is None and tf.distribute.has_strategy():
            strategy = tf.distribute.get_strategy()
        if strategy is not None and not isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
            raise ValueError(
                f"Argument `strategy` must be a tf.distribute.experimental.ParameterServerStrategy (or None); got "
                f"{type(strategy).__name__}."
            )
        num_servers = _parameter_server_count() if strategy is not None else None
        if num_shards is None:
            num_shards = num_servers if num_servers is not None else 1
        if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
            raise ValueError(f"Argument `num_shards` must be an int >= 1; got {num_shards!r}.")
        if num_servers is not None and num_shards > num_servers:
            raise ValueError(
                f"Argument `num_shards` ({num_shards}) must not exceed the number of parameter servers ({num_servers})."
            )
        for table in self._table_config:
            if table.optimizer is not None and table.optimizer.slot_variable_creation_fn is not None:
                raise ValueError(
                    f"Table {table.name!r}: slot_variable_creation_fn is not supported by ShardedTPUEmbedding "
                    "(slots are sharded like their table); leave it unset."
                )
        self._strategy = strategy
        self._devices = [
            f"/job:ps/replica:0/task:{p}/device:CPU:0" if strategy is not None else None for p in range(num_shards)
        ]
        self._boundaries = [
            sharding.div_shard_boundaries(t.vocabulary_size, sharding.num_table_shards(t.vocabulary_size, num_shards))
            for t in self._table_config
        ]
        self._table_index = {t.name: i for i, t in enumerate(self._table_config)}
        self._plans = None
        self._cache = _StepCache()
        # Set by SyncSparseAggregator: apply_gradients then feeds its accumulators instead of the tables. A plain
        # holder, so the aggregator is not tracked as a checkpoint child of the embedding.
        self._sync = _SyncState()

    # ------------------------------------------------------------------ variables

    @property
    def strategy(self) -> Any:
        """The `ParameterServerStrategy` the shards live under (None on one machine)."""
        return self._strategy

    # ------------------------------------------------------------------ the interface of SyncSparseAggregator
    # and the sharded Keras layer (per-server placement, plans and variables)

    @property
    def devices(self) -> list:
        """The device of each shard index (`/job:ps/.../task:p/...`; None entries on one machine)."""
        return list(self._devices)

    @property
    def row_boundaries(self) -> list:
        """Per table (in `table_configs` order): `[b_0 = 0, ..., vocabulary_size]`, shard p holding [b_p, b_p+1)."""
        return [list(b) for b in self._boundaries]

    @property
    def table_index(self) -> dict:
        """`{table name: position in table_configs}`."""
        return dict(self._table_index)

    @property
    def aggregator(self) -> Any:
        """The attached `SyncSparseAggregator`, or None (then `apply_gradients` updates the tables directly)."""
        return self._sync.aggregator

    def attach_aggregator(self, aggregator: Any) -> None:
        """From now on `apply_gradients` feeds `aggregator.push_gradients` instead of updating the tables.

        Raises:
          ValueError: if an aggregator is attached already.
        """
        if self._sync.aggregator is not None:
            raise ValueError("Argument `embedding` already has a SyncSparseAggregator attached.")
        self._sync.aggregator = aggregator

    @contextlib.contextmanager
    def gradients_tagged_with(self, local_step: Any):
        """Within the block, `apply_gradients` tags its gradients with `local_step` (None: the step its `dequeue`
        read), for the attached aggregator's staleness rule."""
        self._sync.forced_local_step = local_step
        try:
            yield
        finally:
            self._sync.forced_local_step = None

    @property
    def shard_boundaries(self) -> dict:
        """`{TableConfig: [b_0 = 0, b_1, ..., vocabulary_size]}`: shard p holds rows [b_p, b_{p+1})."""
        return {t: list(b) for t, b in zip(self._table_config, self._boundaries, strict=True)}

    def _sharded_variable(
        self, name: str, table_index: int, dim: int, initializer: Callable, dtype: tf.DType = tf.float32
    ) -> Any:
        # `dtype`: the storage dtype (te.TableConfig); 16-bit shards start from the fp32 values rounded to nearest.
        initializer = low_precision.storage_initializer(initializer, dtype)
        bounds = self._boundaries[table_index]
        shards = []
        for p in range(len(bounds) - 1):
            shape = (bounds[p + 1] - bounds[p], dim)
            with tf.device(self._devices[p]), place_variables_on(self._devices[p]):
                shards.append(
                    tf.Variable(
                        initial_value=functools.partial(initializer, shape, dtype=dtype),
                        shape=shape,
                        dtype=dtype,
                        trainable=False,
                        name=f"{name.replace('/', '.')}_{p}",
                    )
                )
        return _tf_compat.ShardedVariable(shards, name=name)

    def _create_variables_and_slots(self) -> dict:
        """{table name: {"parameters": ShardedVariable, <slot>: ShardedVariable}}, tracked as the base class does.

        Each shard's initial value comes from the initializer called with the shard's shape (as TensorFlow's
        partitioned variables do), so random initial tables differ from an unsharded run; constant ones and
        checkpoint-restored ones do not.
        """
        scope = self._strategy.scope() if self._strategy is not None else contextlib.nullcontext()
        variables = {}
        with scope:
            for t, table in enumerate(self._table_config):
                parameters = self._sharded_variable(
                    table.name, t, table.dim, table.initializer, table_config.storage_dtype(table)
                )
                # Tracking restores a pending checkpoint value (slice by slice) into the new shards.
                _tf_compat.track_child(self, parameters, name=table.name)
                slots = {}
                if table.optimizer is not None:
                    names = _tf_compat.slot_names(table.optimizer)
                    initializers = _tf_compat.slot_initializers(table.optimizer)
                    # Each slot's width from the optimizer schema: dim, or 1 for a per-row slot.
                    shapes = config_lib.slot_shapes(table.optimizer, table.vocabulary_size, table.dim)
                    for slot, initializer in zip(names, initializers, strict=True):
                        name = f"{table.name}/{slot}"
                        width = shapes.get(slot, (table.vocabulary_size, table.dim))[1]
                        slots[slot] = self._sharded_variable(
                            name, t, width, initializer, table_config.slot_storage_dtype(table)
                        )
                        _tf_compat.track_child(self, slots[slot], name=name)
                slots["parameters"] = parameters
                variables[table.name] = slots
            if table_config.needs_rounding_step(self._table_config):
                # Keys stochastic rounding (docs/low_precision.md), as in the base class.
                self._rounding_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="rounding_step")
                _tf_compat.track_child(self, self._rounding_step, name="rounding_step")
        return variables

    # ------------------------------------------------------------------ per-server execution

    @property
    def server_plans(self) -> list:
        """One `server_plan.ServerPlan` per shard index: the tables, features and config each server runs."""
        proto = self.config_proto
        # The base class recomputes the proto until every output shape is known; re-plan when it changes.
        if self._plans is None or self._plans[0] is not proto:
            self._plans = (proto, server_plan.plan_servers(proto, self._boundaries))
        return self._plans[1]

    def _partition(self, inputs: list) -> list:
        """Per feature: its per-shard inputs (a list of one original input for unsharded tables)."""
        cached = self._cache.partition
        if cached is not None and _same_inputs(cached[0], inputs):
            return cached[1]
        self._cache.partition = None
        parts = []
        with tf.name_scope("shard_ids"):
            for inp, feature in zip(inputs, self.static_features, strict=True):
                bounds = self._boundaries[self._table_index[feature.table.name]]
                if len(bounds) == 2:
                    parts.append([inp])  # one shard: the feature goes through untouched, with its combiner
                else:
                    parts.append(partition.partition_feature(inp, feature.table.combiner, bounds))
        # dequeue and apply_gradients of one step see the same inputs; partition once for both.
        self._cache.partition = (inputs, parts, None)
        return parts

    def _local_step(self, inputs: list) -> Any:
        """The synchronous step this batch was looked up at (read by its dequeue; else now)."""
        if self._sync.forced_local_step is not None:
            return tf.cast(self._sync.forced_local_step, tf.int64)
        cached = self._cache.partition
        if cached is not None and _same_inputs(cached[0], inputs) and cached[2] is not None:
            return cached[2]
        return self._sync.aggregator.global_step.read_value()

    def shard_combiners(self, plan: server_plan.ServerPlan) -> list:
        # Sharded tables had their weights pre-divided by the sample norms on the worker: they run "sum".
        return [self._table_config[t].combiner if len(self._boundaries[t]) == 2 else "sum" for t in plan.tables]

    def shard_variables(self, plan: server_plan.ServerPlan) -> tuple[list, list]:
        tables, slots = [], []
        for t in plan.tables:
            table = self._table_config[t]
            owned = self._variables[table.name]
            tables.append(owned["parameters"].variables[plan.task])
            names = _tf_compat.slot_names(table.optimizer) if table.optimizer is not None else []
            slots.append([owned[n].variables[plan.task] for n in names])
        return tables, slots

    def _compact_tables(self) -> set:
        """Global indices of the tables whose rows travel compactly (`partition.distinct_rows`): every sharded
        table, and an unsharded one with the sum combiner.  An unsharded mean/sqrtn table keeps its features
        whole, so its combiner (and its numbers) stay the single-process op's."""
        return {
            t for t, table in enumerate(self._table_config) if len(self._boundaries[t]) > 2 or table.combiner == "sum"
        }

    def _server_calls(self) -> list:
        """Per server plan, its `server_plan.CompactCall` (the config and inputs of its forward and update ops)."""
        plans = self.server_plans
        cached = self._cache.calls
        if cached is None or cached[0] is not plans:
            compact = self._compact_tables()
            feature_tables = [self._table_index[f.table.name] for f in self.static_features]
            self._cache.calls = (plans, [server_plan.compact_call(p, compact, feature_tables) for p in plans])
        return self._cache.calls[1]

    def _distinct(self, parts: list) -> dict:
        """``{(task, local table): (unique local ids, {feature: positions})}`` of the compact tables (worker side)."""
        cache = self._cache
        if cache.parts is parts:
            return cache.distinct
        feature_tables = [self._table_index[f.table.name] for f in self.static_features]
        distinct = {}
        with tf.name_scope("distinct_rows"):
            for plan, call in zip(self.server_plans, self._server_calls(), strict=True):
                for kind, j in call.entries:
                    if kind != "rows":
                        continue
                    features = [f for f in plan.features if feature_tables[f] == plan.tables[j]]
                    unique, positions = partition.distinct_rows([parts[f][plan.task] for f in features])
                    distinct[(plan.task, j)] = (unique, dict(zip(features, positions, strict=True)))
        cache.parts, cache.distinct = parts, distinct
        return distinct

    def _call_inputs(self, call: server_plan.CompactCall, task: int, parts: list, distinct: dict) -> list:
        inputs = []
        for kind, x in call.entries:
            if kind == "rows":
                # The distinct ids, each its own sample (dense layout, no weights): the op returns their rows.
                unique = distinct[(task, x)][0]
                inputs.append(
                    embedding_ops.FeatureInput(
                        tf.zeros([0], tf.int64), unique, tf.zeros([0], tf.float32), tf.shape(unique, out_type=tf.int64)
                    )
                )
            else:
                inputs.append(parts[x][task])
        return inputs

    def _call_combiners(self, call: server_plan.CompactCall) -> list:
        features = self.static_features
        return ["sum" if kind == "rows" else features[x].table.combiner for kind, x in call.entries]

    def lookup(self, inputs: list, name: str | None = None) -> list:
        parts = self._partition(inputs)
        if self._sync.aggregator is not None:
            # Under synchronous training a gradient is tagged with the step its rows were read at (stale rule):
            # read it before the lookups.
            step = self._sync.aggregator.global_step.read_value()
            self._cache.partition = (inputs, parts, step)
            with tf.control_dependencies([step]):
                parts = [[tf.nest.map_structure(tf.identity, p) for p in per] for per in parts]
        distinct = self._distinct(parts)
        partials = [[] for _ in inputs]
        for plan, call in zip(self.server_plans, self._server_calls(), strict=True):
            tables, _ = self.shard_variables(plan)
            with tf.device(self._devices[plan.task]):
                outputs = embedding_ops.embedding_activations(
                    self._call_inputs(call, plan.task, parts, distinct),
                    tables,
                    call.config,
                    combiners=self._call_combiners(call),
                    name=name,
                )
            for (kind, x), out in zip(call.entries, outputs, strict=True):
                if kind == "feature":
                    partials[x].append(out)
                    continue
                # The worker combines the server's distinct rows into this shard's partial activations.
                for f, positions in distinct[(plan.task, x)][1].items():
                    partials[f].append(partition.combine_rows(parts[f][plan.task], positions, out))
        # Sharded features sum their shards' partial activations (shard order).
        return [p[0] if len(p) == 1 else tf.add_n(p) for p in partials]

    def send_gradients(self, gradients: list, learning_rates: list, inputs: list) -> list:
        """Runs the update on every server (or feeds the aggregator); returns the ops (empty eagerly)."""
        parts = self._partition(inputs)
        if self._sync.aggregator is not None:
            return self._sync.aggregator.push_gradients(gradients, inputs, parts, self._local_step(inputs))
        distinct = self._distinct(parts)
        ops = []
        rounding = self.rounding_arguments()  # one step for every server
        for plan, call in zip(self.server_plans, self._server_calls(), strict=True):
            tables, slots = self.shard_variables(plan)
            server_gradients = []
            for kind, x in call.entries:
                if kind == "feature":
                    server_gradients.append(gradients[x])
                    continue
                # One summed gradient row per distinct id, computed on the worker: what the server's fused op
                # would have accumulated from the full activation gradients.
                unique, positions = distinct[(plan.task, x)]
                server_gradients.append(
                    partition.summed_row_gradients(
                        [parts[f][plan.task] for f in positions],
                        list(positions.values()),
                        [gradients[f] for f in positions],
                        tf.size(unique, out_type=tf.int64),
                    )
                )
            with tf.device(self._devices[plan.task]):
                op = embedding_ops.send_tpu_embedding_gradients(
                    server_gradients,
                    [learning_rates[tag] for tag in plan.tags],
                    self._call_inputs(call, plan.task, parts, distinct),
                    tables,
                    slots,
                    call.config,
                    combiners=self._call_combiners(call),
                    **rounding_for_plan(plan, rounding),
                )
            if op is not None:
                ops.append(op)
        self.advance_rounding_step(ops)
        return ops
