"""`TPUEmbeddingV2`: TensorFlow's SparseCore mid-level API (TPU v5p/v6e), trainable on CPU.

Same constructor and methods as `tf.tpu.experimental.embedding.TPUEmbeddingV2`: `enqueue` returns the
preprocessed batch, `dequeue(batch)` and `embedding_lookup` / `__call__` return `(activations, batch)`, and
`apply_gradients(gradients, batch)` trains. What differs from the v2 (TensorCore) engine is SparseCore's:

* the host preprocessing: ids repeated in a sample are merged, combiners become per-id gains computed on the host,
  per-SparseCore capacity limits (`SparseCoreEmbeddingConfig.max_ids_per_table`, `max_unique_ids_per_table`,
  `max_ids_per_chip_per_sample`) are errors, or drop ids exactly where SparseCore drops them when
  `allow_id_dropping` (`tf_embed_ops.sparse_core.preprocess` ports TensorFlow's host kernels);
* the fused updates: no gradient clipping, no weight clipping, no gradient-accumulation switch (per-row sums
  always), Adam always lazy, and weight decay raises `NotImplementedError` as TensorFlow's class does;
* activations are `output_shape + [dim]` and every feature needs an `output_shape` whose product is its batch.

The numerics run on `tf_embed_ops.TPUEmbedding`'s engine: this class builds a `TPUEmbeddingConfiguration` with
those SparseCore settings (the combiner folded into the host gains, so every table combines by `sum`) and feeds its
fused ops. Variables are per table (`table_variables`: `{TableConfig: variable}`); `embedding_tables` presents
them stacked, keyed by stacked table name, as TensorFlow's does, and checkpoints are written and read in the
stacked SparseCore layout of `TPUEmbeddingV2`, with its `_sparse_core_table_layouts` entry, so checkpoints move
both ways between this class, TensorFlow's `TPUEmbeddingV2` and TensorFlow's `TPUEmbeddingForServing`.

Tiered tables (`te.TableConfig(storage=te.Tiered(...))`) train on the engine's tiered group as in
`te.TPUEmbedding`. A tiered table is never stacked (its rows live in its own row file): it is laid out in a stack
of its own, and checkpoints hold it streamed under its table name beside the stacked entries
(`engine.stacked_tiered_restore`; docs/tiered_tables_v2.md).

Example:
    >>> api = tf.tpu.experimental.embedding
    >>> table = api.TableConfig(64, 8, name="video", optimizer=api.Adagrad(0.1))
    >>> fc = {"watched": api.FeatureConfig(table, output_shape=[16])}
    >>> emb = TPUEmbeddingV2(fc)
    >>> with tf.GradientTape() as tape:
    ...   acts, batch = emb(features)
    ...   tape.watch(acts); loss = model(acts)
    >>> emb.apply_gradients(tape.gradient(loss, acts), batch)
"""

from __future__ import annotations

import copy
import functools
from typing import Any, NamedTuple

import tensorflow as tf
from absl import logging

from tf_embed_ops import _tf_compat
from tf_embed_ops import tpu_embedding as mid_level
from tf_embed_ops._tf_compat import nest, trackable_base
from tf_embed_ops.backends import walk
from tf_embed_ops.dynamic import config as dynamic_config
from tf_embed_ops.engine import checkpoint as engine_checkpoint
from tf_embed_ops.engine import lookup as lookup_lib
from tf_embed_ops.engine import stacked_tiered_restore
from tf_embed_ops.sparse_core import batch as batch_lib
from tf_embed_ops.sparse_core import checkpoint as checkpoint_lib
from tf_embed_ops.sparse_core import config_checks, stacked_variable
from tf_embed_ops.sparse_core import layout as layout_lib
from tf_embed_ops.sparse_core import preprocess as preprocess_lib
from tf_embed_ops.tiered import config as tiered_config

__all__ = ["TPUEmbeddingV2", "SparseCoreBatch"]

_emb = tf.tpu.experimental.embedding


