"""`DynamicTableConfig` and the admission and eviction policies of dynamic-vocabulary tables.

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

from tf_embed_ops import _tf_compat
from tf_embed_ops.config import slot_shapes
from tf_embed_ops.dynamic.sharding import shard_of_keys  # re-exported: the table's reshard-on-restore uses it

__all__ = [
    "LFU",
    "LRU",
    "TTL",
    "DynamicTableConfig",
    "FrequencyAdmission",
    "dynamic_config_proto",
    "from_config_dict",
    "handle_attrs",
    "is_dynamic",
    "to_config_dict",
    "shard_of_keys",
]

# The core's limits (cc/lib/dynamic_table.h validates them again): row indices are uint32 with one value reserved.
MAX_ROWS_LIMIT = 2**31 - 1
MAX_DIM = 2**20
DEFAULT_INITIAL_CAPACITY = 1024
DEFAULT_MAX_PENDING_KEYS = 1 << 20
_INITIALIZER_KINDS = ("zeros", "constant", "uniform", "normal", "truncated_normal")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_count(owner: str, argument: str, value: Any, minimum: int, maximum: int = 2**63 - 1) -> int:
    if not _is_int(value) or not minimum <= value <= maximum:
        upper = "" if maximum == 2**63 - 1 else f" and <= {maximum}"
        raise ValueError(f"{owner}: `{argument}` must be an int >= {minimum}{upper}; got {value!r}.")
    return value


class FrequencyAdmission:
    """Admission by frequency: a key gets a row once it has been seen `min_count` times.

    Counts are exact (one counter per key without a row), bounded by `max_pending_keys`; a key that finds the
    counters full is not counted (reported as `untracked`). With `pending_ttl_steps > 0` a counter whose key has
    not been seen for more than that many steps is dropped at a step boundary.

    Args:
      min_count: sightings before a key gets a row (>= 1; 1 admits every key on first sight).
      max_pending_keys: at most this many keys counted at once (>= 1).
      pending_ttl_steps: drop counters unseen for more than this many steps; 0 keeps them.

    Raises:
      ValueError: for a value out of range (naming the argument and the value).
    """

    def __init__(self, min_count: int, max_pending_keys: int = DEFAULT_MAX_PENDING_KEYS, pending_ttl_steps: int = 0):
        self.min_count = _check_count("FrequencyAdmission", "min_count", min_count, 1, 2**32 - 1)
        self.max_pending_keys = _check_count(
            "FrequencyAdmission", "max_pending_keys", max_pending_keys, 1, MAX_ROWS_LIMIT
        )
        self.pending_ttl_steps = _check_count("FrequencyAdmission", "pending_ttl_steps", pending_ttl_steps, 0)

    def __repr__(self) -> str:
        return (
            f"FrequencyAdmission(min_count={self.min_count}, max_pending_keys={self.max_pending_keys}, "
            f"pending_ttl_steps={self.pending_ttl_steps})"
        )


class _Eviction:
    """An eviction policy, applied at the end of every training step (and by an explicit `evict()`)."""

    kind = "none"

    def attrs(self) -> dict[str, Any]:
        """The policy's attributes of the handle op (and of the explicit-evict op)."""
        raise NotImplementedError


class _RowBound(_Eviction):
    def __init__(self, max_rows: int):
        self.max_rows = _check_count(type(self).__name__, "max_rows", max_rows, 1, MAX_ROWS_LIMIT)

    def attrs(self) -> dict[str, Any]:
        return {"eviction": self.kind, "eviction_max_rows": self.max_rows, "eviction_ttl_steps": 0}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_rows={self.max_rows})"


class LRU(_RowBound):
    """Least recently used: at a step boundary, evicts the rows seen longest ago until `max_rows` remain (ties:
    smaller key first)."""

    kind = "lru"


class LFU(_RowBound):
    """Least frequently used: at a step boundary, evicts the rows with the lowest count until `max_rows` remain
    (ties: older last step first, then smaller key)."""

    kind = "lfu"


