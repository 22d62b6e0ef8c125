"""The TPUEmbedding mid-level API, trainable on CPU.

`TPUEmbedding` mirrors `tf.tpu.experimental.embedding.TPUEmbedding` (same constructor, `build`, `enqueue`,
`dequeue`, `apply_gradients`, `embedding_tables`), but runs anywhere TensorFlow runs: `dequeue` computes the
activations with our `EmbeddingActivations` op and `apply_gradients` runs our fused
`SendTPUEmbeddingGradients` op, which updates the tables and optimizer slots in place with the TPU semantics
(per-row gradient accumulation, the table's own optimizer, clipping, weight decay; touched rows only).

Variables are created and tracked exactly as TensorFlow's `TPUEmbedding`/`TPUEmbeddingForServing` create them on
CPU (`_add_variable_with_custom_getter`, one child per table and per slot), so `tf.train.Checkpoint(embedding=emb)`
writes the same keys and a checkpoint moves both ways between this class and TensorFlow's.

Example:
    >>> table = tf.tpu.experimental.embedding.TableConfig(vocabulary_size=100, dim=4, name="video")
    >>> feature_config = {"watched": tf.tpu.experimental.embedding.FeatureConfig(table=table)}
    >>> emb = TPUEmbedding(feature_config, tf.tpu.experimental.embedding.Adagrad(0.1))
    >>> @tf.function
    ... def step(ids):
    ...   emb.enqueue({"watched": ids})
    ...   with tf.GradientTape() as tape:
    ...     acts = emb.dequeue()
    ...     tape.watch(acts)
    ...     loss = tf.reduce_sum(acts["watched"] ** 2)
    ...   emb.apply_gradients(tape.gradient(loss, acts))
"""

from __future__ import annotations

import difflib
import functools
import sys
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import tensorflow as tf
from absl import logging

from tf_embed_ops import _restore_check, _tf_compat, embedding_ops, low_precision, table_config
from tf_embed_ops import config as config_lib
from tf_embed_ops.config._resolve import resolve_tables
from tf_embed_ops.dynamic import config as dynamic_config
from tf_embed_ops.dynamic import engine as dynamic_engine

__all__ = ["TPUEmbedding"]

_tpu_embedding = tf.tpu.experimental.embedding


def _supported_optimizers() -> tuple[type, ...]:
    # Every optimizer class the config loader maps into the proto: TensorFlow's five and tf_embed_ops.optimizers
    # (CustomOptimizer aside: a SparseCore program with no Load/Retrieve op and no CPU meaning).
    return config_lib.supported_optimizer_classes()


def _from_keras(optimizer: Any, table: Any) -> Any:
    # A Keras optimizer or its string name becomes its TPU optimizer (Keras is imported only for those).
    keras = sys.modules.get("keras")  # a Keras optimizer object implies Keras is imported
    if isinstance(optimizer, str) or (keras is not None and isinstance(optimizer, keras.optimizers.Optimizer)):
        from tf_embed_ops.keras import optimizer_mapping  # pylint: disable=import-outside-toplevel

        return optimizer_mapping.to_table_optimizer(optimizer, table)
    return optimizer


class _Pending(NamedTuple):
    """What `enqueue` leaves for `dequeue` and `apply_gradients` (the TPU engine keeps this hidden)."""

    inputs: list  # list[embedding_ops.FeatureInput], in feature order
    training: bool
    graph: Any  # the graph the tensors live in (None when eager)


def _current_graph():
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


