"""`tf_embed_ops.keras.TPUEmbedding`: a Keras 3 layer whose tables train with their TPU optimizers in `fit`.

The tables and slots are non-trainable `keras.Variable`s (so the Keras optimizer never touches them, and
`model.save`/`load_model`/`tf.train.Checkpoint` handle them like any weight). In training mode the lookup goes
through a custom gradient whose backward pass runs the fused `SendTPUEmbeddingGradients` op. Keras' train step
differentiates only with respect to trainable weights, so the layer owns one trainable scalar, the *update
trigger*: the lookup is a function of it, its gradient is the (zero) output of the backward pass, and that zero
depends on the fused update op. The update is therefore on the data path of the gradient Keras applies, not a
side effect graph optimisation could prune (the dummy-variable technique of TensorFlow's TPUEstimator era).

Example:
    >>> table = tf.tpu.experimental.embedding.TableConfig(1000, 8, name="user")
    >>> layer = TPUEmbedding({"user": tf.tpu.experimental.embedding.FeatureConfig(table)},
    ...                      tf.tpu.experimental.embedding.Adagrad(0.1))
    >>> acts = layer({"user": tf.constant([3, 7])})   # {"user": [2, 8]}
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tf_embed_ops import _xla
from tf_embed_ops import config as config_lib
from tf_embed_ops import features as features_lib
from tf_embed_ops import tpu_embedding as mid_level
from tf_embed_ops.backends import walk
from tf_embed_ops.keras import export_context, optimizer_mapping, serialization

__all__ = ["TPUEmbedding"]


class _KerasTableStore(mid_level.TPUEmbedding):
    """The mid-level object with `keras.Variable` tables, created through the owning layer's `add_weight`.

    Checkpoint structure below the layer is TensorFlow's (`_tpu_embedding/<table>`, `_tpu_embedding/<table>/<slot>`,
    as TensorFlow Recommenders' TPUEmbedding layer writes it).
    """

    def __init__(self, add_weight: Any, feature_config: Any, optimizer: Any, pipeline: bool, check_numerics: bool):
        super().__init__(feature_config, optimizer, pipeline, check_numerics=check_numerics)
        self._add_weight = add_weight

    def _make_variable(self, name: str, shape: tuple, initializer: Any, trainable: bool, dtype: Any = tf.float32):
        # keras.Variable names may not contain "/"; the checkpoint name (given to the tracker) keeps it.
        return self._add_weight(
            name=name.replace("/", "."),
            shape=shape,
            initializer=initializer,
            dtype=tf.as_dtype(dtype).name,  # the storage dtype (te.TableConfig)
            trainable=trainable,
            autocast=False,
        )

    def _create_variables_and_slots(self) -> dict:
        variables = super()._create_variables_and_slots()
        for table, slots in variables.items():
            for slot, var in slots.items():
                if not isinstance(var, keras.Variable):
                    raise ValueError(
                        f"Table {table!r} slot {slot!r}: slot_variable_creation_fn returned {type(var).__name__}; "
                        "inside the Keras layer it must return keras.Variable objects (or leave it unset)."
                    )
        return variables

    def tables_and_slots(self) -> tuple[list, list]:
        tables, slots = super().tables_and_slots()
        # keras.Variable.value is the backing tf.Variable (autocast is off), whose handle the kernels take.
        return [t.value for t in tables], [[s.value for s in per_table] for per_table in slots]


def activation_specs(features: Any, feature_config: Any) -> Any:
    """Symbolic activations (`keras.KerasTensor`s) for symbolic `features`, without tracing any op.

    `input_shape + [dim]` with a trailing 1 of dense inputs reduced, `[B, L, dim]` for rank-2 ragged/sparse
    sequence features, `output_shape + [dim]` when the FeatureConfig sets one.
    """
    features_lib.check_feature_keys(feature_config, features, "features")  # a functional model's misspelled input
    outputs = []
    for x, f in zip(tf.nest.flatten(features), tf.nest.flatten(feature_config), strict=False):
        composite = getattr(x, "sparse", False) or getattr(x, "ragged", False)
        outputs.append(keras.KerasTensor(features_lib.activation_shape(x.shape, f, composite), dtype="float32"))
    return tf.nest.pack_sequence_as(feature_config, outputs)


def layer_activations(store: Any, inputs: list, trigger: Any, training: bool | None) -> Any:
    """A layer's output from its table store (a `te.TPUEmbedding`): the activations of normalised `inputs` as the
    feature nest. In training the lookup hangs the tables' fused update on the gradient of `trigger` (the layer's
    update-trigger variable); otherwise it only looks up."""
    if training:
        acts = store.lookup_and_update_all(inputs, tf.convert_to_tensor(trigger.value))
    else:
        acts = store.lookup_all(inputs, training=False)
    return tf.nest.pack_sequence_as(store.feature_config, store.reshape_activations(list(acts)))


def untrained_table_names(feature_config: Any, optimizer: Any) -> list[str]:
    """The tables of `feature_config` that would have no optimizer: neither their own nor `optimizer`."""
    resolved = config_lib.resolve_tables(features_lib.check_feature_configs(feature_config), optimizer)
    return [name for name, o in zip(resolved.names, resolved.optimizers, strict=True) if o is None]


def apply_frozen_tables(feature_config: Any, optimizer: Any, frozen_tables: Any) -> tuple[tuple[str, ...], Any]:
    """Checks `frozen_tables` against the tables' optimizers; returns (the frozen names, the optimizer to give the
    table store).

    A table with no optimizer is refused unless it is frozen (named in `frozen_tables`: looked up, never trained).
    With a default `optimizer` and frozen tables, the default is written into every other table without its own
    (as TensorFlow writes it) and the store gets none, so the frozen tables stay without one. Nothing is written
    before every check has passed.
    """
    if frozen_tables is None:
        frozen: tuple[str, ...] = ()
    elif isinstance(frozen_tables, str) or not all(isinstance(n, str) for n in frozen_tables):
        raise ValueError(f"frozen_tables: expected a list of table names; got {frozen_tables!r}")
    else:
        frozen = tuple(dict.fromkeys(frozen_tables))
    resolved = config_lib.resolve_tables(features_lib.check_feature_configs(feature_config), optimizer)
    names = list(resolved.names)
    for name in frozen:
        if name not in names:
            raise ValueError(f"frozen_tables: unknown table {name!r}; the layer's tables are {names}")
    for table, name in zip(resolved.tables, names, strict=True):
        if name in frozen and table.optimizer is not None:
            raise ValueError(
                f"frozen_tables: table {name!r} has its own optimizer ({type(table.optimizer).__name__}), so it would "
                "be trained; a frozen table is never trained: remove its optimizer or the name from frozen_tables"
            )
        if name not in frozen and table.optimizer is None and optimizer is None:
            raise ValueError(
                f"Table {name!r} has no optimizer (neither its TableConfig.optimizer nor the layer's `optimizer`), so "
                "model.fit would never train it. Give it an optimizer (or the layer a default one), or, if it is "
                f"meant to keep the values it has (looked up, never trained), say so: frozen_tables=[{name!r}]."
            )
    if frozen and optimizer is not None:
        for table, name in zip(resolved.tables, names, strict=True):
            if name not in frozen and table.optimizer is None:
                table.optimizer = optimizer
        optimizer = None
    return frozen, optimizer


@keras.saving.register_keras_serializable(package="tf_embed_ops")
class TPUEmbedding(keras.layers.Layer):
    """Embedding lookups for a nest of `FeatureConfig`s, trained by the tables' TPU optimizers in `model.fit`.

    Takes the same `feature_config`/`optimizer` as `tf.tpu.experimental.embedding.TPUEmbedding` (and
    TensorFlow Recommenders' layer). `call(features, weights=None)` returns activations in the nest of
    `feature_config`: `[B, dim]` per feature, `[B, max_sequence_length, dim]` for sequence features. In
    training mode the backward pass updates the touched table rows with each table's optimizer; the model's
    Keras optimizer updates the rest of the model and never the tables.

    Example:
        >>> emb = TPUEmbedding(feature_config, tf.tpu.experimental.embedding.Adagrad(0.05))
        >>> inputs = {"user": keras.Input(shape=(), dtype="int64"), ...}
        >>> acts = emb(inputs)
        >>> model = keras.Model(inputs, keras.layers.Dense(1)(acts["user"]))
        >>> model.compile("adam", "binary_crossentropy"); model.fit(dataset)
    """

    def __init__(
        self,
        feature_config: Any,
        optimizer: Any = None,
        pipeline_execution_with_tensor_core: bool = False,
        check_numerics: bool = False,
        frozen_tables: Any = None,
        **kwargs: Any,
    ):
        """Creates the layer and its tables/slots.

        Args:
          feature_config: nest of `tf.tpu.experimental.embedding.FeatureConfig` (or its `get_config` dict form).
          optimizer: default table optimizer (`tf.tpu.experimental.embedding.{SGD, Adagrad, AdagradMomentum,
            Adam, FTRL}` or a `tf_embed_ops.optimizers` class), or its dict form; tables with their own
            optimizer keep it.
          pipeline_execution_with_tensor_core: recorded in the configuration; no numeric effect on CPU.
          check_numerics: if True, a training step whose activation gradients hold NaN or +-inf fails with an
            `InvalidArgumentError` naming the feature and table, and no table or slot changes. By default such
            gradients are applied, as the TPU applies them.
          frozen_tables: names of the tables that are looked up but never trained (pretrained or restored values):
            they have no optimizer (not even the default `optimizer`) and no slots. Every other table must have an
            optimizer, its own or the default one.
          **kwargs: `keras.layers.Layer` arguments (name, ...).

        Raises:
          ValueError: as `tf_embed_ops.TPUEmbedding`; a table without an optimizer that `frozen_tables` does not name
            (it would silently never train), a `frozen_tables` name that is not a table or names a table with its
            own optimizer; or if a slot_variable_creation_fn returns non-keras variables.
        """
        super().__init__(**kwargs)
        if isinstance(feature_config, dict) and "tables" in feature_config and "structure" in feature_config:
            feature_config = serialization.feature_config_from_dict(feature_config)
        if isinstance(optimizer, dict):
            optimizer = serialization.optimizer_from_dict(optimizer)
        default_optimizer = optimizer
        self._frozen_tables, optimizer = apply_frozen_tables(feature_config, optimizer, frozen_tables)
        # Custom ops: no XLA. Inputs pass through untouched (ids stay integers, Sparse/Ragged stay composite).
        self.supports_jit = False
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        self._global_optimizer = default_optimizer
        self._pipeline = bool(pipeline_execution_with_tensor_core)
        self._check_numerics = bool(check_numerics)
        self._tpu_embedding = _KerasTableStore(
            self.add_weight, feature_config, optimizer, self._pipeline, self._check_numerics
        )
        self._tpu_embedding.build()
        # A Keras default optimizer was converted per table (errors name the table); get_config saves its TPU form.
        self._global_optimizer = optimizer_mapping.to_table_optimizer(default_optimizer, "(the default optimizer)")
        self._update_trigger = self.add_weight(
            name="table_update_trigger", shape=(), initializer="zeros", dtype="float32", trainable=True, autocast=False
        )
        # A Keras schedule steps on its optimizer's iterations: saved with the weights, it resumes after loading.
        for rate in self._tpu_embedding.dynamic_learning_rates:
            if isinstance(rate, optimizer_mapping.KerasLearningRate):
                self._track_variable(rate.optimizer.iterations)
        self.built = True

    @property
    def feature_config(self) -> Any:
        return self._tpu_embedding.feature_config

    @property
    def embedding(self) -> mid_level.TPUEmbedding:
        """The layer's mid-level object (its `keras.Variable` tables, its table groups), as the sharded layer's."""
        return self._tpu_embedding

    @property
    def embedding_tables(self) -> dict:
        """`{TableConfig: keras.Variable}`."""
        return self._tpu_embedding.embedding_tables

    @property
    def slot_variables(self) -> dict:
        """`{TableConfig: {slot_name: keras.Variable}}`, slots in Load/Retrieve order."""
        return self._tpu_embedding.slot_variables

    @property
    def dynamic_tables(self) -> dict:
        """`{DynamicTableConfig: DynamicTable}` (docs/dynamic_tables.md); empty without dynamic tables."""
        return self._tpu_embedding.dynamic_tables

    @property
    def tiered_tables(self) -> dict:
        """`{TableConfig: te.tiered.TieredTable}` of the tables with `storage=te.Tiered` (docs/tiered_tables.md);
        empty without any."""
        return self._tpu_embedding.tiered_tables

    @property
    def config_proto(self):
        """The `TPUEmbeddingConfiguration` the kernels run (no `input_shape`: Keras batches vary)."""
        return self._tpu_embedding.config_proto

    def build(self, input_shape: Any = None) -> None:  # variables exist from __init__
        self.built = True

    def call(self, features: Any, weights: Any = None, training: bool | None = None) -> Any:
        store = self._tpu_embedding
        groups = store.groups
        if _xla.in_xla_context():
            if training:
                raise _xla.training_refused(f"Layer {self.name!r} ({type(self).__name__})")
            refusals = walk.xla_refusals(groups)
            if refusals:
                raise ValueError(
                    f"Layer {self.name!r} ({type(self).__name__}): {'; '.join(refusals)}. Call the layer outside "
                    "jit_compile."
                )
        inputs, _ = store.normalize_inputs(features, weights)
        # An export tracing this call hands it its context (attached to the traced graph): serve without custom ops.
        context = export_context.current()
        if context is not None:
            acts = walk.lookup([group.serving_group(context) for group in groups], inputs, False)
            return tf.nest.pack_sequence_as(store.feature_config, store.reshape_activations(list(acts)))
        # In training the fused update hangs on the trigger's gradient (see the module docstring): one group's own, or
        # one update of every group as `te.TPUEmbedding.apply_gradients` runs it (every group's checks before any
        # group writes, so a step one refuses changes no table).
        return layer_activations(store, inputs, self._update_trigger, training)

    def compute_output_spec(self, features: Any, weights: Any = None, training: bool | None = None) -> Any:
        return activation_specs(features, self.feature_config)

    # `model.save` / `keras.models.load_model` save a layer's keras.Variables by index; tables that are resources
    # (dynamic, tiered) are stored beside them by their groups, each under its kind's key prefix
    # (`TableGroup.save_keras_weights`: `dynamic.<table>.`, `tiered.<table>.`). Every entry of every group is
    # checked before any table is written.
    def save_own_variables(self, store: Any) -> None:
        super().save_own_variables(store)
        for group in self._tpu_embedding.groups:
            group.save_keras_weights(store)

    def load_own_variables(self, store: Any) -> None:
        writes = [write for group in self._tpu_embedding.groups for write in group.check_keras_weights(store)]
        for write in writes:
            write()
        # Every kind's entries, the layer's kinds or not (a store saved with tiered tables, loaded without them):
        # Keras loads the rest by index.
        kinds = self._tpu_embedding.table_kinds()
        prefixes = tuple(kind.keras_weights_prefix for kind in kinds if kind.keras_weights_prefix is not None)
        super().load_own_variables({k: store[k] for k in store.keys() if not str(k).startswith(prefixes)})

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "feature_config": serialization.feature_config_to_dict(self.feature_config),
                "optimizer": serialization.optimizer_to_dict(self._global_optimizer),
                "pipeline_execution_with_tensor_core": self._pipeline,
                "check_numerics": self._check_numerics,
                "frozen_tables": list(self._frozen_tables),
            }
        )
        return config

    @classmethod
    def from_config(cls, config: dict) -> TPUEmbedding:
        config = dict(config)
        if "frozen_tables" not in config:
            # Saved before `frozen_tables` existed, when a table without an optimizer was silently never trained:
            # it stays so (frozen), rather than the saved model failing to load.
            features = serialization.feature_config_from_dict(config["feature_config"])
            optimizer = serialization.optimizer_from_dict(config.get("optimizer"))
            config.update(feature_config=features, frozen_tables=untrained_table_names(features, optimizer))
        return cls(**config)
