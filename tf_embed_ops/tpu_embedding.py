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
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import tensorflow as tf
from absl import logging

from tf_embed_ops import config as config_lib
from tf_embed_ops import embedding_ops

__all__ = ["TPUEmbedding"]

_tpu_embedding = tf.tpu.experimental.embedding


def _supported_optimizers() -> tuple[type, ...]:
    # Every optimizer class the config loader maps into the proto: TensorFlow's five and tf_embed_ops.optimizers
    # (CustomOptimizer aside: a SparseCore program with no Load/Retrieve op and no CPU meaning).
    return config_lib.supported_optimizer_classes()


class _Pending(NamedTuple):
    """What `enqueue` leaves for `dequeue` and `apply_gradients` (the TPU engine keeps this hidden)."""

    inputs: list  # list[embedding_ops.FeatureInput], in feature order
    training: bool
    graph: Any  # the graph the tensors live in (None when eager)


def _current_graph():
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


class TPUEmbedding(tf.__internal__.tracking.AutoTrackable):
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
    ):
        """Creates the mid-level API object; variables are created by `build` (or the first `enqueue`).

        Args:
          feature_config: a nested structure (dict, list, tuple, or a single one) of
            `tf.tpu.experimental.embedding.FeatureConfig`.
          optimizer: the default optimizer for tables whose `TableConfig.optimizer` is None: one of
            `tf.tpu.experimental.embedding.{SGD, Adagrad, AdagradMomentum, Adam, FTRL}`, a
            `tf_embed_ops.optimizers` class (Momentum, RMSProp, ... Assign), or None (then tables
            without their own optimizer get no slots and cannot be trained, as in TensorFlow's serving class).
          pipeline_execution_with_tensor_core: written to the configuration as TensorFlow does. On CPU the
            lookup never overlaps the update, so activations are never stale (the result equals False).

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
        self._output_shapes = [tf.TensorShape(f.output_shape) for f in flat_features]

        # Table order: first appearance in nest.flatten(feature_config), by identity (TF compares with `in`,
        # and TableConfig has no __eq__, so identity it is).
        self._table_config = []
        for feature in flat_features:
            if not any(feature.table is t for t in self._table_config):
                self._table_config.append(feature.table)

        names = []
        for i, table in enumerate(self._table_config):
            if table.optimizer is None:
                # TensorFlow writes the global optimizer into the TableConfig itself; so do we (same objects,
                # same config proto from tf_embed_ops.config.from_feature_config).
                table.optimizer = optimizer
            if table.optimizer is not None and not isinstance(table.optimizer, _supported_optimizers()):
                raise ValueError(
                    f"{type(table.optimizer)} is an unsupported optimizer class (table {table.name or i!r}). "
                    "Please pass an instance of tf.tpu.experimental.embedding.SGD, Adagrad, AdagradMomentum, "
                    "Adam or FTRL, or of a tf_embed_ops.optimizers class."
                )
            if not isinstance(table.combiner, str):
                raise ValueError(
                    f"Table {table.name or i!r} uses combiner {table.combiner!r}; only 'sum', 'mean' and 'sqrtn' "
                    "are supported off SparseCore."
                )
            if table.name is None:
                table.name = f"table_{i}"
            if table.name in names:
                raise ValueError(f"Tables must have a unique name. Multiple tables with name {table.name} found.")
            names.append(table.name)

        # One entry per distinct learning-rate callable, in table order: the dynamic-learning-rate tags.
        self._dynamic_learning_rates = []
        for table in self._table_config:
            lr = table.optimizer.learning_rate if table.optimizer is not None else None
            if callable(lr) and lr not in self._dynamic_learning_rates:
                self._dynamic_learning_rates.append(lr)

        self._built = False
        self._config_proto = None
        self._pending = None

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
            self._merge_output_shapes(shapes)
        with tf.init_scope():
            self._variables = self._create_variables_and_slots()
        self._built = True

    def _maybe_build(self) -> None:
        if not self._built:
            # May run while tracing a function: init_scope creates the variables eagerly, once.
            with tf.init_scope():
                self.build()

    def _make_variable(self, name: str, shape: tuple, initializer: Callable, trainable: bool):
        """Creates one variable; the Keras layer overrides this to create `keras.Variable`s instead."""
        return tf.Variable(
            name=name,
            initial_value=functools.partial(initializer, shape, dtype=tf.float32),
            shape=shape,
            dtype=tf.float32,
            trainable=trainable,
        )

    def _create_variables_and_slots(self) -> dict:
        """Creates {table name: {"parameters": var, <slot>: var}}, tracked as TensorFlow's CPU classes do."""
        variables = {}
        for table in self._table_config:
            shape = (table.vocabulary_size, table.dim)

            def getter(name, shape, dtype, initializer, trainable, _shape=shape):
                # _add_variable_with_custom_getter may drop the shape; take it from outside, as TF does.
                del shape, dtype
                return self._make_variable(name, _shape, initializer, trainable)

            def variable_creator(name, initializer, trainable=True, _shape=shape, _getter=getter):
                # _add_variable_with_custom_getter makes each variable a checkpoint child named `name` and
                # restores a pending checkpoint value at creation (no double initialisation).
                return self._add_variable_with_custom_getter(
                    name=name,
                    initializer=initializer,
                    shape=_shape,
                    dtype=tf.float32,
                    getter=_getter,
                    trainable=trainable,
                )

            # Not trainable: the tables are changed only by the fused send op, never by a generic optimizer
            # (the activations op has no gradient to them). The checkpoint keys do not depend on it.
            parameters = variable_creator(table.name, table.initializer, trainable=False)

            def slot_creator(name, initializer, _table=table, _creator=variable_creator):
                return _creator(_table.name + "/" + name, initializer, False)

            if table.optimizer is not None:
                # TF's own slot factory: honours slot_variable_creation_fn and the slot initializers.
                slots = dict(table.optimizer._create_slots(parameters, slot_creator))  # noqa: SLF001
                expected = list(table.optimizer._slot_names())  # noqa: SLF001
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
            names = table.optimizer._slot_names() if table.optimizer is not None else []  # noqa: SLF001
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
        proto = config_lib.from_feature_config(
            self._feature_config,
            optimizer=_tpu_embedding.SGD(learning_rate=0.0) if untrained else None,
            pipeline_execution_with_tensor_core=self._pipeline_execution_with_tensor_core,
            output_shapes=tf.nest.pack_sequence_as(
                self._feature_config, [tf.TensorShape(s) for s in self._output_shapes]
            ),
        )
        # input_shape is written only once every shape is known (TF fixes them at build); until then the proto
        # is recomputed. The kernels take the batch shape from their inputs, never from here.
        if all(s.is_fully_defined() for s in self._output_shapes):
            self._config_proto = proto
        return proto

    @property
    def _serialized_config(self) -> bytes:
        return self.config_proto.SerializeToString()

    @property
    def _combiners(self) -> list:
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

    def _merge_output_shapes(self, incoming: list) -> None:
        """Fills still-unknown output shapes (for `config_proto`); known ones stay, as TF's priority order says.

        Unlike the TPU engine, the CPU kernels accept any batch shape, so a later batch of another size (say the
        last, partial one) is not an error; the configuration keeps describing the first.
        """
        self._output_shapes = [
            old if old.rank is not None and old.rank > 0 else new
            for old, new in zip(self._output_shapes, incoming, strict=False)
        ]

    # ------------------------------------------------------------------ enqueue / dequeue / apply

    def _normalize_inputs(self, features: Any, weights: Any) -> tuple[list, list]:
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
                    raise ValueError(
                        f"Weight specified for dense input {path}, which is not allowed. Weight will always be 1 "
                        "in this case."
                    )
            if weight is not None and not isinstance(weight, type(inp)):
                raise ValueError(
                    f"Weight for {path} is type {type(weight).__name__} which does not match type input which is "
                    f"{type(inp).__name__}."
                )
            rank = inp.shape.rank
            sequence = feature.max_sequence_length > 0 and not feature.output_shape
            if isinstance(inp, (tf.SparseTensor, tf.RaggedTensor)) and rank == 2 and sequence:
                max_len = feature.max_sequence_length
            else:
                if feature.max_sequence_length > 0 and isinstance(inp, tf.SparseTensor) and (rank or 0) > 2:
                    logging.warning(
                        "Input tensor is rank %d which is above 2, the max_sequence_length setting will be ignored.",
                        rank,
                    )
                max_len = 0
            try:
                normalized = embedding_ops.normalize_feature(inp, weights=weight, max_sequence_length=max_len)
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
            inputs, shapes = self._normalize_inputs(features, weights)
        self._merge_output_shapes(shapes)
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

    def _tables_and_slots(self) -> tuple[list, list]:
        tables = [self._variables[t.name]["parameters"] for t in self._table_config]
        slots = []
        for t in self._table_config:
            names = t.optimizer._slot_names() if t.optimizer is not None else []  # noqa: SLF001
            slots.append([self._variables[t.name][n] for n in names])
        return tables, slots

    def _reshape_activations(self, activations: list) -> list:
        """Applies FeatureConfig.output_shape (the op gives input_shape + [dim])."""
        out = []
        for act, feature in zip(activations, tf.nest.flatten(self._feature_config), strict=False):
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
        acts = self._lookup(pending.inputs, name=name)
        return tf.nest.pack_sequence_as(self._feature_config, self._reshape_activations(list(acts)))

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
            self._send_gradients(flat, learning_rates, pending.inputs)

    def _lookup(self, inputs: list, name: str | None = None) -> list:
        """Runs the forward op over normalised inputs (feature order); overridden by the sharded subclass."""
        tables, _ = self._tables_and_slots()
        return list(
            embedding_ops.embedding_activations(
                inputs, tables, self._serialized_config, combiners=self._combiners, name=name
            )
        )

    def _send_gradients(self, gradients: list, learning_rates: list, inputs: list) -> None:
        """Runs the fused backward/optimizer op (gradients in feature order, rates in tag order); overridable."""
        tables, slots = self._tables_and_slots()
        embedding_ops.send_tpu_embedding_gradients(
            gradients, learning_rates, inputs, tables, slots, self._serialized_config, combiners=self._combiners
        )

    def __call__(self, features: Any, weights: Any = None) -> Any:
        """Lookup only (no queue, no training): activations for `features`, as `dequeue` would give them."""
        return self.embedding_lookup(features, weights)

    def embedding_lookup(self, features: Any, weights: Any = None) -> Any:
        """Same as `__call__`."""
        with tf.name_scope("tpu_embedding_lookup"):
            inputs, shapes = self._normalize_inputs(features, weights)
            self._merge_output_shapes(shapes)
            self._maybe_build()
            acts = self._lookup(inputs)
            return tf.nest.pack_sequence_as(self._feature_config, self._reshape_activations(list(acts)))


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
    paths = tf.__internal__.nest.yield_flat_paths(structure)
    leaves = tf.nest.flatten(structure)
    return [("/".join(str(k) for k in path), leaf) for path, leaf in zip(paths, leaves, strict=False)]


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
