"""`DynamicTableConfig`: the configuration of a dynamic-vocabulary table (its policies: `dynamic.policies`).

A `DynamicTableConfig` is a `tf.tpu.experimental.embedding.TableConfig` (a subclass, with `vocabulary_size =
max_rows`), so every API that takes a `TableConfig` takes it: `FeatureConfig(table=...)`, `te.TPUEmbedding`,
`te.keras.TPUEmbedding`, `te.distribute`. Everything is validated here, at construction, with errors that name the
table and the value; the ops validate again.

This module is the one place that maps a configuration to what the ops run: `handle_attrs` gives the attributes
of the `TfEmbed>DynamicTableHandle` op, `dynamic_config_proto` the `TPUEmbeddingConfiguration` of the lookup and
update ops (one table entry per dynamic table, `vocabulary_size = max_rows`, the table's optimizer).
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat, low_precision
from tf_embed_ops.config import slot_shapes
from tf_embed_ops.dynamic.policies import (
    DEFAULT_EVICTION_LOG_CAPACITY,
    DEFAULT_INITIAL_CAPACITY,
    LFU,
    LRU,
    MAX_DIM,
    MAX_EVICTION_LOG_CAPACITY,
    MAX_ROWS_LIMIT,
    NO_EVICTION,
    TTL,
    BloomAdmission,
    CountAndAge,
    DecayedLFU,
    EvictionPolicy,
    FrequencyAdmission,
    L2Norm,
    RowBound,
    Score,
    check_count,
    is_int,
)
from tf_embed_ops.dynamic.sharding import shard_of_keys  # re-exported: the table's reshard-on-restore uses it
from tf_embed_ops.tiered import config as tiered_config

__all__ = [
    "DynamicTableConfig",
    "dynamic_config_proto",
    "from_config_dict",
    "handle_attrs",
    "is_dynamic",
    "to_config_dict",
    "shard_of_keys",
]

# The core's limits (cc/lib/dynamic_table.h validates them again): row indices are uint32 with one value reserved.


def _initializer_spec(initializer: Any, dim: int, table: str) -> tuple[str, list[float], int | None]:
    """(kind, params, the initializer's own seed or None) of a TensorFlow/Keras initializer object or name.

    Only the kinds the core computes from the key are accepted; anything else (a lambda, Glorot, ...) would need
    the shape of the whole table, which a growing table does not have.
    """
    if initializer is None:  # TableConfig's default
        return "truncated_normal", [0.0, 1.0 / math.sqrt(dim)], None
    if isinstance(initializer, str):
        name = initializer.lower()
        if name in ("zeros", "zero"):
            return "zeros", [], None
        if name in ("ones", "one"):
            return "constant", [1.0], None
        raise ValueError(
            f"DynamicTableConfig {table!r}: initializer {initializer!r} is not supported; use 'zeros', 'ones' or "
            "an initializer object of kind Zeros, Ones, Constant, RandomUniform, RandomNormal or TruncatedNormal."
        )
    kind = type(initializer).__name__
    get_config = getattr(initializer, "get_config", None)
    config = get_config() if callable(get_config) else None
    if config is not None:
        seed = config.get("seed")
        seed = seed if is_int(seed) else None
        if kind in ("Zeros", "Zeros_v2", "ZerosInitializer"):
            return "zeros", [], None
        if kind in ("Ones", "Ones_v2", "OnesInitializer"):
            return "constant", [1.0], None
        if kind in ("Constant", "Constant_v2", "ConstantInitializer"):
            value = config.get("value")
            try:
                scalar = float(value)
            except (TypeError, ValueError):
                raise ValueError(
                    f"DynamicTableConfig {table!r}: a Constant initializer of a dynamic table needs a scalar "
                    f"value; got {value!r}."
                ) from None
            return "constant", [scalar], None
        if kind in ("RandomUniform", "RandomUniform_v2"):
            return "uniform", [float(config["minval"]), float(config["maxval"])], seed
        if kind in ("RandomNormal", "RandomNormal_v2"):
            return "normal", [float(config["mean"]), float(config["stddev"])], seed
        if kind in ("TruncatedNormal", "TruncatedNormal_v2"):
            return "truncated_normal", [float(config["mean"]), float(config["stddev"])], seed
    raise ValueError(
        f"DynamicTableConfig {table!r}: initializer {initializer!r} ({kind}) is not supported by dynamic "
        "tables, whose rows are initialised from their key when they are created; use Zeros, Ones, Constant, "
        "RandomUniform, RandomNormal or TruncatedNormal (TensorFlow's or Keras')."
    )


def _check_initializer_params(table: str, kind: str, params: list[float]) -> None:
    if not all(math.isfinite(p) for p in params):
        raise ValueError(f"DynamicTableConfig {table!r}: initializer parameters must be finite; got {params}.")
    if kind == "uniform" and not params[0] <= params[1]:
        raise ValueError(f"DynamicTableConfig {table!r}: uniform initializer needs minval <= maxval; got {params}.")
    if kind in ("normal", "truncated_normal") and not params[1] >= 0:
        raise ValueError(f"DynamicTableConfig {table!r}: {kind} initializer needs stddev >= 0; got {params[1]}.")


def _slot_initial_values(optimizer: Any, table: str) -> list[float]:
    """One float per optimizer slot (Load/Retrieve order): a dynamic table's new row starts its slots there."""
    values = []
    for slot, init in zip(_tf_compat.slot_names(optimizer), _tf_compat.slot_initializers(optimizer), strict=True):
        config = init.get_config() if hasattr(init, "get_config") else {}
        value = config.get("value")
        try:
            values.append(float(value))
        except (TypeError, ValueError):
            raise ValueError(
                f"DynamicTableConfig {table!r}: slot {slot!r} of {type(optimizer).__name__} has initializer "
                f"{init!r}; a dynamic table needs constant slot initializers."
            ) from None
    return values


def _slot_widths(optimizer: Any, dim: int) -> list[int]:
    """Floats per row of each optimizer slot (Load/Retrieve order), from the optimizer schema: dim, or 1 for a
    per-row slot (row-wise Adagrad keeps one accumulator per row in a dynamic table too)."""
    return [width for _, width in slot_shapes(optimizer, 1, dim).values()]


class DynamicTableConfig(tf.tpu.experimental.embedding.TableConfig):
    """A dynamic-vocabulary embedding table: rows keyed by any int64 (or string) id, created as ids arrive.

    A subclass of `tf.tpu.experimental.embedding.TableConfig` with `vocabulary_size = max_rows`, so a
    `FeatureConfig` takes it as its table and the TPU configuration describes it as a table of `max_rows` rows.

    Args:
      name: the table's name (required: it names the table's resource and its checkpoint entries).
      dim: the embedding dimension (1 to 2^20).
      optimizer: the table's optimizer: any of `tf_embed_ops.optimizers` (TensorFlow's five included), with all
        its options; None takes the global optimizer of the `TPUEmbedding`. Its slots must start at a constant.
      combiner: "mean" (default), "sum" or "sqrtn", as `TableConfig`.
      initializer: how a new key's row starts: None (TableConfig's default, truncated normal with stddev
        1/sqrt(dim)), "zeros", "ones", or a TensorFlow / Keras `Zeros`, `Ones`, `Constant`, `RandomUniform`,
        `RandomNormal` or `TruncatedNormal` object. The values are a function of (seed, key, column).
      key_dtype: `tf.int64` (default) or `tf.string` (fingerprinted to int64 inside the ops, as `tf.fingerprint`).
      initial_capacity: rows allocated at creation (1 to `max_rows`; None: min(1024, max_rows)); the table
        grows past it without moving rows.
      max_rows: the most rows the table holds; with no eviction, new keys are refused once it is full.
      admission: None (every key gets a row on first sight), `te.dynamic.FrequencyAdmission` (exact counts) or
        `te.dynamic.BloomAdmission` (a counting Bloom filter of fixed memory).
      eviction: None, `te.dynamic.LRU`, `LFU`, `TTL`, `L2Norm`, `DecayedLFU`, `CountAndAge` or `Score`, applied after
        each training step.
      seed: the seed of the initializer; None takes the initializer object's own integer seed, else 0.
      eviction_log_capacity: entries the table's eviction log keeps (`DynamicTable.evicted_keys()`; >= 1, per
        shard); the oldest are dropped first and a reader that misses some is told.
      storage_dtype, slot_storage_dtype, rounding: the rows' and the slots' storage dtype and how a 16-bit row
        is rounded back after the float32 optimizer step, with `te.TableConfig`'s choices and defaults
        (tf.float32; the table's; "stochastic"); docs/low_precision.md.
      storage: None (the rows in memory) or `te.Tiered(cache_bytes=..., directory=...)`: the rows and their
        slots in a row file `<directory>/<name>.rows` behind a DRAM cache of `cache_bytes`, the keys and their
        metadata in memory (docs/tiered_dynamic_tables.md). Trained by `te.TPUEmbedding` and
        `te.keras.TPUEmbedding`; its `mode` is "create" or "overwrite" (a row file without its keys cannot be
        reopened), and L2Norm eviction (which reads every row) is refused.

    Raises:
      ValueError: for any value out of range or of the wrong kind, naming the table and the value.

    Example:
      >>> users = te.DynamicTableConfig("users", dim=16, optimizer=te.optimizers.Adagrad(0.1),
      ...                               admission=te.dynamic.FrequencyAdmission(2), eviction=te.dynamic.LRU(10**6))
      >>> feature = tf.tpu.experimental.embedding.FeatureConfig(table=users)
    """

    def __init__(
        self,
        name: str,
        dim: int,
        optimizer: Any = None,
        combiner: str = "mean",
        initializer: Any = None,
        key_dtype: Any = tf.int64,
        initial_capacity: int | None = None,
        max_rows: int = MAX_ROWS_LIMIT,
        admission: FrequencyAdmission | BloomAdmission | None = None,
        eviction: EvictionPolicy | None = None,
        seed: int | None = None,
        eviction_log_capacity: int = DEFAULT_EVICTION_LOG_CAPACITY,
        *,
        storage_dtype: Any = tf.float32,
        slot_storage_dtype: Any = None,
        rounding: str | None = None,
        storage: Any = None,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError(f"DynamicTableConfig: `name` must be a non-empty string; got {name!r}.")
        owner = f"DynamicTableConfig {name!r}"
        tiered = _check_tiered(owner, storage, eviction)
        storage_attributes = low_precision.storage_options(owner, storage_dtype, slot_storage_dtype, rounding)
        check_count(owner, "dim", dim, 1, MAX_DIM)
        check_count(owner, "max_rows", max_rows, 1, MAX_ROWS_LIMIT)
        if initial_capacity is None:
            initial_capacity = min(DEFAULT_INITIAL_CAPACITY, max_rows)
        check_count(owner, "initial_capacity", initial_capacity, 1)
        if initial_capacity > max_rows:
            raise ValueError(f"{owner}: `initial_capacity` ({initial_capacity}) must be <= max_rows ({max_rows}).")
        try:
            dtype = tf.as_dtype(key_dtype)
        except TypeError:
            dtype = None
        if dtype not in (tf.int64, tf.string):
            raise ValueError(f"{owner}: `key_dtype` must be tf.int64 or tf.string; got {key_dtype!r}.")
        if combiner not in ("mean", "sum", "sqrtn"):
            raise ValueError(f"{owner}: `combiner` must be one of 'mean', 'sum', 'sqrtn'; got {combiner!r}.")
        if admission is not None and not isinstance(admission, (FrequencyAdmission, BloomAdmission)):
            raise ValueError(
                f"{owner}: `admission` must be None, te.dynamic.FrequencyAdmission or te.dynamic.BloomAdmission; "
                f"got {admission!r}."
            )
        if eviction is not None and not isinstance(eviction, EvictionPolicy):
            raise ValueError(
                f"{owner}: `eviction` must be None, te.dynamic.LRU, LFU, TTL, L2Norm, DecayedLFU, CountAndAge or "
                f"Score; got {eviction!r}."
            )
        check_count(owner, "eviction_log_capacity", eviction_log_capacity, 1, MAX_EVICTION_LOG_CAPACITY)
        if isinstance(eviction, Score) and eviction.max_rows > max_rows:
            raise ValueError(
                f"{owner}: `eviction` keeps up to {eviction.max_rows} rows, more than max_rows ({max_rows})."
            )
        if isinstance(eviction, RowBound) and eviction.max_rows > max_rows:
            raise ValueError(
                f"{owner}: `eviction` keeps up to {eviction.max_rows} rows, more than max_rows ({max_rows})."
            )
        if optimizer is not None and not isinstance(optimizer, _tf_compat.OptimizerBase):
            raise ValueError(
                f"{owner}: `optimizer` must be a tf_embed_ops.optimizers (or tf.tpu.experimental.embedding) "
                f"optimizer or None; got {optimizer!r}."
            )
        kind, params, own_seed = _initializer_spec(initializer, dim, name)
        _check_initializer_params(name, kind, params)
        if seed is None:
            seed = own_seed if own_seed is not None else 0
        if not is_int(seed) or not -(2**63) <= seed < 2**63:
            raise ValueError(f"{owner}: `seed` must be an int64; got {seed!r}.")
        if optimizer is not None:
            _slot_initial_values(optimizer, name)  # refuse non-constant slots now, not at build
        if isinstance(initializer, str):  # TableConfig wants a callable: the object of the same kind
            initializer = _tf_compat.init_ops_v2.Zeros() if kind == "zeros" else _tf_compat.init_ops_v2.Constant(1.0)
        super().__init__(
            vocabulary_size=max_rows,
            dim=dim,
            initializer=initializer,
            optimizer=optimizer,
            combiner=combiner,
            name=name,
        )
        self.key_dtype = dtype
        self.initial_capacity = initial_capacity
        self.max_rows = max_rows
        self.admission = admission
        self.eviction = eviction
        self.eviction_log_capacity = eviction_log_capacity
        self.seed = seed
        self.initializer_kind = kind
        self.initializer_params = params
        low_precision.set_storage_attributes(self, storage_attributes, tiered)

    def __repr__(self) -> str:
        return (
            f"DynamicTableConfig(name={self.name!r}, dim={self.dim}, optimizer={self.optimizer!r}, "
            f"combiner={self.combiner!r}, initializer={self.initializer_kind}{self.initializer_params}, "
            f"key_dtype={self.key_dtype.name}, initial_capacity={self.initial_capacity}, max_rows={self.max_rows}, "
            f"admission={self.admission!r}, eviction={self.eviction!r}, seed={self.seed}, "
            f"eviction_log_capacity={self.eviction_log_capacity}, "
            f"storage_dtype={self.storage_dtype.name!r}, slot_storage_dtype={self.slot_storage_dtype.name!r}, "
            f"rounding={self.rounding!r}, storage={self.storage!r})"
        )


def _check_tiered(owner: str, storage: Any, eviction: Any) -> tiered_config.Tiered | None:
    """`storage` checked for a dynamic table: None, or a `te.Tiered` whose mode a dynamic table can use, with no
    eviction policy that reads every row."""
    storage = tiered_config.check_storage(owner, storage)
    if storage is None:
        return None
    if storage.mode == "open":
        raise ValueError(
            f"{owner}: storage=te.Tiered(mode='open') is not supported for a dynamic table: its keys live in memory, "
            "so a row file alone cannot be reopened. Use mode='create', 'overwrite' or 'restore' and restore a "
            "checkpoint."
        )
    if isinstance(eviction, L2Norm):
        raise ValueError(
            f"{owner}: eviction=L2Norm is not supported with storage=te.Tiered: it reads every row's weights at "
            "every step boundary, and a tiered table keeps them on disk. Use LRU, LFU, DecayedLFU, TTL, "
            "CountAndAge or Score."
        )
    return storage


def is_dynamic(table: Any) -> bool:
    """Whether `table` is a dynamic-vocabulary table configuration."""
    return isinstance(table, DynamicTableConfig)


def handle_attrs(config: DynamicTableConfig, optimizer: Any = None, shared_name: str = "") -> dict[str, Any]:
    """The attributes of `TfEmbed>DynamicTableHandle` for `config` (the one mapping from config to op).

    Args:
      config: the table.
      optimizer: the optimizer that trains it, when `config.optimizer` is None (the global one); None for a
        lookup-only table (no slots).
      shared_name: the resource's shared name ("" = private to the handle op).

    Raises:
      ValueError: if the optimizer's slots do not start at a constant.
    """
    optimizer = config.optimizer if config.optimizer is not None else optimizer
    admission = config.admission or FrequencyAdmission(1, max_pending_keys=1)
    eviction = config.eviction.attrs() if config.eviction is not None else dict(NO_EVICTION)
    # 16-bit storage: attrs only where they differ from the defaults, so a float32 table's op is the one older
    # versions wrote (and read).
    storage = (
        {
            "storage_dtype": config.storage_dtype.name,
            "slot_storage_dtype": config.slot_storage_dtype.name,
            "rounding": config.rounding,
        }
        if low_precision.is_low_precision(config)
        else {}
    )
    # A tiered table: attrs only when tiered, so an in-memory table's op is the one older versions wrote.
    tiered = tiered_config.storage_of(config)
    tiered_attrs = (
        {
            "tiered_path": tiered.path(config.name),
            "tiered_cache_bytes": tiered.cache_bytes,
            # (A dynamic table writes no row at creation: "restore" is "overwrite" for it.)
            "tiered_mode": "overwrite" if tiered.mode == "restore" else tiered.mode,
        }
        if tiered is not None
        else {}
    )
    return {
        "shared_name": shared_name,
        "table_name": config.name,
        "dim": config.dim,
        "key_dtype": config.key_dtype,
        "slot_initial_values": _slot_initial_values(optimizer, config.name) if optimizer is not None else [],
        "slot_widths": _slot_widths(optimizer, config.dim) if optimizer is not None else [],
        "initial_capacity": config.initial_capacity,
        "max_rows": config.max_rows,
        "initializer": config.initializer_kind,
        "initializer_params": list(config.initializer_params),
        "seed": config.seed,
        **admission.attrs(),
        **eviction,
        "eviction_log_capacity": getattr(config, "eviction_log_capacity", DEFAULT_EVICTION_LOG_CAPACITY),
        **storage,
        **tiered_attrs,
    }


def dynamic_config_proto(features: list, optimizer: Any = None, output_shapes: Any = None):
    """The `TPUEmbeddingConfiguration` of the dynamic lookup and update ops over `features` (flattened
    `FeatureConfig`s whose tables are all dynamic): one table entry per table (`vocabulary_size = max_rows`, its
    optimizer, learning-rate tags numbered among these tables), one feature descriptor per feature."""
    from tf_embed_ops import config as config_lib  # pylint: disable=import-outside-toplevel

    for feature in features:
        if not is_dynamic(feature.table):
            raise ValueError(f"dynamic_config_proto: table {feature.table.name!r} is not a DynamicTableConfig.")
    return config_lib.from_feature_config(list(features), optimizer=optimizer, output_shapes=output_shapes)


def to_config_dict(config: DynamicTableConfig) -> dict[str, Any]:
    """The dynamic fields of `config` as JSON-able values (the Keras layer's `get_config` stores them beside the
    `TableConfig` fields)."""
    admission = config.admission
    eviction = config.eviction
    return {
        "key_dtype": config.key_dtype.name,
        "initial_capacity": config.initial_capacity,
        "max_rows": config.max_rows,
        "seed": config.seed,
        "admission": None if admission is None else admission.get_config(),
        "eviction": None if eviction is None else _eviction_config(eviction, config.name),
        "eviction_log_capacity": config.eviction_log_capacity,
        "storage_dtype": config.storage_dtype.name,
        "slot_storage_dtype": config.slot_storage_dtype.name,
        "rounding": config.rounding,
    }


_EVICTION_KINDS = {
    cls.kind: cls for cls in (LRU, LFU, TTL, L2Norm, DecayedLFU, CountAndAge, Score)
}  # fmt: skip


def _eviction_config(eviction: EvictionPolicy, table: str) -> dict[str, Any]:
    """{"kind": ..., "args": {...}}; earlier versions wrote {"kind", "value"} for LRU/LFU/TTL (still read)."""
    try:
        args = eviction.get_config()
    except ValueError as e:
        raise ValueError(f"DynamicTableConfig {table!r}: {e}") from None
    return {"kind": eviction.kind, "args": args}


def _eviction_from_config(eviction: dict[str, Any], name: str) -> EvictionPolicy:
    kind = eviction.get("kind")
    if kind not in _EVICTION_KINDS:
        raise ValueError(f"DynamicTableConfig {name!r}: unknown eviction kind in a saved config: {eviction!r}.")
    if "args" in eviction:
        return _EVICTION_KINDS[kind](**eviction["args"])
    return _EVICTION_KINDS[kind](eviction["value"])


def _admission_from_config(admission: dict[str, Any]) -> FrequencyAdmission | BloomAdmission:
    args = dict(admission)
    kind = args.pop("kind", "frequency")
    return BloomAdmission(**args) if kind == "bloom" else FrequencyAdmission(**args)


def from_config_dict(
    fields: dict[str, Any], *, name: str, dim: int, optimizer: Any, combiner: str, initializer: Any, **options: Any
) -> DynamicTableConfig:
    """Inverse of `to_config_dict`, given the `TableConfig` fields and any other constructor `options` (saved by
    the caller under the argument's name)."""
    admission = fields.get("admission")
    eviction = fields.get("eviction")
    policy = None if eviction is None else _eviction_from_config(eviction, name)
    return DynamicTableConfig(
        name,
        dim,
        optimizer=optimizer,
        combiner=combiner,
        initializer=initializer,
        key_dtype=tf.as_dtype(fields["key_dtype"]),
        initial_capacity=fields["initial_capacity"],
        max_rows=fields["max_rows"],
        admission=None if admission is None else _admission_from_config(admission),
        eviction=policy,
        seed=fields["seed"],
        eviction_log_capacity=fields.get("eviction_log_capacity", DEFAULT_EVICTION_LOG_CAPACITY),
        # Configs saved before 16-bit dynamic tables have none of the three: the defaults.
        storage_dtype=fields.get("storage_dtype", "float32"),
        slot_storage_dtype=fields.get("slot_storage_dtype"),
        rounding=fields.get("rounding"),
        **options,
    )
