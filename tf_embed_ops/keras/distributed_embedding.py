"""`tf_embed_ops.keras.DistributedEmbedding`: keras-rs's `DistributedEmbedding`, its tables trained by their optimizers.

keras-rs 0.4.0 trains each table with its own optimizer only on TPU SparseCore; elsewhere its layer is a set of
plain `Embedding`s trained densely by the model's optimizer. This layer takes the same arguments
(`feature_configs`, a nest of `keras_rs.layers.FeatureConfig` or of our `FeatureConfig`, and `table_stacking`)
and the same call (`inputs`, `weights=None`, `training`), and is the Keras `TPUEmbedding` layer underneath: every
table is updated by its own optimizer through the fused ops inside `model.fit`. Switching is one import.

Inputs per feature: dense `(batch,)` or `(batch, n)`, or ragged / sparse `(batch, None)`; rows longer than the
declared `input_shape[1]` are truncated to it. A dense `(batch,)` input is one id per sample also for a feature
declared `(batch, n)` (as keras-rs reads it). Outputs are `(batch, embedding_dim)`, combined by the table's
combiner, as keras-rs computes them off SparseCore.

Example:
    >>> table = keras_rs.layers.TableConfig(name="item", vocabulary_size=1000, embedding_dim=16)
    >>> feature = keras_rs.layers.FeatureConfig(name="item", table=table, input_shape=(64,), output_shape=(64, 16))
    >>> layer = DistributedEmbedding({"item": feature})
    >>> acts = layer({"item": ids})   # {"item": [64, 16]}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tf_embed_ops import _xla
from tf_embed_ops.keras import distributed_embedding_config as de_config
from tf_embed_ops.keras import layer as layer_lib
from tf_embed_ops.keras import optimizer_mapping

__all__ = ["DistributedEmbedding"]

_emb = tf.tpu.experimental.embedding
_COMBINERS = ("mean", "sum", "sqrtn")
# "auto" and "default_device" both mean "the device the model runs on" off SparseCore.
_PLACEMENTS = ("auto", "default_device")


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive integer; got {value!r}.")
    return value


def _to_tpu_table(table: Any, frozen: Sequence[str] = ()) -> Any:
    """A keras-rs (or our) TableConfig -> `tf.tpu.experimental.embedding.TableConfig`, validated (`frozen`: the
    names of the tables that may have no optimizer)."""
    name = table.name
    if not isinstance(name, str) or not name:
        raise ValueError(f"TableConfig.name must be a non-empty string; got {name!r}.")
    what = f"Table {name!r}:"
    _positive_int(table.vocabulary_size, f"{what} vocabulary_size")
    _positive_int(table.embedding_dim, f"{what} embedding_dim")
    _positive_int(table.max_ids_per_partition, f"{what} max_ids_per_partition")
    _positive_int(table.max_unique_ids_per_partition, f"{what} max_unique_ids_per_partition")
    if table.combiner not in _COMBINERS:
        raise ValueError(f"{what} combiner {table.combiner!r} is not one of {list(_COMBINERS)}.")
    if table.placement == "sparsecore":
        raise ValueError(
            f"{what} placement 'sparsecore' asks for SparseCore, which this CPU layer does not have; use "
            "'auto' or 'default_device' (the tables still train with their own optimizers here)."
        )
    if table.placement not in _PLACEMENTS:
        raise ValueError(f"{what} placement {table.placement!r} is not one of {list(_PLACEMENTS) + ['sparsecore']}.")
    if table.optimizer is None and name not in frozen:
        raise ValueError(
            f"{what} optimizer is None, so model.fit would never train it; give it an optimizer, or, if it is meant "
            f"to keep the values it has (looked up, never trained), say so: frozen_tables=[{name!r}]."
        )
    initializer = table.initializer
    if isinstance(initializer, str):
        initializer = keras.initializers.get(initializer)
    return _emb.TableConfig(
        vocabulary_size=table.vocabulary_size,
        dim=table.embedding_dim,
        initializer=initializer,
        optimizer=None if table.optimizer is None else optimizer_mapping.to_table_optimizer(table.optimizer, name),
        combiner=table.combiner,
        name=name,
    )


def _check_feature(feature: Any) -> None:
    what = f"Feature {feature.name!r}:"
    input_shape, output_shape = tuple(feature.input_shape), tuple(feature.output_shape)
    if len(input_shape) not in (1, 2):
        raise ValueError(
            f"{what} input_shape {input_shape} must be (batch,) or (batch, max_ids): one embedding per sample "
            "after combining, as keras-rs computes off SparseCore."
        )
    dim = feature.table.embedding_dim
    if len(output_shape) != 2 or output_shape[1] != dim:
        raise ValueError(f"{what} output_shape {output_shape} must be (batch, {dim}) (table {feature.table.name!r}).")
    if None not in (input_shape[0], output_shape[0]) and input_shape[0] != output_shape[0]:
        raise ValueError(f"{what} input_shape {input_shape} and output_shape {output_shape} differ in the batch size.")
    if len(input_shape) == 2 and input_shape[1] is not None:
        _positive_int(input_shape[1], f"{what} input_shape[1]")


def _check_table_stacking(table_stacking: Any, names: list[str]) -> None:
    # Stacking is a SparseCore memory layout; here it is only checked (names exist, each at most once).
    if table_stacking is None or table_stacking == "auto":
        return
    if isinstance(table_stacking, str) or not isinstance(table_stacking, Sequence):
        raise ValueError(
            f"table_stacking must be 'auto', None or a list of lists of table names; got {table_stacking!r}."
        )
    groups = [[g] if isinstance(g, str) else g for g in table_stacking]
    seen: set = set()
    for group in groups:
        for name in group:
            if name not in names:
                raise ValueError(f"table_stacking names table {name!r}, which no feature uses (tables: {names}).")
            if name in seen:
                raise ValueError(f"table_stacking lists table {name!r} more than once.")
            seen.add(name)


def _truncate(x: Any, w: Any, max_ids: int | None) -> tuple[Any, Any]:
    """Ragged/sparse ids (and their weights) with each row cut to its first `max_ids` ids."""
    if max_ids is None:
        return x, w
    if _xla.in_xla_context():
        # XLA compiles neither ragged nor sparse slicing: the ids past max_ids stay, with weight 0, which adds
        # nothing to any combiner's sum or norm (the same values, unless such a row holds inf or NaN).
        if isinstance(x, tf.RaggedTensor):
            position = tf.range(tf.size(x.values, out_type=tf.int64)) - tf.gather(x.row_starts(), x.value_rowids())
        else:
            position = x.indices[:, 1]
        keep = tf.cast(position < max_ids, tf.float32)
        w_values = keep if w is None else w.values * keep
        if isinstance(x, tf.RaggedTensor):
            return x, x.with_values(w_values)
        return x, tf.SparseTensor(x.indices, w_values, x.dense_shape)
    return _cut(x, max_ids), (None if w is None else _cut(w, max_ids))


def _cut(x: Any, max_ids: int) -> Any:
    if isinstance(x, tf.RaggedTensor):
        return x[:, :max_ids]
    shape = tf.shape(x, out_type=tf.int64)
    return tf.sparse.slice(x, tf.zeros([2], tf.int64), tf.stack([shape[0], tf.minimum(shape[1], max_ids)]))


def _kind(x: Any) -> str:
    return "ragged" if isinstance(x, tf.RaggedTensor) else "sparse" if isinstance(x, tf.SparseTensor) else "dense"


def _prepare(x: Any, w: Any, feature: Any) -> tuple[Any, Any]:
    """One feature's input in keras-rs's terms -> what the TPUEmbedding layer takes (same combined result)."""
    what = f"Feature {feature.name!r}:"
    declared = tuple(feature.input_shape)
    max_ids = declared[1] if len(declared) == 2 else None
    if isinstance(x, (tf.RaggedTensor, tf.SparseTensor)):
        if x.shape.rank != 2:
            raise ValueError(f"{what} ragged/sparse input must be (batch, None); got shape {x.shape}.")
        if w is not None and not isinstance(w, type(x)):
            raise ValueError(f"{what} weights are {_kind(w)} but the input is {_kind(x)}; they must match.")
        # tf.cast keeps ragged/sparse structure, so the weights stay aligned with the ids.
        return _truncate(x, None if w is None else tf.cast(w, tf.float32), max_ids)
    x = tf.convert_to_tensor(x)
    # A rank-1 batch is one id per sample also where (batch, max_ids) is declared, as keras-rs reads it (its
    # EmbedReduce embeds a 1-D input without reducing): within any max_ids, so nothing to truncate.
    if x.shape.rank != len(declared) and not (x.shape.rank == 1 and len(declared) == 2):
        raise ValueError(f"{what} input of shape {x.shape} does not match the declared input_shape {declared}.")
    if x.shape.rank == 2 and None not in (max_ids, x.shape[1]) and x.shape[1] != max_ids:
        raise ValueError(f"{what} input of shape {x.shape} does not match the declared input_shape {declared}.")
    if w is not None:
        w = tf.cast(tf.convert_to_tensor(w), tf.float32)
    if x.shape.rank == 1:
        # One id per sample: keras-rs applies a weight only under "sum" (mean/sqrtn of one weighted id is the id).
        if w is None or feature.table.combiner != "sum":
            return x, None
        return tf.RaggedTensor.from_tensor(x[:, None]), tf.RaggedTensor.from_tensor(w[:, None])
    # A dense bag: every position is an id (keras-rs has no padding id), so a ragged tensor with full rows.
    return tf.RaggedTensor.from_tensor(x), (None if w is None else tf.RaggedTensor.from_tensor(w))


def _is_keras_rs(config: Any) -> bool:
    return type(config).__module__.startswith("keras_rs")


def _config_classes(keras_rs_configs: bool) -> tuple[type, type]:
    if keras_rs_configs:
        try:
            import keras_rs  # pylint: disable=import-outside-toplevel
        except ImportError:  # saved with keras-rs, loaded without: our classes have the same fields
            return de_config.FeatureConfig, de_config.TableConfig
        return keras_rs.layers.FeatureConfig, keras_rs.layers.TableConfig
    return de_config.FeatureConfig, de_config.TableConfig


@keras.saving.register_keras_serializable(package="tf_embed_ops")
class DistributedEmbedding(layer_lib.TPUEmbedding):
    """keras-rs's `DistributedEmbedding` on CPU, each table trained by its own optimizer in `model.fit`.

    The model's optimizer sees one scalar of this layer (the update trigger), never a table.
    """

    def __init__(
        self, feature_configs: Any, *, table_stacking: Any = "auto", update_stats: bool = False, **kwargs: Any
    ):
        """Creates the tables (and their optimizer slots).

        Args:
          feature_configs: a nest (dict, list, tuple or one) of `keras_rs.layers.FeatureConfig` or
            `tf_embed_ops.keras.FeatureConfig`, over TableConfigs whose `optimizer` is a Keras optimizer, one of
            "sgd", "adagrad", "adam", "ftrl", or a `tf.tpu.experimental.embedding` / `tf_embed_ops.optimizers`
            object. Tables shared between features are shared by identity.
          table_stacking: "auto", None or a list of lists of table names; validated, no effect on CPU.
          update_stats: keras-rs's switch for SparseCore input statistics (JAX only): True raises, as keras-rs's
            TensorFlow layer does.
          **kwargs: `frozen_tables` (the names of tables with `optimizer=None` that are looked up and never
            trained, as `tf_embed_ops.keras.TPUEmbedding` takes it) and `keras.layers.Layer` arguments (name, ...).

        Raises:
          ValueError: `update_stats=True`; or, naming the feature or table: a shape or placement this layer cannot
            honour, an unsupported combiner, optimizer or optimizer option, a bad partition limit or table_stacking.
        """
        # keras-rs's TensorFlow layer refuses it first thing (its statistics are a JAX SparseCore feature).
        if update_stats:
            raise ValueError("`update_stats` cannot be True for the TensorFlow backend.")
        leaves = keras.tree.flatten(feature_configs)
        if not leaves:
            raise ValueError("feature_configs must contain at least one FeatureConfig; got an empty nest.")
        tpu_tables: dict[int, Any] = {}
        tables: list = []
        frozen = kwargs.get("frozen_tables") or ()
        for feature in leaves:
            if not hasattr(feature, "table") or not hasattr(feature, "input_shape"):
                raise ValueError(f"feature_configs must hold FeatureConfig objects; found {type(feature).__name__}.")
            if id(feature.table) not in tpu_tables:
                tpu_tables[id(feature.table)] = _to_tpu_table(feature.table, frozen)
                tables.append(feature.table)
            _check_feature(feature)
        _check_table_stacking(table_stacking, [t.name for t in tables])
        tpu_features = keras.tree.map_structure(
            lambda f: _emb.FeatureConfig(table=tpu_tables[id(f.table)], name=f.name), feature_configs
        )
        super().__init__(tpu_features, None, **kwargs)
        self._feature_configs = feature_configs
        self._table_stacking = table_stacking
        self._update_stats = update_stats

    def call(self, inputs: Any, weights: Any = None, training: bool | None = None) -> Any:
        flat_features = keras.tree.flatten(self._feature_configs)
        flat_inputs = tf.nest.flatten(inputs)
        if len(flat_inputs) != len(flat_features):
            raise ValueError(
                f"inputs must have the structure of feature_configs ({len(flat_features)} features); "
                f"got {len(flat_inputs)} tensors."
            )
        flat_weights = [None] * len(flat_inputs) if weights is None else tf.nest.flatten(weights)
        if len(flat_weights) != len(flat_inputs):
            raise ValueError(f"weights must have the structure of inputs; got {len(flat_weights)} tensors.")
        prepared = [_prepare(x, w, f) for x, w, f in zip(flat_inputs, flat_weights, flat_features, strict=True)]
        structure = self.feature_config
        xs = tf.nest.pack_sequence_as(structure, [p[0] for p in prepared])
        ws = None
        if any(p[1] is not None for p in prepared):
            ws = tf.nest.pack_sequence_as(structure, [p[1] for p in prepared])
        return super().call(xs, ws, training=training)

    def compute_output_spec(self, inputs: Any, weights: Any = None, training: bool | None = None) -> Any:
        specs = [
            keras.KerasTensor((x.shape[0], f.table.embedding_dim), dtype="float32")
            for x, f in zip(tf.nest.flatten(inputs), keras.tree.flatten(self._feature_configs), strict=True)
        ]
        return tf.nest.pack_sequence_as(self.feature_config, specs)

    def get_embedding_tables(self) -> dict[str, tf.Tensor]:
        """`{table name: current values}`, as keras-rs's method returns them."""
        return {table.name: var.value for table, var in self.embedding_tables.items()}

    def get_config(self) -> dict[str, Any]:
        # keras-rs's layout: tables listed once, features refer to them by index (shared tables stay shared).
        tables: list[dict] = []
        index: dict[int, int] = {}

        def feature_dict(feature: Any) -> dict:
            if id(feature.table) not in index:
                index[id(feature.table)] = len(tables)
                tables.append(de_config.table_config_to_dict(feature.table))
            return {
                "name": feature.name,
                "table": index[id(feature.table)],
                "input_shape": list(feature.input_shape),
                "output_shape": list(feature.output_shape),
            }

        config = keras.layers.Layer.get_config(self)
        config["feature_configs"] = keras.tree.map_structure(feature_dict, self._feature_configs)
        config["tables"] = tables
        config["table_stacking"] = self._table_stacking
        config["update_stats"] = self._update_stats
        config["frozen_tables"] = list(self._frozen_tables)
        config["keras_rs_configs"] = _is_keras_rs(keras.tree.flatten(self._feature_configs)[0])
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> DistributedEmbedding:
        config = dict(config)
        feature_cls, table_cls = _config_classes(config.pop("keras_rs_configs", False))
        tables = [table_cls(**de_config.table_fields_from_dict(t)) for t in config.pop("tables")]

        def feature(d: dict) -> Any:
            # A leaf is a dict with a string "name" (the nest itself may be dicts too).
            if not (isinstance(d, dict) and isinstance(d.get("name"), str) and isinstance(d.get("table"), int)):
                return None
            return feature_cls(
                name=d["name"],
                table=tables[d["table"]],
                input_shape=tuple(d["input_shape"]),
                output_shape=tuple(d["output_shape"]),
            )

        config["feature_configs"] = keras.tree.traverse(feature, config["feature_configs"])
        return cls(**config)
