"""The dynamic-table group of a `TPUEmbedding`: normalisation, lookup and fused update of its dynamic features.

`te.TPUEmbedding` splits its features by table kind. Features over `TableConfig`s run the static ops exactly as
before; features over `DynamicTableConfig`s are handed to a `DynamicGroup`, which owns their tables (one
`DynamicTable` per table, or one per shard when sharded over parameter servers) and the tables' step counters, and
runs `TfEmbed>DynamicEmbeddingActivations` / `TfEmbed>DynamicSendTPUEmbeddingGradients` over them. The group is
a table backend (`tf_embed_ops.backends.protocol.TableGroup`): the front ends run it with the other kinds' groups
through `tf_embed_ops.backends.walk`.

Step semantics: a training lookup stamps the keys it sees (and inserts admitted new ones) at the current step; the
update of that batch runs at the same step, then applies the tables' eviction policies and advances the step by
one. Lookups with `training=False` never insert and never advance the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat, _xla, embedding_ops, table_config, update_trigger
from tf_embed_ops import config as te_config
from tf_embed_ops.backends import protocol, served
from tf_embed_ops.dynamic import chain, keras_weights, policies, restore_check, touched_rows
from tf_embed_ops.dynamic import config as config_lib
from tf_embed_ops.dynamic import ops as dynamic_ops
from tf_embed_ops.serving import prune as prune_lib

__all__ = ["DynamicGroup", "FrozenDynamicGroup", "normalize_dynamic_feature"]


def normalize_dynamic_feature(
    x: Any, table: config_lib.DynamicTableConfig, weights: Any = None, max_sequence_length: int = 0, feature_name=None
) -> embedding_ops.FeatureInput:
    """`embedding_ops.normalize_feature` for a dynamic table: the same input forms, with int64 or string keys.

    The key dtype must be the table's (integers of any width for an int64 table, strings for a string table):
    a mismatch is a ValueError naming the table (the caller adds the feature), raised before any op runs.

    String ids are normalised through their positions (an int64 tensor of the same structure), then gathered, so
    every layout rule (sequence truncation, sparse sample positions) is the one `normalize_feature` applies.
    """
    values = x.values if isinstance(x, (tf.SparseTensor, tf.RaggedTensor)) else tf.convert_to_tensor(x)
    # The front ends prefix "Feature <path>: " to every normalisation error.
    if table.key_dtype == tf.string:
        if values.dtype != tf.string:
            raise ValueError(
                f"table {table.name!r} has key_dtype string; got {values.dtype.name} ids (pass the raw strings; "
                "they are fingerprinted inside the op)."
            )
        if isinstance(x, tf.SparseTensor):
            positions = tf.SparseTensor(x.indices, tf.range(tf.size(x.values, out_type=tf.int64)), x.dense_shape)
            flat = x.values
        elif isinstance(x, tf.RaggedTensor):
            if x.ragged_rank != 1:
                raise ValueError(f"x: a RaggedTensor feature must have ragged_rank 1, got {x.ragged_rank}")
            positions = x.with_values(tf.range(tf.size(x.values, out_type=tf.int64)))
            flat = x.values
        else:
            flat = tf.reshape(values, [-1])
            positions = tf.reshape(tf.range(tf.size(values, out_type=tf.int64)), tf.shape(values))
            positions = tf.ensure_shape(positions, values.shape)
        normalized = embedding_ops.normalize_feature(positions, weights, max_sequence_length, feature_name)
        return normalized._replace(ids=tf.gather(flat, normalized.ids))
    if values.dtype == tf.string or not values.dtype.is_integer:
        raise ValueError(
            f"table {table.name!r} has key_dtype int64; got {values.dtype.name} ids (a string-keyed table needs "
            "key_dtype=tf.string)."
        )
    return embedding_ops.normalize_feature(x, weights, max_sequence_length, feature_name)


class DynamicGroup:
    """The features of a `TPUEmbedding` whose tables are dynamic (in memory or tiered), and everything that runs
    them: a table backend (`tf_embed_ops.backends.protocol.TableGroup`).

    Args:
      flat_features: all the `FeatureConfig`s of the embedding, flattened (their tables already named and given
        their optimizers by the `TPUEmbedding`); `positions` number them.
      check_numerics: reject a step whose gradients hold NaN or +-inf.
      shard_devices: None for unsharded tables; else one device per shard: each table has one `DynamicTable`
        per shard, created on that device, holding the keys `shard_of_keys` assigns to it, and the lookup and
        update of those keys run there.
      partition_by_key: with `shard_devices`, splits one feature's keys over the shards:
        `partition_by_key(feature_input, combiner, num_shards) -> [FeatureInput per shard]` (the sharded
        front end's kind, `distribute.sharded_groups.ShardedDynamicGroup`, sets both when it builds the tables).
    """

    kind = "dynamic"
    prefetches = False  # keys and rows are resident (a tiered dynamic table reads its misses in its lookup)
    keras_weights_prefix = keras_weights.PREFIX

    def __init__(
        self,
        flat_features: Sequence[Any],
        check_numerics: bool = False,
        shard_devices=None,
        partition_by_key: Callable[[Any, str, int], list] | None = None,
    ):
        self.positions = [i for i, f in enumerate(flat_features) if config_lib.is_dynamic(f.table)]
        self.features = [flat_features[i] for i in self.positions]
        resolved = te_config.resolve_tables(self.features)
        self.table_configs = list(resolved.tables)
        self.learning_rates = list(resolved.learning_rates)
        self._check_numerics = bool(check_numerics)
        self._shard_devices = list(shard_devices) if shard_devices else None
        if self._shard_devices is not None and partition_by_key is None:
            raise ValueError("DynamicGroup: sharded tables (shard_devices) need a `partition_by_key` function.")
        self._partition_by_key = partition_by_key
        self._tables: list[list[Any]] | None = None  # [table][shard]
        self._objects: list[Any] = []
        self._serialized = None

    @classmethod
    def of(
        cls,
        flat_features: Sequence[Any],
        check_numerics: bool = False,
        shard_devices=None,
        partition_by_key: Callable[[Any, str, int], list] | None = None,
    ) -> DynamicGroup | None:
        """The group of `flat_features`' dynamic features, or None when there is none (the static path then runs
        exactly as without dynamic tables)."""
        if not any(config_lib.is_dynamic(f.table) for f in flat_features):
            return None
        return cls(flat_features, check_numerics, shard_devices, partition_by_key)

    @property
    def check_numerics(self) -> bool:
        return self._check_numerics

    @property
    def num_shards(self) -> int:
        return len(self._shard_devices) if self._shard_devices else 1

    # ------------------------------------------------------------------ state

    def build(self, owner: Any) -> None:
        """Creates the tables (a `DynamicTable`, or a `ShardedDynamicTable` when sharded), tracked as checkpoint
        children of `owner` under their names. Idempotent."""
        if self._tables is not None:
            return
        from tf_embed_ops.dynamic import sharded_table  # pylint: disable=import-outside-toplevel
        from tf_embed_ops.dynamic import table as table_lib  # pylint: disable=import-outside-toplevel

        objects, shards = [], []
        for config in self.table_configs:
            if self._shard_devices is None:
                table = table_lib.DynamicTable(config)
                shards.append([table])
            else:
                table = sharded_table.ShardedDynamicTable(config, self.num_shards, self._shard_devices)
                shards.append(list(table.shards))
            _tf_compat.track_child(owner, table, config.name)
            objects.append(table)
        # Create the resources now (the caller holds init_scope), each on its shard's device: a resource handle is
        # made on first use, and a first use inside a tf.function would tie it to that function's graph.
        for per_table in shards:
            for index, table in enumerate(per_table):
                with tf.device(self._shard_devices[index] if self._shard_devices else None):
                    _ = table.handle
        self._objects = objects
        self._tables = shards

    @property
    def step(self) -> tf.Variable:
        """The global step of the dynamic tables: the first table's step counter. Every table (and shard) has its
        own, saved in its checkpoint; all advance together, after each update."""
        return self._tables[0][0].step

    def _advance_steps(self, updates: list) -> tf.Tensor:
        """Advances every table's step after `updates`; returns the new step (a value that depends on them)."""
        with tf.control_dependencies([u for u in updates if u is not None]):
            new_steps = [table.step.assign_add(1) for shards in self._tables for table in shards]
        return new_steps[0]

    @property
    def tables(self) -> dict:
        """`{DynamicTableConfig: DynamicTable}` (`ShardedDynamicTable` when sharded)."""
        return dict(zip(self.table_configs, self._objects, strict=True))

    @property
    def serialized_config(self) -> bytes:
        """The `TPUEmbeddingConfiguration` of the dynamic ops, serialized (no `input_shape`: the ops take shapes
        from their inputs)."""
        if self._serialized is None:
            # A table with no optimizer (lookup only) is described as SGD with learning rate 0, as the static
            # configuration does; `send_gradients` refuses to train it.
            untrained = any(t.optimizer is None for t in self.table_configs)
            sgd = tf.tpu.experimental.embedding.SGD(learning_rate=0.0) if untrained else None
            self._serialized = config_lib.dynamic_config_proto(self.features, optimizer=sgd).SerializeToString()
        return self._serialized

    @property
    def combiners(self) -> list[str]:
        return [t.combiner for t in self.table_configs]

    def check_trainable(self) -> None:
        table_config.check_trainable(self.table_configs, "DynamicTableConfig")

    # ------------------------------------------------------------------ ops

    def _handles(self, shard: int) -> list:
        return [shards[shard].handle for shards in self._tables]

    def lookup(self, inputs: list, training: bool) -> list:
        """Activations of the group's features (`inputs` in group order); `training` inserts admitted new keys."""
        if self._shard_devices is None:
            return list(
                dynamic_ops.dynamic_embedding_activations(
                    inputs,
                    self._handles(0),
                    self.step.read_value(),
                    self.serialized_config,
                    combiners=self.combiners,
                    training=bool(training),
                )
            )
        return self._sharded_lookup(inputs, training)

    def xla_refusal(self) -> str | None:
        return (
            f"dynamic tables {sorted(t.name for t in self.table_configs)} cannot be looked up under XLA "
            "(jit_compile=True): their rows live in a hash table XLA cannot read"
        )

    def prefetch(self, inputs: list) -> list:
        del inputs  # see `prefetches`
        return []

    def normalize_input(self, feature: Any, x: Any, weights: Any, max_sequence_length: int, name: str) -> Any:
        """`normalize_dynamic_feature` of `feature`'s input: int64 or string keys, as its table's `key_dtype`."""
        return normalize_dynamic_feature(x, feature.table, weights, max_sequence_length, name)

    def serving_group(self, context: Any) -> FrozenDynamicGroup:
        return FrozenDynamicGroup(self, context)

    def tracking_view(self, config: Any, table: Any) -> touched_rows.DynamicRowsView:
        return touched_rows.DynamicRowsView(config.name, table)

    def check_prune(self, name: str, prune: Any) -> None:
        prune_lib.check_applicable(prune, name, dynamic=True)

    def export_form(self, config: Any, table: Any, mode: Any, prune: Any) -> protocol.ExportForm:
        """Frozen as the trace reads it (`ExportContext.frozen`: quantized and pruned as asked); its metadata is the
        frozen copy's."""
        del config, table
        return protocol.ExportForm(freeze=(mode, prune))

    def save_keras_weights(self, store: Any) -> None:
        """Writes the tables' contents into a Keras weights `store` (a tiered one's rows chunk by chunk;
        `dynamic.keras_weights`)."""
        keras_weights.save(store, self.tables)

    def check_keras_weights(self, store: Any) -> list:
        """Checks every table's entries in a Keras weights `store`, writing nothing; returns the writes to run (a
        table without entries, saved before it existed, stays empty)."""
        return keras_weights.check(store, self.tables)

    def chain_state(self, config: Any, view: Any) -> chain.DynamicChain:
        return chain.DynamicChain(config.name, view)

    def restore_checks(self) -> dict:
        return restore_check.DynamicCheck.of(self.table_configs, self.num_shards, self._objects)

    def evaluate_learning_rates(self) -> list:
        """The group's learning rates, one float32 scalar per dynamic tag (its callables, called once)."""
        return [tf.cast(fn(), tf.float32) for fn in self.learning_rates]

    def send_gradients(self, gradients: list, inputs: list, learning_rates: list | None = None) -> tf.Tensor:
        """The fused update of the group's tables at the current step, then the step advances; returns the new
        step.  `learning_rates` defaults to `evaluate_learning_rates()`."""
        self.check_trainable()
        if learning_rates is None:
            learning_rates = self.evaluate_learning_rates()
        step = self.step.read_value()
        # Sharded, each shard is its own op: with check_numerics, every shard's update is checked before any writes.
        sharded_checks = self._check_numerics and self._shard_devices is not None
        checks = self._validate_ops(gradients, inputs, learning_rates) if sharded_checks else []
        with tf.control_dependencies(checks):
            updates = self._send_ops(gradients, learning_rates, inputs, step)
        return self._advance_steps(updates + self._score_rounds(updates, step))

    def _score_rounds(self, updates: list, step: tf.Tensor) -> list:
        """The eviction rounds of tables whose policy is a user score (`te.dynamic.Score`), after the update and
        on each shard's device: the ops evict by the built-in policies themselves, a score needs its function."""
        rounds = []
        for config, shards in zip(self.table_configs, self._tables, strict=True):
            if not isinstance(config.eviction, policies.Score):
                continue
            for index, table in enumerate(shards):
                with tf.device(self._shard_devices[index] if self._shard_devices else None):
                    with tf.control_dependencies([u for u in updates if u is not None]):
                        rounds.append(table.evict(step=step))
        return rounds

    def validate_send(self, gradients: list, inputs: list, learning_rates: list) -> list:
        """What to check before another group writes: what the update alone rejects, writing nothing.

        Its learning rates (finite and >= 0); with check_numerics also the send op's own checks (`validate_only`:
        gradients and the updates they would make, with the kernel's errors naming feature, table and position).
        Without check_numerics the update rejects nothing else the other groups' ops do not check first."""
        checks = [
            tf.debugging.Assert(
                tf.logical_and(tf.math.is_finite(lr), lr >= 0.0),
                [
                    f"dynamic tables' learning rate (dynamic tag {k}) must be finite and >= 0, got",
                    lr,
                    "; no table was updated",
                ],
            )
            for k, lr in enumerate(learning_rates)
        ]
        if self._check_numerics:
            checks += self._validate_ops(gradients, inputs, learning_rates)
        return checks

    def _validate_ops(self, gradients: list, inputs: list, learning_rates: list) -> list:
        """The send op's checks without its writes (`validate_only`), one op per shard: everything the update
        would reject (learning rates, gradients and, with check_numerics, a value the update would make NaN or
        +-inf), with the kernel's errors (feature, table, position)."""
        checks = self._send_ops(gradients, learning_rates, inputs, self.step.read_value(), validate_only=True)
        return [c for c in checks if c is not None]

    def _send_ops(
        self, gradients: list, learning_rates: list, inputs: list, step: tf.Tensor, validate_only: bool = False
    ) -> list:
        if self._shard_devices is not None:
            return self._sharded_send(gradients, learning_rates, inputs, step, validate_only)
        update = dynamic_ops.dynamic_send_tpu_embedding_gradients(
            list(gradients),
            learning_rates,
            inputs,
            self._handles(0),
            step,
            self.serialized_config,
            combiners=self.combiners,
            check_numerics=self._check_numerics,
            validate_only=validate_only,
        )
        return [update]

    def probe(self, sent: tf.Tensor) -> tf.Tensor:
        """A scalar read after the update: `send_gradients`' new step itself."""
        return sent

    def lookup_and_update(self, inputs: list, trigger: tf.Tensor) -> list:
        """Training lookup whose backward pass runs the fused update (for Keras' train step; see
        `embedding_ops.embedding_lookup_and_update`, the static counterpart): the gradient of `trigger` is a zero
        computed from the step the update advanced, so the update is on its data path."""
        return update_trigger.hang_update_on_trigger(
            trigger,
            lambda: self.lookup(inputs, training=True),
            lambda gradients: self.send_gradients(gradients, inputs),
        )

    # ------------------------------------------------------------------ sharded tables

    def _shard_inputs(self, inputs: list) -> list[list[embedding_ops.FeatureInput]]:
        """Per shard, the group's features restricted to the keys that shard holds (`partition_by_key`: weights
        pre-divided by the sample norms over all the sample's keys, so the shards combine with "sum", their
        activations add up to the unsharded one and each key gets the unsharded gradient)."""
        per_shard: list[list[embedding_ops.FeatureInput]] = [[] for _ in range(self.num_shards)]
        for feature, inp in zip(self.features, inputs, strict=True):
            for index, part in enumerate(self._partition_by_key(inp, feature.table.combiner, self.num_shards)):
                per_shard[index].append(part)
        return per_shard

    def _sharded_lookup(self, inputs: list, training: bool) -> list:
        step = self.step.read_value()
        total = None
        for index, (device, shard_inputs) in enumerate(
            zip(self._shard_devices, self._shard_inputs(inputs), strict=True)
        ):
            with tf.device(device):
                acts = dynamic_ops.dynamic_embedding_activations(
                    shard_inputs,
                    self._handles(index),
                    step,
                    self.serialized_config,
                    combiners=["sum"] * len(self.table_configs),
                    training=bool(training),
                )
            total = list(acts) if total is None else [a + b for a, b in zip(total, acts, strict=True)]
        return total

    def _sharded_send(
        self, gradients: list, learning_rates: list, inputs: list, step: tf.Tensor, validate_only: bool = False
    ) -> list:
        updates = []
        for index, (device, shard_inputs) in enumerate(
            zip(self._shard_devices, self._shard_inputs(inputs), strict=True)
        ):
            with tf.device(device):
                updates.append(
                    dynamic_ops.dynamic_send_tpu_embedding_gradients(
                        list(gradients),
                        learning_rates,
                        shard_inputs,
                        self._handles(index),
                        step,
                        self.serialized_config,
                        combiners=["sum"] * len(self.table_configs),
                        check_numerics=self._check_numerics,
                        validate_only=validate_only,
                    )
                )
        return updates


class FrozenDynamicGroup(served.ServedGroup):
    """A `DynamicGroup` while serving: each table's frozen copy (a hash table key -> row, then the lookup over the
    rows, whose extra default row of zeros is what the training side reads for a key without a row)."""

    def _lookup(self, feature: Any, inp: Any, table: Any) -> tf.Tensor:
        frozen = self._context.frozen(table)
        rows = inp._replace(ids=frozen.rows(inp.ids))
        return _xla.lookup(rows, served.is_dense_input(inp), frozen, frozen.dim, feature.table.combiner)
