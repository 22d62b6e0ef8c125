"""The TPUEmbedding mid-level API, trainable on CPU.

`TPUEmbedding` mirrors `tf.tpu.experimental.embedding.TPUEmbedding` (same constructor, `build`, `enqueue`,
`dequeue`, `apply_gradients`, `embedding_tables`), but runs anywhere TensorFlow runs: `dequeue` computes the
activations with our `EmbeddingActivations` op and `apply_gradients` runs our fused
`SendTPUEmbeddingGradients` op, which updates the tables and optimizer slots in place with the TPU semantics
(per-row gradient accumulation, the table's own optimizer, clipping, weight decay; touched rows only).

Variables are created and tracked exactly as TensorFlow's `TPUEmbedding`/`TPUEmbeddingForServing` create them on
CPU (`_add_variable_with_custom_getter`, one child per table and per slot), so `tf.train.Checkpoint(embedding=emb)`
writes the same keys and a checkpoint moves both ways between this class and TensorFlow's. A training step:
`TPUEmbedding`'s example, and docs/mid_level_api.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat, _xla, embedding_ops, table_config, update_trigger
from tf_embed_ops import config as config_lib
from tf_embed_ops import features as features_lib
from tf_embed_ops.backends import static as static_backend
from tf_embed_ops.backends import walk
from tf_embed_ops.dynamic import engine as dynamic_engine
from tf_embed_ops.engine import checkpoint as checkpoint_lib
from tf_embed_ops.engine import groups as groups_lib
from tf_embed_ops.engine import inputs as inputs_lib
from tf_embed_ops.engine import lookup as lookup_lib
from tf_embed_ops.engine import tables as tables_lib
from tf_embed_ops.engine import update as update_lib
from tf_embed_ops.engine import variables as variables_lib
from tf_embed_ops.tiered import engine as tiered_engine

__all__ = ["TPUEmbedding", "check_feature_keys"]

# Kept here for callers of the original location; the nest checks live in tf_embed_ops.features.
check_feature_keys = features_lib.check_feature_keys

_tpu_embedding = tf.tpu.experimental.embedding


class TPUEmbedding(_tf_compat.AutoTrackable):
    """The `tf.tpu.experimental.embedding.TPUEmbedding` mid-level API, trainable on CPU.

    Tables with `storage=te.Tiered(...)` (`te.TableConfig`, and `te.DynamicTableConfig`, whose keys stay in memory)
    keep their rows on disk behind a DRAM row cache and train with the same fused optimizers
    (docs/tiered_tables.md); `prefetch` makes the next batch's rows of static tiered tables resident.

    Ports TPU code by changing an import: the inputs are TensorFlow's own `TableConfig`, `FeatureConfig` and
    optimizer objects (`SGD`, `Adagrad`, `AdagradMomentum`, `Adam`, `FTRL`). Differences from the TPU class:
    no `TPUStrategy` is needed; `enqueue`, `dequeue` and `apply_gradients` must see the same graph (call them in
    one `tf.function`, or all eagerly); later batches may have another batch size than the first.

    Example:
        >>> emb = TPUEmbedding(feature_config, tf.tpu.experimental.embedding.SGD(0.1))
        >>> emb.enqueue(features)
        >>> with tf.GradientTape() as tape:
        ...   acts = emb.dequeue(); tape.watch(acts); loss = model(acts)
        >>> emb.apply_gradients(tape.gradient(loss, acts))
    """

    # The kinds of tables beside the in-memory ones, each a table backend class (`backends.protocol.TableGroup`)
    # with `of(flat_features, check_numerics)`: its group of the features, or None. The in-memory tables (the
    # features no kind claims) come first: their update validates before it writes and has no check-only form.
    _BACKENDS: tuple = (tiered_engine.TieredGroup, dynamic_engine.DynamicGroup)
    # The in-memory tables' group class (a subclass placing its variables elsewhere names its own: the
    # parameter-server sharded class's runs its training lookup per server).
    _IN_MEMORY_GROUP: type = static_backend.StaticGroup

    def __init__(
        self,
        feature_config: Any,
        optimizer: Any = None,
        pipeline_execution_with_tensor_core: bool = False,
        check_numerics: bool = False,
    ):
        """Creates the mid-level API object; variables are created by `build` (or the first `enqueue`).

        Args:
          feature_config: a nested structure (dict, list, tuple, or a single one) of
            `tf.tpu.experimental.embedding.FeatureConfig`.
          optimizer: the default optimizer for tables whose `TableConfig.optimizer` is None: one of
            `tf.tpu.experimental.embedding.{SGD, Adagrad, AdagradMomentum, Adam, FTRL}`, a
            `tf_embed_ops.optimizers` class (Momentum, RMSProp, ... Assign), a Keras optimizer
            (`keras.optimizers.SGD / Adagrad / Adam / Ftrl`, or "sgd" / "adagrad" / "adam" / "ftrl"; converted to its
            TPU optimizer as docs/keras.md says, for this and for every `TableConfig.optimizer`), or None (then tables
            without their own optimizer get no slots and cannot be trained, as in TensorFlow's serving class).
          pipeline_execution_with_tensor_core: written to the configuration as TensorFlow does. On CPU the
            lookup never overlaps the update, so activations are never stale (the result equals False).
          check_numerics: if True, `apply_gradients` rejects a step whose gradients hold NaN or +-inf with an
            `InvalidArgumentError` naming the feature and table, and changes nothing. By default such gradients
            are applied, as the TPU applies them (not part of TensorFlow's signature; an addition of this package).

        Raises:
          ValueError: if a feature is not a `FeatureConfig`, an optimizer is unsupported, two tables share a
            name, or a table uses a `CustomCombiner`; or a kind of `_BACKENDS` refuses a table (the sharded
            classes' tiered kind refuses tiered tables).
        """
        flat_features = features_lib.check_feature_configs(feature_config)
        self._feature_config = feature_config
        self._pipeline_execution_with_tensor_core = bool(pipeline_execution_with_tensor_core)
        self._check_numerics = bool(check_numerics)
        self._output_shapes = [tf.TensorShape(f.output_shape) for f in flat_features]

        # Table order, names and learning-rate tags as TensorFlow numbers them (one resolver for every front end).
        resolved = config_lib.resolve_tables(flat_features, optimizer)
        self._table_config = list(resolved.tables)
        # Every table, before the tiered and dynamic ones are split off: the numbering that keys stochastic
        # rounding (`tiered_engine.rounding_table_ids`).
        self._every_table = list(resolved.tables)
        tables_lib.name_and_check_tables(resolved)
        # One table group per kind of table the features use (`_BACKENDS`), after the in-memory tables' group; the
        # tables and learning-rate tags narrowed to the in-memory tables (each group has its own).
        split = groups_lib.make_groups(
            self, flat_features, self._table_config, self._BACKENDS, self._IN_MEMORY_GROUP, self._check_numerics
        )
        self._groups, self._table_config, self._dynamic_learning_rates = split

        self._built = False
        self._config_proto = None
        self._pending = inputs_lib.PendingSlot()

    @property
    def groups(self) -> list:
        """The table backends (`backends.protocol.TableGroup`), one per kind of table, the in-memory one first: what
        `lookup_all` and `send_all` walk, and what the lifecycle modules ask for tables."""
        return list(self._groups)

    @classmethod
    def table_kinds(cls) -> tuple:
        """The classes of the groups this class can make (`backends.protocol.TableGroup`), the in-memory group's
        first: what asks a kind rather than a group (the Keras layer's load filters every kind's
        `keras_weights_prefix`, kinds the embedding has no group of included)."""
        return (cls._IN_MEMORY_GROUP, *cls._BACKENDS)

    def _group(self, cls: type, built: bool = False) -> Any:
        """The group of class `cls` (a kind's class, or its sharded subclass), or None; `built`: built first (when
        there is one)."""
        group = groups_lib.of_class(self._groups, cls)
        if built and group is not None:
            self._maybe_build()
        return group

    @property
    def check_numerics(self) -> bool:
        """Whether updates reject gradients holding NaN or +-inf (the constructor's `check_numerics`)."""
        return self._check_numerics

    @property
    def static_features(self) -> list:
        """The flattened `FeatureConfig`s over static in-memory tables: the features `lookup` and `send_gradients`
        see."""
        group = self._group(self._IN_MEMORY_GROUP)
        return [] if group is None else list(group.features)

    @property
    def tiered_group(self) -> Any:
        """The `tiered.engine.TieredGroup` running the tiered tables' features, or None without any."""
        return self._group(tiered_engine.TieredGroup)

    @property
    def tiered_tables(self) -> dict:
        """`{TableConfig: tiered.TieredTable}` of the tables with `storage=te.Tiered`; empty without any."""
        group = self._group(tiered_engine.TieredGroup, built=True)
        return {} if group is None else group.tables

    @property
    def dynamic_group(self) -> Any:
        """The `dynamic.engine.DynamicGroup` running the dynamic tables' features, or None without any."""
        return self._group(dynamic_engine.DynamicGroup)

    @property
    def dynamic_tables(self) -> dict:
        """`{DynamicTableConfig: DynamicTable}` (a list of shards per table when sharded); empty without any."""
        group = self._group(dynamic_engine.DynamicGroup, built=True)
        return {} if group is None else group.tables

    @property
    def dynamic_step(self) -> Any:
        """The dynamic tables' step counter (int64 variable, advanced by each update), or None without any."""
        group = self._group(dynamic_engine.DynamicGroup, built=True)
        return None if group is None else group.step

    # ------------------------------------------------------------------ variables

    def build(self, per_replica_input_shapes: Any = None, per_replica_batch_size: int | None = None) -> None:
        """Creates the tables and slot variables (idempotent).

        Args:
          per_replica_input_shapes: optional nest (matching `feature_config`) of input shapes; fixes the
            `input_shape` written to `config_proto`. Otherwise the first `enqueue` decides.
          per_replica_batch_size: deprecated form of the same: the batch size of every feature.

        Raises:
          ValueError: if the shapes' structure does not match `feature_config`, or a shape contradicts a
            `FeatureConfig.output_shape`.
        """
        if self._built:
            return
        shapes = inputs_lib.build_output_shapes(self._feature_config, per_replica_input_shapes, per_replica_batch_size)
        if shapes is not None:
            self.merge_output_shapes(shapes)
        with tf.init_scope():
            self._variables = self._create_variables_and_slots()
            for group in self._groups:
                group.build(self)
        self._built = True

    def _checkpoint_adapter(self, path: str) -> None:
        """TensorFlow's hook before any child is restored: checks every table's checkpoint data, so a refused
        restore changes no table (`engine.checkpoint`). Returns None: no resharding."""
        checkpoint_lib.validate(self, path)
        return None

    @property
    def built(self) -> bool:
        """Whether `build` has created the variables and tables."""
        return self._built

    def checkpoint_children(self) -> dict:
        """`{name: trackable}`: the tables, slots and groups' tables a checkpoint writes below this object."""
        return dict(self._trackable_children())

    def ensure_built(self) -> None:
        """`build()` unless built, safe inside a trace (the variables are created eagerly, once)."""
        self._maybe_build()

    def _maybe_build(self) -> None:
        if not self._built:
            # May run while tracing a function: init_scope creates the variables eagerly, once.
            with tf.init_scope():
                self.build()

    def _make_variable(
        self, name: str, shape: tuple, initializer: Callable, trainable: bool, dtype: tf.DType = tf.float32
    ):
        """Creates one variable; the Keras layer overrides this to create `keras.Variable`s instead.

        `dtype` is the storage dtype (`te.TableConfig`); `initializer(shape, dtype)` already yields it."""
        return variables_lib.make_tf_variable(name, shape, initializer, trainable, dtype)

    def _create_variables_and_slots(self) -> dict:
        """Creates {table name: {"parameters": var, <slot>: var}}, tracked as TensorFlow's CPU classes do."""
        variables = variables_lib.create_variables_and_slots(self, self._table_config, self._make_variable)
        if table_config.needs_rounding_step(self._table_config):
            self._rounding_step = variables_lib.create_rounding_step(self, self._make_variable)
        return variables

    @property
    def embedding_tables(self) -> dict:
        """A dict of embedding tables, `{TableConfig: tf.Variable}` (builds the object if needed): the static
        in-memory tables. Dynamic tables are in `dynamic_tables`, tiered ones in `tiered_tables` (they are not
        variables)."""
        self._maybe_build()
        return {table: self._variables[table.name]["parameters"] for table in self._table_config}

    @property
    def slot_variables(self) -> dict:
        """The optimizer slots, `{TableConfig: {slot_name: tf.Variable}}`, slots in Load/Retrieve order."""
        self._maybe_build()
        return variables_lib.slot_variables(self._variables, self._table_config)

    @property
    def variables(self) -> dict:
        """`{table name: {"parameters": var, <slot>: var}}`, as `TPUEmbeddingForServing.variables`."""
        self._maybe_build()
        return self._variables

    # ------------------------------------------------------------------ configuration

    @property
    def config_proto(self):
        """The `TPUEmbeddingConfiguration` this object runs (what `tf_embed_ops.config.from_feature_config` gives).

        Raises:
          ValueError: if the output shapes are not known yet (call `build` with shapes, or `enqueue` first).
        """
        if self._config_proto is not None:
            return self._config_proto
        proto = tables_lib.group_config_proto(
            self._feature_config,
            self._group(self._IN_MEMORY_GROUP),
            self._output_shapes,
            self._pipeline_execution_with_tensor_core,
        )
        # input_shape is written only once every shape is known (TF fixes them at build); until then the proto
        # is recomputed. The kernels take the batch shape from their inputs, never from here.
        if all(s.is_fully_defined() for s in self._output_shapes):
            self._config_proto = proto
        return proto

    # ------------------------------------------------------------------ the front-end interface
    # What the Keras layers, the sharded classes and the synchronous aggregator use: the engine's configuration,
    # its input normalisation, its lookup and its fused update. Subclasses override `lookup` and
    # `send_gradients` (and `_make_variable` / `_create_variables_and_slots` for their own variables).

    @property
    def feature_config(self) -> Any:
        """The `feature_config` nest this object was created with."""
        return self._feature_config

    @property
    def table_configs(self) -> list:
        """The tables in table order (first appearance in `nest.flatten(feature_config)`): the order of the
        kernels' table inputs and of `config_proto.table_descriptor`."""
        return list(self._table_config)

    @property
    def dynamic_learning_rates(self) -> list:
        """The learning-rate callables in dynamic-learning-rate tag order (one per distinct callable)."""
        return list(self._dynamic_learning_rates)

    @property
    def serialized_config(self) -> bytes:
        """`config_proto` serialized: the kernels' `config` attr."""
        return self.config_proto.SerializeToString()

    @property
    def combiners(self) -> list:
        """Each table's combiner, in table order."""
        return [table.combiner for table in self._table_config]

    def merge_output_shapes(self, incoming: list) -> None:
        """Fills still-unknown output shapes (for `config_proto`): `engine.inputs.merge_output_shapes`."""
        merged = inputs_lib.merge_output_shapes(self._output_shapes, incoming)
        # Assigned only when a shape changes: the list is a tracked attribute, and replacing it on every call would
        # change the object graph under a checkpoint saved from another thread.
        if merged != list(self._output_shapes):
            self._output_shapes = merged

    # ------------------------------------------------------------------ enqueue / dequeue / apply

    def normalize_inputs(self, features: Any, weights: Any) -> tuple[list, list]:
        """Validates and normalises features (and weights) to FeatureInputs in flattened feature order.

        Returns the FeatureInputs and the incoming output shapes (input shape per TF's rule).
        """
        return inputs_lib.normalize_inputs(self._feature_config, self._groups, features, weights)

    def enqueue(self, features: Any, weights: Any = None, training: bool = True, name: str | None = None) -> None:
        """Queues a batch of ids for `dequeue` (and, if `training`, for `apply_gradients`).

        Args:
          features: a nest matching `feature_config` of dense `tf.Tensor` (rank >= 1; rank >= 2 needs last dim
            1), `tf.SparseTensor` (rank >= 2) or `tf.RaggedTensor` (rank 2) ids.
          weights: None, or a nest matching `features` of per-id weights of the same kind (None entries allowed;
            dense features take no weights).
          training: False queues an inference batch: `apply_gradients` then raises.
          name: a name scope for the normalisation ops.

        Raises:
          ValueError: on a structure, rank, kind or weight mismatch (naming the feature).
        """
        if not isinstance(training, (bool, int)):
            raise ValueError(f"Argument `training` must be a Python bool; got {training!r}.")
        with tf.name_scope(name or "tpu_embedding_enqueue"):
            inputs, shapes = self.normalize_inputs(features, weights)
        self.merge_output_shapes(shapes)
        self._maybe_build()
        self._pending.batch = inputs_lib.pending_batch(inputs, bool(training))

    def _take_pending(self, what: str) -> inputs_lib.Pending:
        return inputs_lib.checked_pending(self._pending.batch, self._built, what)

    def tables_and_slots(self) -> tuple[list, list]:
        """The kernels' table and slot inputs, in table order (slots in Load/Retrieve order)."""
        return variables_lib.tables_and_slots(self._variables, self._table_config)

    def reshape_activations(self, activations: list) -> list:
        """Applies FeatureConfig.output_shape (the op gives input_shape + [dim])."""
        return lookup_lib.reshape_activations(activations, tf.nest.flatten(self._feature_config))

    def dequeue(self, name: str | None = None) -> Any:
        """Looks up the queued batch: activations in the nest of `feature_config`.

        Each activation has shape `input_shape + [dim]` (dense `[B, 1]` gives `[B, dim]`; a sequence feature
        `[B, max_sequence_length, dim]`).

        Raises:
          RuntimeError: if not built, nothing was enqueued, or the ids live in another graph.
        """
        pending = self._take_pending("dequeue")
        acts = self._lookup_all(pending.inputs, pending.training, name=name)
        return tf.nest.pack_sequence_as(self._feature_config, self.reshape_activations(list(acts)))

    def apply_gradients(self, gradients: Any, name: str | None = None) -> None:
        """Updates the tables with the gradients of the loss w.r.t. the dequeued activations.

        Learning-rate callables are evaluated here, once each, in tag order.

        Args:
          gradients: a nest matching `feature_config` of `tf.Tensor` gradients (shape of the activation), or
            None for a feature with no gradient (a zero gradient is sent, with TensorFlow's warning).
          name: a name for the op.

        Raises:
          RuntimeError: if not built, nothing was enqueued, the batch was enqueued with `training=False`, or a
            table has no optimizer.
          ValueError: for a non-Tensor gradient or a gradient of the wrong shape.
          ValueError: under XLA (`jit_compile=True`), which cannot compile the table update.
        """
        if _xla.in_xla_context():
            raise _xla.training_refused(f"{type(self).__name__}.apply_gradients")
        pending = self._take_pending("apply_gradients")
        if not pending.training:
            raise RuntimeError("apply_gradients called after enqueue(..., training=False): the batch is inference.")
        table_config.check_trainable(self._table_config)
        with tf.name_scope(name or "tpu_embedding_apply_gradients"):
            flat = update_lib.gradients_for_send(self._feature_config, gradients, pending.inputs)
            self.send(flat, pending.inputs)

    def send_all(self, gradients: list, inputs: list, check_trainable: bool = True) -> tf.Tensor:
        """The fused updates of every table group for one step: what `apply_gradients` runs (`backends.walk.send`:
        every group's checks run before any group writes, so a step any of them refuses changes no table). The
        Keras layer runs it in the backward pass of its lookup.

        Args:
          gradients: the activations' gradients in feature order, shaped as the lookup op returns them.
          inputs: the normalised inputs of the step, feature order.
          check_trainable: False where the tables without an optimizer are declared frozen (the Keras layers'
            `frozen_tables`; `backends.walk.send`): their update leaves them unchanged instead of being refused.

        Returns:
          A float32 scalar read after every update (what each group's update returns: its step counter or a table
          element): a data dependency on the whole update, for the Keras layers' trigger (`update_trigger`).
        """
        return walk.probe(self._groups, walk.send(self._groups, gradients, inputs, check_trainable))

    def send(self, gradients: list, inputs: list) -> list:
        """The fused updates of every table group (as `send_all`, without the scalar read after them); returns each
        group's result of `send_gradients`, in group order."""
        return walk.send(self._groups, gradients, inputs)

    def prefetch(self, features: Any, weights: Any = None) -> list:
        """Makes the rows the tiered tables will need for `features` resident in their caches (not pinned).

        Call it with the next batch in the same `tf.function` as the current step, between `dequeue` and
        `apply_gradients` (a function runs the ops of one table in program order). It returns at once: a thread of
        each table's cache reads the rows while the rest of the step runs, and the next step's lookup waits for it
        only if it has rows to read, so the rows it brought are hits (docs/tiered_tables.md). A failed prefetch is
        reported by the table's next one. Ids of in-memory tables are ignored. Without a group that prefetches
        (`TableGroup.prefetches`: the tiered tables') this does nothing.

        Args:
          features, weights: a batch, as `enqueue` takes it.

        Returns:
          The prefetch ops (eagerly: [], they have run).

        Raises:
          ValueError: as `enqueue`, for a batch that does not match `feature_config`.
        """
        if not any(g.prefetches for g in self._groups):
            return []
        with tf.name_scope("tpu_embedding_prefetch"):
            inputs, _ = self.normalize_inputs(features, weights)
            self._maybe_build()
            return self.prefetch_inputs(inputs)

    def prefetch_inputs(self, inputs: list) -> list:
        """`prefetch` of normalised inputs (every feature's, feature order): each group's prefetch ops."""
        return [op for g in self._groups for op in g.prefetch([inputs[i] for i in g.positions])]

    def lookup_all(self, inputs: list, training: bool) -> list:
        """Activations of every feature (normalised inputs, feature order; the op's shapes, before
        `reshape_activations`): each table group's (`backends.walk.lookup`). With `training`, dynamic tables insert
        new keys."""
        return self._lookup_all(inputs, training)

    def lookup_and_update_all(self, inputs: list, trigger: Any) -> list:
        """A training lookup of every feature whose backward pass runs the fused updates (the Keras layers' form,
        `update_trigger`): one group's own `lookup_and_update`, or `send_all` across every group (every group's
        checks before any group writes, so a step one refuses changes no table).

        Args:
          inputs: the normalised inputs, feature order.
          trigger: the layer's update-trigger value; its gradient is a zero that depends on the updates.
        """
        if len(self._groups) == 1:
            return self._groups[0].lookup_and_update(inputs, trigger)
        return update_trigger.hang_update_on_trigger(
            trigger,
            lambda: self.lookup_all(inputs, training=True),
            # The layers declare the tables they never train (`frozen_tables`) and check the others at construction.
            lambda gradients: self.send_all(gradients, inputs, check_trainable=False),
        )

    def _lookup_all(self, inputs: list, training: bool, name: str | None = None) -> list:
        walk.refuse_under_xla(self._groups, type(self).__name__, "Look them up outside jit_compile.")
        with tf.name_scope(name or "lookup"):
            return walk.lookup(self._groups, inputs, training)

    def lookup(self, inputs: list, name: str | None = None) -> list:
        """Runs the forward op over normalised inputs (feature order); overridden by the sharded subclass. Under
        XLA, the op's stock-TensorFlow equivalent (`tf_embed_ops._xla.lookup`, equal bit for bit)."""
        if _xla.in_xla_context():
            # The in-memory group read as a serving graph reads it, without a context: the variables themselves.
            return self._group(self._IN_MEMORY_GROUP).serving_group(None).lookup(inputs)
        tables, _ = self.tables_and_slots()
        return list(
            embedding_ops.embedding_activations(
                inputs, tables, self.serialized_config, combiners=self.combiners, name=name
            )
        )

    def send_gradients(self, gradients: list, learning_rates: list, inputs: list) -> Any:
        """Runs the fused backward/optimizer op (gradients in feature order, rates in tag order); overridable.
        Returns the op (None eagerly, or from an override that runs several)."""
        tables, slots = self.tables_and_slots()
        update = embedding_ops.send_tpu_embedding_gradients(
            gradients,
            learning_rates,
            inputs,
            tables,
            slots,
            self.serialized_config,
            combiners=self.combiners,
            check_numerics=self._check_numerics,
            **self.rounding_arguments(),
        )
        self.advance_rounding_step([update])
        return update

    @property
    def rounding_step_variable(self) -> tf.Variable | None:
        """The step counter keying the stochastic rounding of the in-memory 16-bit tables (the checkpoint's
        `rounding_step`), or None without such tables (or before `build`)."""
        step = getattr(self, "_rounding_step", None)
        if step is not None and not isinstance(step, tf.Variable):
            step = step.value  # a keras.Variable's backing tf.Variable
        return step

    def rounding_arguments(self) -> dict:
        """The send op's rounding arguments for 16-bit tables (docs/low_precision.md), {} without them: the
        rounding per table, with stochastic rounding the current value of the step counter, and each table's
        index among the embedding's static tables (`rounding_table_ids`: tiered tables count, so an in-memory
        table rounds as it does with every table in memory)."""
        return update_lib.rounding_arguments(
            self._table_config,
            self.rounding_step_variable,
            tiered_engine.rounding_table_ids(self._every_table, self._table_config),
        )

    def advance_rounding_step(self, updates: list) -> None:
        """Counts one step once `updates` (the send ops of the step; None entries: ran eagerly) have run, so a
        rejected step leaves the counter unchanged."""
        update_lib.advance_rounding_step(self.rounding_step_variable, updates)

    def __call__(self, features: Any, weights: Any = None) -> Any:
        """Lookup only (no queue, no training): activations for `features`, as `dequeue` would give them."""
        return self.embedding_lookup(features, weights)

    def embedding_lookup(self, features: Any, weights: Any = None) -> Any:
        """Same as `__call__`.

        As TensorFlow's serving class, `features` may hold only some of the configured features (matched by
        their joined key paths); the result then has the nest of `features`. `enqueue` (training) needs all.
        """
        with tf.name_scope("tpu_embedding_lookup"):
            present, subset = None, features
            try:
                tf.nest.assert_same_structure(self._feature_config, features)
            except (ValueError, TypeError):
                present, features, weights = inputs_lib.complete_subset(self._feature_config, features, weights)
            inputs, shapes = self.normalize_inputs(features, weights)
            if present is not None:  # the stand-ins' shapes must not enter config_proto
                shapes = inputs_lib.present_shapes(self._feature_config, shapes, present)
            self.merge_output_shapes(shapes)
            self._maybe_build()
            acts = self._lookup_all(inputs, training=False)
            if present is None:
                return tf.nest.pack_sequence_as(self._feature_config, self.reshape_activations(list(acts)))
            return lookup_lib.pack_subset(self._feature_config, acts, present, subset)