class TPUEmbedding(_tf_compat.AutoTrackable):
    """The `tf.tpu.experimental.embedding.TPUEmbedding` mid-level API, trainable on CPU.

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
            name, or a table uses a `CustomCombiner`.
        """
        flat_features = tf.nest.flatten(feature_config)
        if not flat_features:
            raise ValueError("Argument `feature_config` must contain at least one FeatureConfig; got an empty nest.")
        for path, feature in _flatten_with_paths(feature_config):
            if not isinstance(feature, _tpu_embedding.FeatureConfig):
                raise ValueError(
                    f"Argument `feature_config` must hold tf.tpu.experimental.embedding.FeatureConfig objects; "
                    f"found {type(feature).__name__} at {path!r}."
                )
        self._feature_config = feature_config
        self._pipeline_execution_with_tensor_core = bool(pipeline_execution_with_tensor_core)
        self._check_numerics = bool(check_numerics)
        self._output_shapes = [tf.TensorShape(f.output_shape) for f in flat_features]

        # Table order, names and learning-rate tags as TensorFlow numbers them (one resolver for every front end).
        resolved = resolve_tables(flat_features, optimizer)
        self._table_config = list(resolved.tables)
        for i, (table, name) in enumerate(zip(self._table_config, resolved.names, strict=True)):
            # TensorFlow writes the global optimizer and the `table_{i}` name into the TableConfig itself; so do
            # we (same objects, same config proto from tf_embed_ops.config.from_feature_config).
            table.optimizer = resolved.optimizers[i]
            if table.optimizer is not None and not isinstance(table.optimizer, _supported_optimizers()):
                table.optimizer = _from_keras(table.optimizer, name)
            if table.optimizer is not None and not isinstance(table.optimizer, _supported_optimizers()):
                raise ValueError(
                    f"{type(table.optimizer)} is an unsupported optimizer class (table {name!r}). "
                    "Please pass an instance of tf.tpu.experimental.embedding.SGD, Adagrad, AdagradMomentum, "
                    "Adam or FTRL, of a tf_embed_ops.optimizers class, or keras.optimizers.SGD, Adagrad, Adam or Ftrl."
                )
            if not isinstance(table.combiner, str):
                raise ValueError(
                    f"Table {name!r} uses combiner {table.combiner!r}; only 'sum', 'mean' and 'sqrtn' "
                    "are supported off SparseCore."
                )
            table.name = name
        # One entry per distinct learning-rate callable, in table order: index = the dynamic-learning-rate tag.
        # Resolved again from the tables as they now stand (Keras optimizers converted, the global one written
        # in), exactly as `from_feature_config` will resolve them for the config proto.
        self._dynamic_learning_rates = list(resolve_tables(flat_features).learning_rates)
        self._dynamic = self._split_dynamic_tables(flat_features)

        self._built = False
        self._config_proto = None
        self._pending = None

    def _split_dynamic_tables(self, flat_features: list, shard_devices: Any = None) -> Any:
        """Hands the features over `DynamicTableConfig`s to a `dynamic.engine.DynamicGroup`; the static
        machinery (variables, `config_proto`, `lookup`, `send_gradients`, learning-rate tags) then covers only the
        static features. Returns None, changing nothing, when there is no dynamic table."""
        group = dynamic_engine.DynamicGroup.of(flat_features, self._check_numerics, shard_devices)
        if group is not None:
            static = [flat_features[i] for i in group.static_positions]
            self._table_config = [t for t in self._table_config if not dynamic_config.is_dynamic(t)]
            self._dynamic_learning_rates = list(resolve_tables(static).learning_rates)
        return group

    @property
    def static_features(self) -> list:
        """The flattened `FeatureConfig`s over static tables: the features `lookup` and `send_gradients` see."""
        flat = tf.nest.flatten(self._feature_config)
        return flat if self._dynamic is None else [flat[i] for i in self._dynamic.static_positions]

    @property
    def dynamic_group(self) -> Any:
        """The `dynamic.engine.DynamicGroup` running the dynamic tables' features, or None without any."""
        return self._dynamic

    @property
    def dynamic_tables(self) -> dict:
        """`{DynamicTableConfig: DynamicTable}` (a list of shards per table when sharded); empty without any."""
        if self._dynamic is None:
            return {}
        self._maybe_build()
        return self._dynamic.tables

    @property
    def dynamic_step(self) -> Any:
        """The dynamic tables' step counter (int64 variable, advanced by each update), or None without any."""
        if self._dynamic is None:
            return None
        self._maybe_build()
        return self._dynamic.step

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
        shapes = None
        if per_replica_input_shapes is not None and not isinstance(per_replica_input_shapes, int):
            tf.nest.assert_same_structure(
                tf.nest.flatten(per_replica_input_shapes), tf.nest.flatten(self._feature_config)
            )
            shapes = self._output_shapes_from_input_shapes(
                [tf.TensorShape(s) for s in tf.nest.flatten(per_replica_input_shapes)]
            )
        else:
            batch = per_replica_input_shapes if per_replica_input_shapes is not None else per_replica_batch_size
            if batch is not None:
                shapes = [
                    tf.TensorShape([batch, f.max_sequence_length])
                    if not f.output_shape and f.max_sequence_length > 0
                    else tf.TensorShape([batch])
                    for f in tf.nest.flatten(self._feature_config)
                ]
        if shapes is not None:
            self.merge_output_shapes(shapes)
        with tf.init_scope():
            self._variables = self._create_variables_and_slots()
            if self._dynamic is not None:
                self._dynamic.build(self)
        self._built = True

    def _checkpoint_adapter(self, path: str) -> None:
        """TensorFlow's hook before any child is restored: checks every table's checkpoint data, so a refused
        restore changes no table (`_restore_check`). Returns None: no resharding."""
        _restore_check.validate(self, path)
        return None

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
        return tf.Variable(
            name=name,
            initial_value=functools.partial(initializer, shape, dtype=dtype),
            shape=shape,
            dtype=dtype,
            trainable=trainable,
        )

    def _create_variables_and_slots(self) -> dict:
        """Creates {table name: {"parameters": var, <slot>: var}}, tracked as TensorFlow's CPU classes do."""
        variables = {}
        for table in self._table_config:
            shape = (table.vocabulary_size, table.dim)

            def make_getter(_shape, _table=table.name):
                def getter(name, shape, dtype, initializer, trainable):
                    # _add_variable_with_custom_getter may drop the shape; take it from outside, as TF does.
                    del shape
                    try:
                        return self._make_variable(
                            name, _shape, low_precision.storage_initializer(initializer, dtype), trainable, dtype
                        )
                    except ValueError as e:
                        # The initializer is a pending checkpoint value when a restore ran before `build`;
                        # TensorFlow's shape error then names neither the table nor the variable.
                        raise ValueError(
                            f"Table {_table!r}: cannot create variable {name!r} with shape {tuple(_shape)}: {e}"
                        ) from e

                return getter

            def variable_creator(name, initializer, trainable=True, _shape=shape, dtype=tf.float32):
                # _add_variable_with_custom_getter makes each variable a checkpoint child named `name` and
                # restores a pending checkpoint value at creation (no double initialisation).
                return _tf_compat.add_tracked_variable(
                    self,
                    name=name,
                    initializer=initializer,
                    shape=_shape,
                    dtype=dtype,
                    getter=make_getter(_shape),
                    trainable=trainable,
                )

            # Not trainable: the tables are changed only by the fused send op, never by a generic optimizer
            # (the activations op has no gradient to them). The checkpoint keys do not depend on it.
            # 16-bit storage (te.TableConfig): the variables have the storage dtype (docs/low_precision.md).
            parameters = variable_creator(
                table.name, table.initializer, trainable=False, dtype=table_config.storage_dtype(table)
            )
            # Each slot's shape comes from the optimizer schema: the table's, or [vocabulary_size, 1] for a
            # per-row slot (row-wise Adagrad).
            slot_shapes = config_lib.slot_shapes(table.optimizer, table.vocabulary_size, table.dim)

            def slot_creator(
                name, initializer, _table=table, _creator=variable_creator, _shapes=slot_shapes, _shape=shape
            ):
                return _creator(
                    _table.name + "/" + name,
                    initializer,
                    False,
                    _shapes.get(name, _shape),
                    table_config.slot_storage_dtype(_table),
                )

            if table.optimizer is not None:
                # TF's own slot factory: honours slot_variable_creation_fn and the slot initializers.
                slots = _tf_compat.create_slots(table.optimizer, parameters, slot_creator)
                expected = _tf_compat.slot_names(table.optimizer)
                missing = [s for s in expected if s not in slots]
                if missing:
                    raise ValueError(
                        f"slot_variable_creation_fn for table {table.name!r} returned slots {sorted(slots)}; "
                        f"missing {missing} (expected {expected})."
                    )
            else:
                slots = {}
            slots["parameters"] = parameters
            variables[table.name] = slots
        if table_config.needs_rounding_step(self._table_config):
            # The step that keys stochastic rounding's random bits; a checkpoint child, so a resumed run draws
            # the bits it would have drawn without the interruption.
            self._rounding_step = _tf_compat.add_tracked_variable(
                self,
                name="rounding_step",
                initializer=tf.zeros_initializer(),
                shape=(),
                dtype=tf.int64,
                getter=lambda name, shape, dtype, initializer, trainable: self._make_variable(
                    name, (), initializer, False, tf.int64
                ),
                trainable=False,
            )
        return variables

    @property
    def embedding_tables(self) -> dict:
        """A dict of embedding tables, `{TableConfig: tf.Variable}` (builds the object if needed)."""
        self._maybe_build()
        return {table: self._variables[table.name]["parameters"] for table in self._table_config}

    @property
    def slot_variables(self) -> dict:
        """The optimizer slots, `{TableConfig: {slot_name: tf.Variable}}`, slots in Load/Retrieve order."""
        self._maybe_build()
        out = {}
        for table in self._table_config:
            names = _tf_compat.slot_names(table.optimizer) if table.optimizer is not None else []
            out[table] = {name: self._variables[table.name][name] for name in names}
        return out

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
        # The tables already carry their (possibly global) optimizer. A table with none (lookup only, as TF's
        # serving class allows) is described as SGD with learning rate 0; apply_gradients refuses to train it.
        untrained = any(t.optimizer is None for t in self._table_config)
        features, shapes = self._feature_config, self._output_shapes
        if self._dynamic is not None:  # the static features' configuration (the dynamic group has its own)
            features = self.static_features
            shapes = [shapes[i] for i in self._dynamic.static_positions]
            if not features:
                return config_lib.TPUEmbeddingConfiguration()
        proto = config_lib.from_feature_config(
            features,
            optimizer=_tpu_embedding.SGD(learning_rate=0.0) if untrained else None,
            pipeline_execution_with_tensor_core=self._pipeline_execution_with_tensor_core,
            output_shapes=tf.nest.pack_sequence_as(features, [tf.TensorShape(s) for s in shapes]),
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

    def _output_shapes_from_input_shapes(self, input_shapes: list) -> list:
        """TF's rule: a rank-2 non-[B,1] input of a sequence feature gets [B, L]; otherwise drop the last axis."""
        out = []
        for shape, feature in zip(input_shapes, tf.nest.flatten(self._feature_config), strict=False):
            if shape.rank is None or shape.rank < 1:
                raise ValueError(f"Received input tensor of shape {shape}. Rank must be 1 and above.")
            if shape.rank == 2 and shape[-1] != 1 and not feature.output_shape and feature.max_sequence_length > 0:
                shape = tf.TensorShape([shape[0], feature.max_sequence_length, shape[1]])
            out.append(shape if shape.rank == 1 else shape[:-1])
        return out

    def merge_output_shapes(self, incoming: list) -> None:
        """Fills still-unknown output shapes (for `config_proto`); known ones stay, as TF's priority order says.

        Unlike the TPU engine, the CPU kernels accept any batch shape, so a later batch of another size (say the
        last, partial one) is not an error; the configuration keeps describing the first.
        """
        self._output_shapes = [
            old if old.rank is not None and old.rank > 0 else new
            for old, new in zip(self._output_shapes, incoming, strict=False)
        ]

    # ------------------------------------------------------------------ enqueue / dequeue / apply

    def normalize_inputs(self, features: Any, weights: Any) -> tuple[list, list]:
        """Validates and normalises features (and weights) to FeatureInputs in flattened feature order.

        Returns the FeatureInputs and the incoming output shapes (input shape per TF's rule).
        """
        check_feature_keys(self._feature_config, features, "features")
        try:
            tf.nest.assert_same_structure(self._feature_config, features)
        except (ValueError, TypeError) as e:
            raise ValueError(f"Argument `features` must have the structure of `feature_config`: {e}") from e
        flat_features = tf.nest.flatten(features)
        if weights is None:
            flat_weights = [None] * len(flat_features)
        else:
            check_feature_keys(self._feature_config, weights, "weights")
            try:
                tf.nest.assert_same_structure(self._feature_config, weights)
            except (ValueError, TypeError) as e:
                raise ValueError(f"Argument `weights` must have the structure of `feature_config`: {e}") from e
            flat_weights = tf.nest.flatten(weights)

        inputs, shapes = [], []
        paths_and_configs = _flatten_with_paths(self._feature_config)
        for (path, feature), inp, weight in zip(paths_and_configs, flat_features, flat_weights, strict=False):
            if isinstance(inp, (tf.SparseTensor, tf.RaggedTensor)):
                pass
            elif inp is None:
                raise ValueError(f"Feature {path}: got None; every feature needs an input.")
            else:
                inp = tf.convert_to_tensor(inp)
                if weight is not None:
                    # TensorFlow's serving-class wording first (callers match on it), then ours.
                    raise ValueError(
                        f"Weight specified for {path}, but input is dense. Weight will always be 1 in this case."
                    )
            if weight is not None and not isinstance(weight, type(inp)):
                raise ValueError(
                    f"Weight for {path} is of type {type(weight)} but it does not match type of the input which is "
                    f"{type(inp)}. Weights must be of the same kind as the ids."
                )
            rank = inp.shape.rank
            sequence = feature.max_sequence_length > 0 and not feature.output_shape
            output_shape_positions = _output_shape_positions(path, inp, feature)
            if output_shape_positions:
                # TensorFlow ignores weights (and the combiner) of such a sequence lookup; a dense id is a row
                # holding one id.
                max_len, weight = output_shape_positions, None
                if isinstance(inp, tf.Tensor):
                    inp = tf.RaggedTensor.from_tensor(tf.reshape(inp, [-1, 1]))
            elif isinstance(inp, (tf.SparseTensor, tf.RaggedTensor)) and rank == 2 and sequence:
                max_len = feature.max_sequence_length
            else:
                if feature.max_sequence_length > 0 and isinstance(inp, tf.SparseTensor) and (rank or 0) > 2:
                    logging.warning(
                        "Input tensor is rank %d which is above 2, the max_sequence_length setting will be ignored.",
                        rank,
                    )
                max_len = 0
            try:
                if dynamic_config.is_dynamic(feature.table):
                    normalized = dynamic_engine.normalize_dynamic_feature(inp, feature.table, weight, max_len, path)
                else:
                    normalized = embedding_ops.normalize_feature(
                        inp, weights=weight, max_sequence_length=max_len, feature_name=path
                    )
            except ValueError as e:
                raise ValueError(f"Feature {path}: {e}") from e
            inputs.append(normalized)
            shapes.append(self._incoming_output_shape(inp, feature))
        return inputs, shapes

    @staticmethod
    def _incoming_output_shape(inp: Any, feature: Any) -> tf.TensorShape:
        shape = inp.shape
        if shape.rank is None:
            return tf.TensorShape(None)
        dims = shape.as_list()
        sequence = feature.max_sequence_length > 0 and not feature.output_shape
        if not isinstance(inp, tf.Tensor) and len(dims) == 2 and sequence:
            return tf.TensorShape([dims[0], feature.max_sequence_length])
        return tf.TensorShape(dims if len(dims) == 1 else dims[:-1])

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
        self._pending = _Pending(inputs, bool(training), _current_graph())

    def _take_pending(self, what: str) -> _Pending:
        if not self._built:
            raise RuntimeError(
                f"{what} called on unbuilt TPUEmbedding object. Please either call enqueue first or manually "
                "call the build method."
            )
        pending = self._pending
        if pending is None:
            raise RuntimeError(f"{what} called before enqueue: there is no batch of ids to use.")
        if pending.graph is not None and pending.graph is not _current_graph():
            raise RuntimeError(
                f"{what} must run in the same tf.function (or eagerly, in the same context) as the enqueue that "
                "queued its ids; call enqueue again here."
            )
        return pending

    def tables_and_slots(self) -> tuple[list, list]:
        tables = [self._variables[t.name]["parameters"] for t in self._table_config]
        slots = []
        for t in self._table_config:
            names = _tf_compat.slot_names(t.optimizer) if t.optimizer is not None else []
            slots.append([self._variables[t.name][n] for n in names])
        return tables, slots

    def reshape_activations(self, activations: list) -> list:
        """Applies FeatureConfig.output_shape (the op gives input_shape + [dim])."""
        return self._reshape_activations_for(activations, tf.nest.flatten(self._feature_config))

    @staticmethod
    def _reshape_activations_for(activations: list, features: list) -> list:
        out = []
        for act, feature in zip(activations, features, strict=True):
            if feature.output_shape:
                act = tf.reshape(act, feature.output_shape.as_list() + [feature.table.dim])
            out.append(act)
        return out

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
        """
        pending = self._take_pending("apply_gradients")
        if not pending.training:
            raise RuntimeError("apply_gradients called after enqueue(..., training=False): the batch is inference.")
        for table in self._table_config:
            if table.optimizer is None:
                raise RuntimeError(
                    f"Table {table.name!r} has no optimizer (neither TableConfig.optimizer nor the global one); "
                    "it can be looked up but not trained."
                )
        try:
            tf.nest.assert_same_structure(self._feature_config, gradients)
        except (ValueError, TypeError) as e:
            raise ValueError(f"Argument `gradients` must have the structure of `feature_config`: {e}") from e

        with tf.name_scope(name or "tpu_embedding_apply_gradients"):
            # The expected shape is the activation's: recompute it from the op's shape function (cheap, static).
            flat = []
            for (path, gradient), feature, feature_input in zip(
                _flatten_with_paths(gradients), tf.nest.flatten(self._feature_config), pending.inputs, strict=False
            ):
                expected = _activation_shape(feature_input, feature)
                if gradient is None:
                    logging.warning(
                        "No gradient passed for feature %s, sending zero gradient. This may not be correct "
                        "behavior for certain optimizers like Adam.",
                        path,
                    )
                    gradient = tf.zeros(_dynamic_activation_shape(feature_input, feature), tf.float32)
                elif not isinstance(gradient, tf.Tensor):
                    raise ValueError(f"found non-tensor type: {type(gradient)} at path {path}.")
                elif not gradient.shape.is_compatible_with(expected):
                    raise ValueError(
                        f"Found gradient of shape {gradient.shape} at path {path}. Expected shape {expected}."
                    )
                if feature.output_shape:
                    gradient = tf.reshape(gradient, _dynamic_activation_shape(feature_input, None, feature.table.dim))
                flat.append(tf.cast(gradient, tf.float32))
            learning_rates = [tf.cast(fn(), tf.float32) for fn in self._dynamic_learning_rates]
            if self._dynamic is None:
                self.send_gradients(flat, learning_rates, pending.inputs)
            else:
                dynamic_engine.split_send(
                    self._dynamic, flat, pending.inputs, lambda g, i: self.send_gradients(g, learning_rates, i)
                )

    def _lookup_all(self, inputs: list, training: bool, name: str | None = None) -> list:
        """Activations of every feature: `lookup` for the static ones, the dynamic group for the others."""
        if self._dynamic is None:
            return self.lookup(inputs, name=name)
        return dynamic_engine.split_lookup(self._dynamic, inputs, training, lambda i: self.lookup(i, name=name))

    def lookup(self, inputs: list, name: str | None = None) -> list:
        """Runs the forward op over normalised inputs (feature order); overridden by the sharded subclass."""
        tables, _ = self.tables_and_slots()
        return list(
            embedding_ops.embedding_activations(
                inputs, tables, self.serialized_config, combiners=self.combiners, name=name
            )
        )

    def send_gradients(self, gradients: list, learning_rates: list, inputs: list) -> None:
        """Runs the fused backward/optimizer op (gradients in feature order, rates in tag order); overridable."""
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

    def _rounding_step_variable(self) -> tf.Variable | None:
        step = getattr(self, "_rounding_step", None)
        if step is not None and not isinstance(step, tf.Variable):
            step = step.value  # a keras.Variable's backing tf.Variable
        return step

    def rounding_arguments(self) -> dict:
        """The send op's rounding arguments for 16-bit tables (docs/low_precision.md), {} without them: the
        rounding per table and, with stochastic rounding, the current value of the step counter."""
        if not any(table_config.is_low_precision(t) for t in self._table_config):
            return {}
        args = {"rounding": [table_config.rounding(t) for t in self._table_config]}
        step = self._rounding_step_variable()
        if step is not None:
            args["rounding_step"] = step.read_value()
        return args

    def advance_rounding_step(self, updates: list) -> None:
        """Counts one step once `updates` (the send ops of the step; None entries: ran eagerly) have run, so a
        rejected step leaves the counter unchanged."""
        step = self._rounding_step_variable()
        if step is None:
            return
        with tf.control_dependencies([u for u in updates if u is not None]):
            step.assign_add(1)

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
                present, features, weights = self._complete_subset(features, weights)
            inputs, shapes = self.normalize_inputs(features, weights)
            if present is not None:
                # Shapes of the stand-ins must not enter config_proto.
                config_paths = [path for path, _ in _flatten_with_paths(self._feature_config)]
                shapes = [
                    s if p in present else tf.TensorShape(None) for s, p in zip(shapes, config_paths, strict=True)
                ]
            self.merge_output_shapes(shapes)
            self._maybe_build()
            acts = self._lookup_all(inputs, training=False)
            if present is None:
                return tf.nest.pack_sequence_as(self._feature_config, self.reshape_activations(list(acts)))
            # Output in the order (and nest) of `features`, whose leaves need not be in feature order.
            position = {path: i for i, (path, _) in enumerate(_flatten_with_paths(self._feature_config))}
            wanted = [position[path] for path in present]
            flat_config = tf.nest.flatten(self._feature_config)
            reshaped = self._reshape_activations_for([acts[i] for i in wanted], [flat_config[i] for i in wanted])
            return tf.nest.pack_sequence_as(subset, reshaped)

    def _complete_subset(self, features: Any, weights: Any) -> tuple[list, Any, Any]:
        """Maps a nest of some of the features onto `feature_config`, with empty stand-ins for the others.

        The stand-ins (a dense batch of no ids) keep the configuration and table order of the full feature set, so
        the kernels run unchanged; their activations are dropped. Returns (the key paths of `features` in its
        flatten order, the completed features, the completed weights).

        Raises:
          ValueError: if a key path of `features` is not one of `feature_config`'s (TensorFlow's wording), or
            `weights` does not have the structure of `features`.
        """
        flat_inputs = _flatten_with_paths(features)
        if weights is not None:
            try:
                tf.nest.assert_same_structure(features, weights)
            except (ValueError, TypeError) as e:
                raise ValueError(f"Argument `weights` must have the structure of `features`: {e}") from e
            flat_weights = tf.nest.flatten(weights)
        else:
            flat_weights = [None] * len(flat_inputs)
        config_paths = [path for path, _ in _flatten_with_paths(self._feature_config)]
        input_keys = {path for path, _ in flat_inputs}
        if not input_keys.issubset(config_paths):
            unknown = sorted(input_keys - set(config_paths))
            hints = [
                f"{key!r} (did you mean {close[0]!r}?)"
                if (close := difflib.get_close_matches(key, config_paths, n=1))
                else repr(key)
                for key in unknown
            ]
            raise ValueError(
                f"Inputs are not a subset of feature_config. Inputs keys are {input_keys}, but feature_config keys "
                f"are {config_paths}. Unknown keys: {', '.join(hints)}."
            )
        by_path = {path: (inp, w) for (path, inp), w in zip(flat_inputs, flat_weights, strict=True)}
        full_inputs, full_weights = [], []
        for path, feature in zip(config_paths, tf.nest.flatten(self._feature_config), strict=True):
            # A feature with an output_shape needs that many samples to stay a plain lookup (of row 0).
            samples = feature.output_shape.num_elements() if feature.output_shape else 0
            key_dtype = getattr(feature.table, "key_dtype", tf.int64)  # a string-keyed dynamic table: string ids
            inp, w = by_path.get(path, (tf.zeros([samples], key_dtype), None))
            full_inputs.append(inp)
            full_weights.append(w)
        present = [path for path, _ in flat_inputs]
        return (
            present,
            tf.nest.pack_sequence_as(self._feature_config, full_inputs),
            tf.nest.pack_sequence_as(self._feature_config, full_weights),
        )


def check_feature_keys(feature_config: Any, given: Any, argument: str) -> None:
    """Names the missing and unexpected keys of a feature dict, and the expected ones.

    TensorFlow's structure check would print both nests in full without saying which key differs; a misspelled
    feature name is the common case, so this runs first (other structure mismatches still reach that check).
    """
    missing, unexpected = [], []

    def compare(expected: Any, got: Any, prefix: str) -> None:
        if not (isinstance(expected, Mapping) and isinstance(got, Mapping)):
            return
        missing.extend(prefix + str(k) for k in expected if k not in got)
        unexpected.extend(prefix + str(k) for k in got if k not in expected)
        for k in expected:
            if k in got:
                compare(expected[k], got[k], f"{prefix}{k}/")

    compare(feature_config, given, "")
    if not missing and not unexpected:
        return
    expected_paths = [path for path, _ in _flatten_with_paths(feature_config)]
    parts = []
    if missing:
        parts.append("missing " + ", ".join(repr(k) for k in sorted(missing)))
    for key in sorted(unexpected):
        close = difflib.get_close_matches(key, missing, n=1)  # a misspelling stands in for a missing key
        parts.append(f"unexpected {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ValueError(
        f"Argument `{argument}` does not have the structure of `feature_config`: {'; '.join(parts)}. "
        f"Expected keys: {', '.join(repr(p) for p in expected_paths)}."
    )


def _flatten_with_paths(structure: Any) -> list:
    """[(path, leaf)] in nest.flatten order, the path's keys joined with '/' as TensorFlow reports them."""
    paths = _tf_compat.yield_flat_paths(structure)
    leaves = tf.nest.flatten(structure)
    return [("/".join(str(k) for k in path), leaf) for path, leaf in zip(paths, leaves, strict=False)]