class TTL(_Eviction):
    """Time to live: at a step boundary, evicts every row not seen for more than `steps` steps."""

    kind = "ttl"

    def __init__(self, steps: int):
        self.steps = _check_count("TTL", "steps", steps, 1)

    def attrs(self) -> dict[str, Any]:
        return {"eviction": self.kind, "eviction_max_rows": 0, "eviction_ttl_steps": self.steps}

    def __repr__(self) -> str:
        return f"TTL(steps={self.steps})"


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
        seed = seed if _is_int(seed) else None
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
      admission: None (every key gets a row on first sight) or `te.dynamic.FrequencyAdmission`.
      eviction: None, `te.dynamic.LRU`, `te.dynamic.LFU` or `te.dynamic.TTL`, applied after each training step.
      seed: the seed of the initializer; None takes the initializer object's own integer seed, else 0.

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
        admission: FrequencyAdmission | None = None,
        eviction: _Eviction | None = None,
        seed: int | None = None,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError(f"DynamicTableConfig: `name` must be a non-empty string; got {name!r}.")
        owner = f"DynamicTableConfig {name!r}"
        _check_count(owner, "dim", dim, 1, MAX_DIM)
        _check_count(owner, "max_rows", max_rows, 1, MAX_ROWS_LIMIT)
        if initial_capacity is None:
            initial_capacity = min(DEFAULT_INITIAL_CAPACITY, max_rows)
        _check_count(owner, "initial_capacity", initial_capacity, 1)
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
        if admission is not None and not isinstance(admission, FrequencyAdmission):
            raise ValueError(f"{owner}: `admission` must be None or te.dynamic.FrequencyAdmission; got {admission!r}.")
        if eviction is not None and not isinstance(eviction, _Eviction):
            raise ValueError(
                f"{owner}: `eviction` must be None, te.dynamic.LRU, te.dynamic.LFU or te.dynamic.TTL; got {eviction!r}."
            )
        if isinstance(eviction, _RowBound) and eviction.max_rows > max_rows:
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
        if not _is_int(seed) or not -(2**63) <= seed < 2**63:
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
        self.seed = seed
        self.initializer_kind = kind
        self.initializer_params = params

    def __repr__(self) -> str:
        return (
            f"DynamicTableConfig(name={self.name!r}, dim={self.dim}, optimizer={self.optimizer!r}, "
            f"combiner={self.combiner!r}, initializer={self.initializer_kind}{self.initializer_params}, "
            f"key_dtype={self.key_dtype.name}, initial_capacity={self.initial_capacity}, max_rows={self.max_rows}, "
            f"admission={self.admission!r}, eviction={self.eviction!r}, seed={self.seed})"
        )


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
    eviction = (
        config.eviction.attrs()
        if config.eviction is not None
        else {"eviction": "none", "eviction_max_rows": 0, "eviction_ttl_steps": 0}
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
        "admission_min_count": admission.min_count,
        # The core wants no counters when every key is admitted on first sight.
        "max_pending_keys": admission.max_pending_keys if admission.min_count > 1 else 0,
        "pending_ttl_steps": admission.pending_ttl_steps if admission.min_count > 1 else 0,
        **eviction,
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
        "admission": None
        if admission is None
        else {
            "min_count": admission.min_count,
            "max_pending_keys": admission.max_pending_keys,
            "pending_ttl_steps": admission.pending_ttl_steps,
        },
        # TTL's argument is `steps`, LRU's and LFU's `max_rows`.
        "eviction": None if eviction is None else {"kind": eviction.kind, "value": _eviction_value(eviction)},
    }


def _eviction_value(eviction: _Eviction) -> int:
    return eviction.steps if isinstance(eviction, TTL) else eviction.max_rows


def from_config_dict(
    fields: dict[str, Any], *, name: str, dim: int, optimizer: Any, combiner: str, initializer: Any, **options: Any
) -> DynamicTableConfig:
    """Inverse of `to_config_dict`, given the `TableConfig` fields and any other constructor `options` (saved by
    the caller under the argument's name)."""
    admission = fields.get("admission")
    eviction = fields.get("eviction")
    policy = None
    if eviction is not None:
        kinds = {"lru": LRU, "lfu": LFU, "ttl": TTL}
        if eviction.get("kind") not in kinds:
            raise ValueError(f"DynamicTableConfig {name!r}: unknown eviction kind in a saved config: {eviction!r}.")
        policy = kinds[eviction["kind"]](eviction["value"])
    return DynamicTableConfig(
        name,
        dim,
        optimizer=optimizer,
        combiner=combiner,
        initializer=initializer,
        key_dtype=tf.as_dtype(fields["key_dtype"]),
        initial_capacity=fields["initial_capacity"],
        max_rows=fields["max_rows"],
        admission=None if admission is None else FrequencyAdmission(**admission),
        eviction=policy,
        seed=fields["seed"],
        **options,
    )