class SparseCoreBatch(NamedTuple):
    """What `enqueue` returns and `dequeue` / `apply_gradients` take (TensorFlow's partitioned tensors)."""

    inputs: tuple  # per feature: embedding_ops.FeatureInput of the kept (sample, id, gain) triples
    dropped: dict  # {stacked table: number of ids dropped by the capacity limits}


class TPUEmbeddingV2(_tf_compat.AutoTrackable):
    """`tf.tpu.experimental.embedding.TPUEmbeddingV2` (SparseCore), trainable on CPU.

    Differences from TensorFlow's class (see docs/mid_level_api.md for the full table): no `TPUStrategy`; the
    SparseCore topology the layouts describe is given by `num_replicas` and `num_sc_per_chip` (TensorFlow reads
    it from the strategy) and a batch is one replica's; `embedding_tables` is keyed by stacked table name as
    TensorFlow's, its values are `StackedVariable` views over the per-table variables that train here
    (`table_variables`: `{TableConfig: tf.Variable}`; `variables` is per table name); ids outside a table are an
    error (SparseCore would read a neighbouring table of the stack). Tiered tables are never stacked: they are in
    `tiered_tables`, not in those views, and `prefetch` reads the next batch's rows beside the current step.
    """

    DEFAULT_MAX_IDS_PER_TABLE = 256
    DEFAULT_MAX_UNIQUE_IDS_PER_TABLE = 256

    def __init__(
        self,
        feature_config: Any,
        optimizer: Any = None,
        pipeline_execution_with_tensor_core: bool = False,
        sparse_core_embedding_config: Any = None,
        *,
        num_replicas: int = 1,
        num_sc_per_chip: int = 4,
    ):
        """Creates the object; variables are created by `build` (or the first lookup).

        Args:
          feature_config: a nest of `tf.tpu.experimental.embedding.FeatureConfig`, each with an `output_shape`.
          optimizer: default optimizer of tables without one: `SGD`, `Adagrad`, `AdagradMomentum`, `Adam`, `FTRL`
            (TensorFlow's SparseCore updates), or None (tables without an optimizer get no slots and cannot be
            trained).
          pipeline_execution_with_tensor_core: recorded; on CPU the lookup never overlaps the update.
          sparse_core_embedding_config: a `tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig`; its limits
            are keyed by stacked table name (see `embedding_layouts`).
          num_replicas: TPU chips the layouts and the id-to-SparseCore mapping describe (TensorFlow: the
            strategy's replicas). A batch given to this object is one replica's batch.
          num_sc_per_chip: SparseCores per chip (TensorFlow's default when the hardware does not say: 4).

        Raises:
          NotImplementedError: a table's optimizer sets weight decay (as TensorFlow's class).
          ValueError: a feature without `output_shape`, a sample count not divisible by `num_sc_per_chip`, an
            unsupported optimizer, combiner or table dtype, a non-power-of-two SparseCore count, a dynamic table
            (tiered or not), a tiered table named like a stacked table of the others, or a bad config.
        """
        self._feature_config = _tf_compat.clone_feature_config(feature_config)
        if not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"Argument `num_replicas` must be an int >= 1; got {num_replicas!r}.")
        if not isinstance(num_sc_per_chip, int) or num_sc_per_chip < 1:
            raise ValueError(f"Argument `num_sc_per_chip` must be an int >= 1; got {num_sc_per_chip!r}.")
        physical = num_replicas * num_sc_per_chip
        if physical & (physical - 1):
            raise ValueError(
                f"num_replicas x num_sc_per_chip = {physical} SparseCores; SparseCore needs a power of two "
                "(ids are mapped to SparseCores by their low bits)."
            )
        self._num_replicas = num_replicas
        self._num_sc_per_chip = num_sc_per_chip
        self._pipelining = bool(pipeline_execution_with_tensor_core)
        if sparse_core_embedding_config is None:
            sparse_core_embedding_config = _emb.SparseCoreEmbeddingConfig()
            logging.warning(
                "SparseCoreEmbeddingConfig is not provided. Using default values %s", sparse_core_embedding_config
            )
        self._sparse_core_embedding_config = sparse_core_embedding_config
        self._flat_features = nest.flatten_with_joined_string_paths(self._feature_config)

        # Table order, global optimizer and names exactly as TensorFlow's base class does them.
        self._table_config = []
        for _, feature in self._flat_features:
            if not any(feature.table is t for t in self._table_config):
                self._table_config.append(feature.table)
        names = []
        for i, table in enumerate(self._table_config):
            if table.optimizer is None:
                table.optimizer = optimizer
            if table.name is None:
                table.name = f"table_{i}"
            if table.name in names:
                raise ValueError(f"Tables must have a unique name. Multiple tables with name {table.name} found.")
            names.append(table.name)
            if dynamic_config.is_dynamic(table):
                kind = "a tiered dynamic table" if tiered_config.is_tiered(table) else "a dynamic table"
                raise ValueError(
                    f"TPUEmbeddingV2 does not train dynamic tables: table {table.name!r} is {kind} "
                    "(te.DynamicTableConfig); SparseCore's layouts need a fixed vocabulary_size. Train it with "
                    "te.TPUEmbedding or te.keras.TPUEmbedding."
                )
            config_checks.check_table(table)
        for path, feature in self._flat_features:
            config_checks.check_feature(path, feature, self._num_sc_per_chip)

        # A tiered table keeps its rows in its own row file: it is never stacked with another table (its own
        # stacked table, named after it, sets its SparseCore limits and its ids' order; docs/tiered_tables_v2.md).
        self._tiered_names = frozenset(t.name for t in self._table_config if tiered_config.is_tiered(t))
        self._stacking = layout_lib.compute_stacking(
            self._feature_config,
            num_replicas,
            num_sc_per_chip,
            sparse_core_embedding_config,
            apart=self._tiered_names,
        )
        self._max_ids, self._max_unique_ids, self._max_ids_per_chip_per_sample = config_checks.capacity_limits(
            self._sparse_core_embedding_config,
            self._stacking.stacked_table_to_tables,
            self.DEFAULT_MAX_IDS_PER_TABLE,
            self.DEFAULT_MAX_UNIQUE_IDS_PER_TABLE,
        )
        self._engine = mid_level.TPUEmbedding(self._engine_feature_config(), None, self._pipelining)
        self._built = False

    # ------------------------------------------------------------------ validation and configuration

    def _engine_feature_config(self) -> list:
        """The engine's view: same tables (names, sizes, initializers, slots), SparseCore optimizers, `sum`."""
        engine_tables = {}
        features = []
        for _, feature in self._flat_features:
            table = feature.table
            if table.name not in engine_tables:
                clone = copy.copy(table)
                clone.optimizer = config_checks.sparse_core_optimizer(table.optimizer)
                clone.combiner = "sum"  # the host gains already hold the combiner
                engine_tables[table.name] = clone
            features.append(_emb.FeatureConfig(table=engine_tables[table.name]))
        return features

    # ------------------------------------------------------------------ variables

    def build(self) -> None:
        """Creates the tables and slots (idempotent)."""
        if self._built:
            return
        with tf.init_scope():
            self._engine.build()
            # Kept out of attribute tracking (a SavedModel tracks the engine's per-table variables instead).
            self.__dict__["_checkpoint_children"] = self._make_checkpoint_children()
            self.__dict__["_stacked_variables"] = self._make_stacked_variables()
        self._built = True

    def _maybe_build(self) -> None:
        if not self._built:
            with tf.init_scope():
                self.build()

    def _engine_table(self, table: Any) -> Any:
        return next(t for t in self._engine.table_configs if t.name == table.name)

    def _memory_stacks(self) -> list[str]:
        """The stacked tables of the in-memory tables (a tiered table's own stack has no stacked variable)."""
        return [
            stack
            for stack, names in self._stacking.stacked_table_to_tables.items()
            if not self._tiered_names.intersection(names)
        ]

    def _memory_layouts(self) -> dict:
        return {n: lay for n, lay in self._stacking.layouts.items() if n not in self._tiered_names}

    @property
    def tiered_tables(self) -> dict:
        """`{TableConfig: te.tiered.TieredTable}` of the tables with `storage=te.Tiered(...)` (keyed as
        `table_variables`); empty without any. A tiered table is never stacked: it is in neither `embedding_tables`
        nor `table_variables`; its rows are read with `TieredTable.read_rows` (docs/tiered_tables.md)."""
        if not self._tiered_names:
            return {}
        self._maybe_build()
        by_name = self._tiered_by_name()
        return {t: by_name[t.name] for t in self._table_config if t.name in self._tiered_names}

    def _tiered_by_name(self) -> dict:
        """`{table name: TieredTable}` (empty before the engine is built)."""
        group = self._engine.tiered_group
        return {} if group is None else {config.name: table for config, table in group.tables.items()}

    def _refuse_under_xla(self, what: str) -> None:
        advice = "Run the embedding outside jit_compile (the model after it may be compiled)."
        walk.refuse_under_xla(self._engine.groups, f"TPUEmbeddingV2.{what}", advice)

    @property
    def embedding_tables(self) -> dict:
        """`{stacked table name: StackedVariable}`, as TensorFlow's class: one variable per stack, holding the
        stacked (row-sharded) values of its tables; reading stacks the per-table variables, `assign` splits into
        them (`tf_embed_ops.sparse_core.stacked_variable`). The per-table variables: `table_variables`. Tiered
        tables are never stacked and have no variable: see `tiered_tables`."""
        self._maybe_build()
        return dict(self.__dict__["_stacked_variables"])

    @property
    def table_variables(self) -> dict:
        """`{TableConfig: tf.Variable}`: each in-memory table's own variable, the one the kernels train (tiered
        tables: `tiered_tables`)."""
        self._maybe_build()
        variables = self._engine.variables
        return {t: variables[t.name]["parameters"] for t in self._table_config if t.name not in self._tiered_names}

    def _make_stacked_variables(self) -> dict:
        out = {}
        for stack in self._memory_stacks():
            value = self._stacked_value(stack, "parameters")
            out[stack] = stacked_variable.StackedVariable(
                stack,
                functools.partial(self._stacked_value, stack, "parameters"),
                functools.partial(self._assign_stacked_value, stack, "parameters"),
                value.shape,
                value.dtype,
                self._num_replicas,
            )
        return out

    def _assign_stacked_value(self, stack: str, slot: str, value: Any) -> Any:
        names = self._stacking.stacked_table_to_tables[stack]
        return tf.group(
            [
                self._engine.variables[n][slot].assign(layout_lib.unstack_value(value, self._stacking.layouts[n]))
                for n in names
            ]
        )

    @property
    def variables(self) -> dict:
        """`{table name: {"parameters": var, <slot>: var}}`, per table."""
        self._maybe_build()
        return self._engine.variables

    @property
    def embedding_layouts(self) -> dict:
        """`{table name: SparseCoreTableLayout}`: where each in-memory table lives in its stacked variable
        (TensorFlow's). A tiered table has no stacked variable; its own stack's layout (what its ids' order and
        SparseCore limits follow) is `sparse_core_layouts[name]`."""
        return self._memory_layouts()

    @property
    def sparse_core_layouts(self) -> dict:
        """`{table name: SparseCoreTableLayout}` of every table, tiered ones included (each alone in its stack)."""
        return dict(self._stacking.layouts)

    def stacked_tables(self, slot: str = "parameters") -> dict:
        """`{stacked table name: tf.Tensor}`: the values TensorFlow's stacked variables would hold."""
        self._maybe_build()
        return {name: self._stacked_value(name, slot) for name in self._memory_stacks()}

    @property
    def embedding_table_shards(self) -> dict:
        """`{stacked table name: [(device, shard)]}`: the stacked values split as TensorFlow shards them over chips.

        TensorFlow's property lists each TPU device's shard of a stacked variable (even row blocks, one per chip);
        here the devices are named `"TPU:<chip>"` for the `num_replicas` chips of the layouts, and the shards are
        tensors computed from the per-table variables.
        """
        self._maybe_build()
        out = {}
        for name, value in self.stacked_tables().items():
            shards = tf.split(value, self._num_replicas, axis=0)
            out[name] = [(f"TPU:{chip}", shard) for chip, shard in enumerate(shards)]
        return out

    def _stacked_value(self, stack: str, slot: str) -> tf.Tensor:
        names = self._stacking.stacked_table_to_tables[stack]
        values = [self._engine.variables[n][slot].read_value() for n in names]
        return layout_lib.stack_values(values, [self._stacking.layouts[n] for n in names])

    def _restore_stacked_value(self, stack: str, slot: str, value: Any) -> list:
        layouts = self.__dict__.get("_restore_layouts") or self._stacking.layouts
        ops = []
        for name in self._stacking.stacked_table_to_tables[stack]:
            part = layout_lib.unstack_value(value, layouts[name])
            ops.append(self._engine.variables[name][slot].assign(part))
        return ops

    def _slot_names(self, stack: str) -> list:
        first = self._stacking.stacked_table_to_tables[stack][0]
        table = next(t for t in self._table_config if t.name == first)
        return _tf_compat.slot_names(table.optimizer) if table.optimizer is not None else []

    def _trackable_children(self, save_type=trackable_base.SaveType.CHECKPOINT, **kwargs):
        if save_type != trackable_base.SaveType.CHECKPOINT:
            return super()._trackable_children(save_type, **kwargs)
        # Checkpoints hold TensorFlow's SparseCore names: one stacked variable per stack and slot, and the
        # layouts; the per-table engine variables are not children.
        self._maybe_build()
        return dict(self._checkpoint_children)

    def _checkpoint_adapter(self, path: str):
        """Called by TensorFlow's restore before any child is restored: picks how to read the checkpoint.

        A checkpoint without SparseCore layouts is a per-table one and restores table by table
        (`_lookup_dependency`). A stacked one of another topology but the same stacks is split with its own
        layouts; another stacking raises (see `sparse_core.checkpoint.layouts_for_restore`).
        """
        theirs = checkpoint_lib.read_layouts(path)
        if self._tiered_names or self._has_tiered_saver_child():
            # Tiered tables are restored through their saver or here (`engine.stacked_tiered_restore`); every table
            # is checked before the first write.
            plan = stacked_tiered_restore.plan_restore(
                path,
                engine_checkpoint.calling_position(self),
                theirs,
                self._memory_layouts(),
                self._tiered_by_name(),
                self._engine,
            )
            plan.write()
            theirs = plan.layouts
        elif theirs is not None:
            checkpoint_lib.check_same_stacks(path, theirs, self._memory_layouts())
        self.__dict__["_restore_per_table"] = theirs is None
        self.__dict__["_restore_layouts"] = theirs
        return None

    def _has_tiered_saver_child(self) -> bool:
        """Whether the checkpoint being restored holds a table streamed, as a tiered table."""
        return stacked_tiered_restore.holds_streamed(engine_checkpoint.calling_position(self))

    def _lookup_dependency(self, name, cached_dependencies=None):
        """During the restore of a per-table checkpoint, `<table>` / `<table>/<slot>` are our own variables."""
        if self.__dict__.get("_restore_per_table") and self._built:
            table, _, slot = name.partition("/")
            variables = self._engine.variables.get(table)
            if variables is not None and (slot or "parameters") in variables:
                return variables[slot or "parameters"]
        return super()._lookup_dependency(name, cached_dependencies)

    def _make_checkpoint_children(self) -> dict:
        """Created once: the checkpoint machinery identifies children by object."""
        children = {}
        for stack in self._memory_stacks():
            for slot in ["parameters"] + self._slot_names(stack):
                key = stack if slot == "parameters" else f"{stack}/{slot}"
                children[key] = checkpoint_lib.StackedSlot(
                    functools.partial(self._stacked_value, stack, slot),
                    functools.partial(self._restore_stacked_value, stack, slot),
                )
        if self._memory_stacks():
            children[checkpoint_lib.LAYOUTS_KEY] = checkpoint_lib.layouts_trackable(self._memory_layouts())
        # Tiered tables under their names, streamed by their registered saver (as in te.TPUEmbedding).
        children.update(self._tiered_by_name())
        # The 16-bit in-memory tables' rounding step (te.TPUEmbedding's key; TensorFlow's classes have no 16-bit
        # tables), so a restored run rounds on as the saved one would have.
        step = self._engine.rounding_step_variable
        if step is not None:
            children["rounding_step"] = step
        return children

    # ------------------------------------------------------------------ lookups and training

    def _plans(self) -> tuple[list, dict]:
        return preprocess_lib.plans(self._flat_features, self._stacking, self._max_ids, self._max_unique_ids)

    def _chips(self) -> batch_lib.Chips:
        config = self._sparse_core_embedding_config
        return batch_lib.Chips(
            self._num_replicas, self._num_sc_per_chip, self._max_ids_per_chip_per_sample, config.allow_id_dropping
        )

    def enqueue(self, features: Any, weights: Any = None, device: str | None = None) -> SparseCoreBatch:
        """Preprocesses a batch on the host, as SparseCore does; returns what `dequeue` takes.

        Args:
          features: a nest matching `feature_config` of dense `Tensor`s (one id per sample; as many ids as the
            product of `output_shape`), `SparseTensor`s (rank >= 2; rows sorted) or `RaggedTensor`s (rank 2, one
            row per sample).
          weights: None or a matching nest of float weights of the same kinds (dense ids take dense weights).
          device: ignored on CPU (TensorFlow places the preprocessing on the host of that TPU device).

        Raises:
          ValueError: structure, kind or size mismatch; InvalidArgumentError (when it runs) for ids outside their
            table, unsorted SparseTensor rows, or a batch over a SparseCore capacity limit (unless the limit is
            `max_ids_per_chip_per_sample` and `allow_id_dropping` is set: then those ids are dropped).
        """
        del device
        plans, stacks = self._plans()
        chips = self._chips()
        paths = [path for path, _ in self._flat_features]
        inputs, dropped = batch_lib.host_preprocess(
            self._feature_config, paths, features, weights, plans, stacks, chips
        )
        return SparseCoreBatch(tuple(inputs), dropped)

    def dequeue(self, partitioned_tensors: SparseCoreBatch) -> tuple[Any, SparseCoreBatch]:
        """Looks up an enqueued batch: `(activations in the nest of feature_config, the batch)`.

        Raises:
          ValueError: not a `SparseCoreBatch`; tiered tables under XLA (`jit_compile=True`), naming them.
          InvalidArgumentError: (when it runs) a tiered table's distinct rows of the batch exceed its cache.
        """
        if not isinstance(partitioned_tensors, SparseCoreBatch):
            raise ValueError(f"Expect the output of enqueue (a SparseCoreBatch) but get {type(partitioned_tensors)}.")
        self._maybe_build()
        self._refuse_under_xla("dequeue")
        # Each of the engine's table groups looks up its features, the activations back in feature order.
        acts = self._engine.lookup_all(list(partitioned_tensors.inputs), training=True)
        out = lookup_lib.reshape_activations(acts, [feature for _, feature in self._flat_features])
        return tf.nest.pack_sequence_as(self._feature_config, out), partitioned_tensors

    def embedding_lookup(self, features: Any, weights: Any = None) -> tuple[Any, SparseCoreBatch]:
        """`enqueue` then `dequeue`: `(activations, batch)`; pass the batch to `apply_gradients`."""
        self._maybe_build()
        return self.dequeue(self.enqueue(features, weights))

    def __call__(self, features: Any, weights: Any = None) -> tuple[Any, SparseCoreBatch]:
        return self.embedding_lookup(features, weights)

    def apply_gradients(self, gradients: Any, preserved_outputs: SparseCoreBatch) -> None:
        """Updates the tables from the gradients w.r.t. the activations of `preserved_outputs`' lookup.

        A `None` gradient sends zeros (TensorFlow's warning). Learning-rate callables are evaluated here.

        Raises:
          RuntimeError: not built, or a table has no optimizer.
          ValueError: a non-Tensor gradient or one of the wrong shape; tiered tables under XLA, naming them.
        """
        if not self._built:
            raise RuntimeError(
                "apply_gradients called on unbuilt TPUEmbeddingV2 object. Please either call the embedding lookup "
                "method first or manually call the build method."
            )
        if not isinstance(preserved_outputs, SparseCoreBatch):
            raise ValueError(f"Expect the batch from embedding_lookup but get {type(preserved_outputs)}.")
        nest.assert_same_structure(self._feature_config, gradients)
        for table in self._table_config:
            if table.optimizer is None:
                raise RuntimeError(f"Table {table.name!r} has no optimizer; it can be looked up but not trained.")
        flat = batch_lib.engine_gradients(nest.flatten(gradients), self._flat_features)
        self._refuse_under_xla("apply_gradients")
        # Every group's checks before any group writes: a step one refuses changes no table (`backends.walk.send`).
        self._engine.send(flat, list(preserved_outputs.inputs))

    def prefetch(self, partitioned_tensors: Any, weights: Any = None) -> list:
        """Makes the rows the tiered tables need for the next batch resident in their caches (not pinned).

        Call it with the next batch between this step's lookup and its `apply_gradients`, in the same
        `tf.function`: it returns at once, each table's cache thread reads the rows while the rest of the step
        runs, and the next lookup waits for it only if it has rows to read (docs/tiered_tables.md, "How a step
        runs"). Ids of in-memory tables are ignored; without tiered tables this does nothing.

        Args:
          partitioned_tensors: the next batch as `enqueue` returns it (a `SparseCoreBatch`), or its features (a
            nest as `enqueue` takes; preprocessed here).
          weights: the features' weights, when `partitioned_tensors` is features.

        Returns:
          The prefetch ops (eagerly: [], they have run).

        Raises:
          ValueError: as `enqueue`, for features that do not match `feature_config`.
        """
        if not self._tiered_names:
            return []
        batch = partitioned_tensors
        if not isinstance(batch, SparseCoreBatch):
            batch = self.enqueue(partitioned_tensors, weights)
        self._maybe_build()
        return self._engine.prefetch_inputs(list(batch.inputs))

    # ------------------------------------------------------------------ statistics

    @classmethod
    def compute_sparse_core_stats(
        cls,
        features: Any,
        feature_config: Any,
        num_tpu_chips: int,
        num_sc_per_chip: int = 4,
        optimizer: Any = None,
        sparse_core_embedding_config: Any = None,
    ) -> tuple[dict, dict]:
        """`(max_ids, max_unique_ids)` per stacked table for one batch, as TensorFlow's helper reports them.

        Size `SparseCoreEmbeddingConfig.max_ids_per_table` / `max_unique_ids_per_table` with the maximum over
        sample batches. Counts are per SparseCore, after SparseCore's merging of repeated ids, for the layout of
        `num_tpu_chips` chips; `features` is one chip's batch.
        """
        config = sparse_core_embedding_config or _emb.SparseCoreEmbeddingConfig()
        emb = cls(feature_config, optimizer, False, config, num_replicas=num_tpu_chips, num_sc_per_chip=num_sc_per_chip)
        plans, stacks = emb._plans()
        paths = [path for path, _ in emb._flat_features]
        return batch_lib.sparse_core_stats(emb._feature_config, paths, features, plans, stacks, emb._chips())