def _output_shape_positions(path: str, inp: Any, feature: Any) -> int:
    """The sequence length a `FeatureConfig.output_shape` implies for this input, or 0 for a plain lookup.

    TensorFlow's rule: with B samples and P = prod(output_shape), P == B is a plain lookup reshaped to
    `output_shape + [dim]`; P a larger multiple of B makes the feature a sequence of P / B positions (ids padded
    or truncated per sample, no combiner, no weights); anything else is a ValueError at lookup time. Only inputs
    with one sample axis (dense [B] or [B, 1], rank-2 sparse or ragged) can be sequences. When B is not known
    statically the lookup is plain and the reshape checks P == B when it runs.
    """
    if not feature.output_shape:
        return 0
    shape = inp.shape
    if shape.rank is None:
        return 0
    dims = shape.as_list()
    sample_dims = dims if isinstance(inp, tf.Tensor) and (len(dims) == 1 or dims[-1] != 1) else dims[:-1]
    if any(d is None for d in sample_dims):
        return 0
    samples = functools.reduce(lambda a, b: a * b, sample_dims, 1)
    product = functools.reduce(lambda a, b: a * b, feature.output_shape.as_list(), 1)
    if product == samples:
        return 0
    one_sample_axis = len(sample_dims) == 1 and not (isinstance(inp, tf.Tensor) and len(dims) == 2 and dims[1] != 1)
    if samples > 0 and product > samples and product % samples == 0 and one_sample_axis:
        return product // samples
    raise ValueError(
        "Output shape set in the FeatureConfig should be the factor of the input data batch size. But instead got "
        f"output shape {feature.output_shape}, input data batch size {samples} (feature {path}: the product of "
        "output_shape must equal the number of samples, or be a larger multiple of it for a sequence lookup)."
    )


def _activation_shape(feature_input: Any, feature: Any) -> tf.TensorShape:
    """Static activation shape: sample_shape + [dim], or output_shape + [dim]."""
    dim = feature.table.dim
    if feature.output_shape:
        return tf.TensorShape(feature.output_shape.as_list() + [dim])
    sample_shape = feature_input.sample_shape
    static = tf.get_static_value(sample_shape) if isinstance(sample_shape, tf.Tensor) else sample_shape
    if static is None:
        rank = sample_shape.shape[0] if isinstance(sample_shape, tf.Tensor) else None
        return tf.TensorShape(None if rank is None else [None] * int(rank) + [dim])
    return tf.TensorShape([int(x) for x in static] + [dim])


def _dynamic_activation_shape(feature_input: Any, feature: Any, dim: int | None = None) -> Any:
    if feature is not None and feature.output_shape:
        return feature.output_shape.as_list() + [feature.table.dim]
    dim = dim if dim is not None else feature.table.dim
    sample_shape = tf.cast(feature_input.sample_shape, tf.int32)
    return tf.concat([sample_shape, [dim]], axis=0)
