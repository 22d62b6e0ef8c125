"""`de.Variable` / `de.get_variable`: TFRA's hash-table variable over one `te.dynamic.DynamicTable`.

The table's rows are created, read and trained by tf_embed_ops' dynamic-table ops; this class gives them TFRA's
interface (`lookup`, `upsert`, `remove`, `size`, `export`, `clear`, `restrict`) and owns the *trigger*, the
trainable scalar whose gradient runs the table's fused update (`update_trigger`), and the binding to the Keras
optimizer whose family and hyper-parameters train the table (`optimizer.DynamicEmbeddingOptimizer`).

Rows of new keys start as a function of (seed, key, column) (docs/dynamic_tables.md), not of a random stream;
a key without a row reads as the row it would start with (TFRA: a draw of the initializer), and is not inserted.
Checkpoints hold the table under `<owner>/params/table/` (keys, weights, optimizer slots side by side, per-row
metadata, step): see `checkpoint_import` for how a TFRA checkpoint becomes one.

Example:
    >>> v = de.get_variable("user", key_dtype=tf.int64, dim=4, initializer=0.5)
    >>> v.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 4]))
    >>> v.lookup(tf.constant([2, 3], tf.int64))  # [[1, 1, 1, 1], [0.5, 0.5, 0.5, 0.5]]
"""

from __future__ import annotations

import numbers
import operator
import weakref
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tf_embed_ops import _tf_compat, update_trigger
from tf_embed_ops.dynamic import config as dynamic_config
from tf_embed_ops.dynamic import engine as dynamic_engine
from tf_embed_ops.dynamic import ops as dynamic_ops
from tf_embed_ops.tfra import mode, optimizer, policies, refused

__all__ = ["Variable", "get_variable"]

_KEY_DTYPES = (tf.int32, tf.int64, tf.string)


def _check_devices(name: str, devices: Any) -> None:
    for device in [devices] if isinstance(devices, str) else list(devices or ()):
        spec = tf.DeviceSpec.from_string(device if isinstance(device, str) else str(device))
        if (spec.device_type or "CPU").upper() != "CPU":
            raise NotImplementedError(f"de.Variable {name!r}: device {device!r}: {refused.REFUSED['HkvHashTable']}.")


def _initializer(initializer: Any) -> Any:
    if initializer is None:
        return "zeros"  # TFRA's default value of a de.Variable
    if isinstance(initializer, numbers.Number) and not isinstance(initializer, bool):
        return keras.initializers.Constant(float(initializer))
    config = initializer.get_config() if callable(getattr(initializer, "get_config", None)) else {}
    if type(initializer).__name__.startswith("RandomUniform") and config.get("maxval") is None:
        # TensorFlow 1's random_uniform_initializer: maxval None is 1 for floats.
        return keras.initializers.RandomUniform(config.get("minval", 0.0), 1.0, seed=config.get("seed"))
    if isinstance(initializer, (tf.Tensor, np.ndarray)) and np.size(initializer) == 1:
        return keras.initializers.Constant(float(np.reshape(np.asarray(initializer), [])))  # TFRA: a default value
    return initializer


class Variable(_tf_compat.AutoTrackable):
    """A dynamic embedding table keyed by int32, int64 or string ids, with TFRA's methods.

    Args:
      key_dtype: tf.int64 (default), tf.int32 or tf.string.
      value_dtype: tf.float32 (the only one: rows are float32).
      dim: the embedding dimension.
      devices: CPU devices (one table in this process whatever their number; GPU devices are refused).
      partitioner, shared_name, checkpoint, bp_v2, short_file_name: accepted for TFRA's signature, no effect.
      name: the table's name (its checkpoint and statistics names).
      initializer: a number (constant), None (zeros), or a Keras / TensorFlow Zeros, Ones, Constant,
        RandomUniform, RandomNormal or TruncatedNormal initializer.
      trainable: False makes a lookup-only table.
      init_size: rows allocated up front (the table grows past it).
      kv_creator: must be None (TFRA's Redis / HKV / file-system stores are refused, naming the alternative).
      restrict_policy: None, `de.TimestampRestrictPolicy` or `de.FrequencyRestrictPolicy` (for `restrict`).

    Raises:
      ValueError: a key or value dtype, dim, initializer or policy out of range, naming the table.
      NotImplementedError: a GPU device or a `kv_creator`, with the alternative.
    """

    def __init__(
        self,
        key_dtype: Any = tf.int64,
        value_dtype: Any = tf.float32,
        dim: int = 1,
        devices: Any = None,
        partitioner: Any = None,
        shared_name: Any = None,
        name: str = "DynamicEmbedding_Variable",
        initializer: Any = None,
        trainable: bool = True,
        checkpoint: bool = True,
        init_size: int = 0,
        kv_creator: Any = None,
        restrict_policy: Any = None,
        bp_v2: bool = False,
        short_file_name: bool = False,
        **kwargs: Any,
    ):
        super().__init__()
        del partitioner, shared_name, checkpoint, bp_v2, short_file_name, kwargs  # no equivalent, no effect
        self._name = str(name)
        try:
            self._key_dtype = tf.as_dtype(key_dtype)
        except TypeError:
            self._key_dtype = None
        if self._key_dtype not in _KEY_DTYPES:
            raise ValueError(
                f"de.Variable {name!r}: key_dtype must be tf.int64, tf.int32 or tf.string; got {key_dtype!r}."
            )
        if tf.as_dtype(value_dtype) != tf.float32:
            raise ValueError(
                f"de.Variable {name!r}: value_dtype must be tf.float32 (dynamic tables hold float32 rows; cast the "
                f"lookup's result); got {tf.as_dtype(value_dtype).name}."
            )
        if kv_creator is not None:
            raise NotImplementedError(
                f"de.Variable {name!r}: kv_creator={kv_creator!r}: {refused.REFUSED['RedisTableCreator']}."
            )
        _check_devices(self._name, devices)
        self._devices = devices
        self._restrict_policy = policies.check_policy(self._name, restrict_policy)
        self._trainable = bool(trainable)
        self._initializer = initializer
        self._base_config = {
            # The table's resource name is built from its name, and TensorFlow refuses resource names that start
            # with "_" (TFRA's tests name variables "_devar").
            "name": self._name if not self._name.startswith("_") else f"de{self._name}",
            "dim": int(dim) if isinstance(dim, numbers.Integral) else dim,
            "combiner": "sum",
            "initializer": _initializer(initializer),
            "key_dtype": tf.string if self._key_dtype == tf.string else tf.int64,
            "initial_capacity": max(1, int(init_size or 0)) if init_size else None,
        }
        # A weak reference to the Keras optimizer that trains the table (once bound): a strong one would make the
        # optimizer a checkpoint dependency of the table.
        self._keras_optimizer = lambda: None
        self._trained = False
        self._group = None
        self._scratch = None  # the group of the scratch table `initial_rows` reads random initial rows from
        self._relayout(None)  # validates the configuration before anything else is created
        with tf.init_scope():
            self.trigger = tf.Variable(0.0, trainable=True, name=f"{_safe(self._name)}_trigger")
        optimizer.register_trigger(self.trigger, self)
        if self._trainable:
            optimizer.follow_latest(self)

    # ------------------------------------------------------------------------------------------- properties
    # Read-only, under TFRA's `de.Variable` names: the constructor's arguments, and the table's width.
    name = property(operator.attrgetter("_name"), doc="The variable's name (str).")
    dim = property(operator.attrgetter("table.dim"), doc="The row width (int).")
    key_dtype = property(operator.attrgetter("_key_dtype"), doc="The keys' `tf.DType`.")
    trainable = property(operator.attrgetter("_trainable"), doc="Whether training updates the table (bool).")
    initializer = property(operator.attrgetter("_initializer"), doc="The new rows' initializer.")
    devices = property(operator.attrgetter("_devices"), doc="The devices given at construction.")
    restrict_policy = property(operator.attrgetter("_restrict_policy"), doc="The restrict policy, or None.")

    @property
    def value_dtype(self) -> tf.DType:
        return tf.float32

    @property
    def optimizer(self) -> Any:
        """The Keras optimizer the table is bound to (None before any is wrapped)."""
        return self._keras_optimizer()

    @property
    def config(self) -> Any:
        """The `te.DynamicTableConfig` of the table now."""
        return self.table.config

    # ------------------------------------------------------------------------------------ optimizer binding
    def bind(self, keras_optimizer: Any) -> None:
        """Lays the table out for `keras_optimizer`'s slots (its rows kept) unless it has trained already."""
        if self._trained or keras_optimizer is self.optimizer:
            return
        table_opt = optimizer.table_optimizer(keras_optimizer, self._name) if self._trainable else None
        self._relayout(table_opt)
        self._keras_optimizer = weakref.ref(keras_optimizer)

    def _relayout(self, table_opt: Any) -> None:
        config = dynamic_config.DynamicTableConfig(optimizer=table_opt, **self._base_config)
        feature = tf.tpu.experimental.embedding.FeatureConfig(table=config, name=self._name)
        group = dynamic_engine.DynamicGroup([feature])
        with tf.init_scope():
            group.build(_tf_compat.AutoTrackable())  # a throwaway owner: the table is tracked here, as `table`
            new = group.tables[config]
            old = self._group.tables[self._group.table_configs[0]] if self._group is not None else None
            if old is not None and int(old.size()) > 0:
                c = old.export()
                same_slots = old.slot_widths == new.slot_widths and old.num_slots == new.num_slots
                if same_slots:
                    new.import_(**c)
                else:  # another optimizer's slots: the rows and their metadata move, the slots start fresh
                    new.import_(c["keys"], c["weights"], counts=c["counts"], last_steps=c["last_steps"])
            if old is not None:
                new.step.assign(old.step)
        self._group = group
        self.table = new

    def _refuse_update(self, gradients: Any) -> tf.Tensor:
        raise ValueError(
            f"de.Variable {self._name!r} is trained but no optimizer was wrapped with "
            "de.DynamicEmbeddingOptimizer(keras_optimizer) yet; wrap the model's optimizer before training."
        )

    def _lookup_training(self) -> None:
        """Fixes the optimizer binding at the first training lookup."""
        if not self._trained:
            self._trained = True
            optimizer.stop_following(self)

    # --------------------------------------------------------------------------------------------- lookups
    def keys_of(self, ids: Any, argument: str = "ids") -> tf.Tensor:
        """`ids` as the table's keys (int64, or strings for a string table), checked against `key_dtype`."""
        ids = tf.convert_to_tensor(ids)
        if self._key_dtype == tf.string:
            if ids.dtype != tf.string:
                raise ValueError(f"de.Variable {self._name!r}: {argument} must be strings; got {ids.dtype.name}.")
            return ids
        if not ids.dtype.is_integer:
            raise ValueError(f"de.Variable {self._name!r}: {argument} must be integers; got {ids.dtype.name}.")
        return tf.cast(ids, tf.int64)

    def rows(self, ids: Any, trigger: Any = None, training: bool | None = None) -> tf.Tensor:
        """Each id's row, shape `ids.shape + [dim]`: a training lookup when `trigger` (a trainable variable) is
        given and `mode.is_training(training)`; its backward pass then updates the rows with the bound optimizer.
        Otherwise a read (keys without a row: their initial rows; nothing inserted)."""
        ids = self.keys_of(ids)
        flat = tf.reshape(ids, [-1])
        inp = dynamic_engine.normalize_dynamic_feature(flat, self.table.config)
        if trigger is not None and self._trainable and mode.is_training(training):
            value = tf.convert_to_tensor(trigger.value if isinstance(trigger, keras.Variable) else trigger)
            if self.optimizer is None:
                # No optimizer wrapped yet: the forward pass reads (as TFRA's, which inserts only when it applies
                # gradients); a gradient through it is an error, not a silently untrained table.
                acts = update_trigger.hang_update_on_trigger(
                    value, lambda: self._group.lookup([inp], training=False), self._refuse_update
                )[0]
            else:
                self._lookup_training()
                acts = self._group.lookup_and_update([inp], value)[0]
        else:
            acts = self._read(flat)
        shape = tf.concat([tf.shape(ids, out_type=tf.int32), [self.dim]], 0)
        return tf.reshape(acts, shape)

    def _read(self, flat: tf.Tensor) -> tf.Tensor:
        """Rows of `flat` keys, each key without a row read as the row it would start with (TFRA returns the
        initializer's value); nothing is inserted."""
        table = self.table
        exists = table.find(flat) >= 0
        return tf.where(exists[:, tf.newaxis], table.lookup(flat), self.initial_rows(flat))

    def initial_rows(self, keys: Any) -> tf.Tensor:
        """The rows `keys` would start with (`[n, dim]`), computed as a new row is: a function of (seed, key,
        column). A random initializer's rows come from a scratch table of the same configuration, inserted and
        removed again; the table itself is not touched."""
        config = self.table.config
        keys = tf.reshape(self.keys_of(keys, "keys"), [-1])
        if config.initializer_kind in ("zeros", "constant"):
            value = config.initializer_params[0] if config.initializer_kind == "constant" else 0.0
            return tf.fill(tf.stack([tf.size(keys), self.dim]), tf.constant(value, tf.float32))
        if self._scratch is None:
            scratch = dynamic_config.DynamicTableConfig(**{**self._base_config, "name": f"{self._name}-initial-rows"})
            self._scratch = dynamic_engine.DynamicGroup(
                [tf.tpu.experimental.embedding.FeatureConfig(table=scratch, name=self._name)]
            )
            with tf.init_scope():
                self._scratch.build(_tf_compat.AutoTrackable())  # not tracked: never checkpointed
        group = self._scratch
        table = group.tables[group.table_configs[0]]
        inp = dynamic_engine.normalize_dynamic_feature(keys, group.table_configs[0])
        rows = group.lookup([inp], training=True)[0]
        with tf.control_dependencies([rows]):
            removed = table.evict_keys(keys)
        with tf.control_dependencies([removed]):
            return tf.identity(rows)

    def lookup(self, keys: Any, return_exists: bool = False, name: str | None = None) -> Any:
        """The rows of `keys`, a key without a row read as the row it would start with (`initial_rows`); nothing is
        inserted. With `return_exists`, also a bool tensor saying which keys have a row."""
        del name
        keys = self.keys_of(keys, "keys")
        flat = tf.reshape(keys, [-1])
        values = tf.reshape(self._read(flat), tf.concat([tf.shape(keys, out_type=tf.int32), [self.dim]], 0))
        if return_exists:
            return values, self.table.find(keys) >= 0
        return values

    # ------------------------------------------------------------------------------------------- mutation
    def _int64_keys(self, keys: Any) -> tf.Tensor:
        keys = tf.reshape(self.keys_of(keys, "keys"), [-1])
        return dynamic_ops.string_keys_to_int64(keys) if keys.dtype == tf.string else keys

    def upsert(self, keys: Any, values: Any, name: str | None = None) -> Any:
        """Inserts or replaces the rows of `keys` (the last value of a repeated key wins); existing rows keep
        their optimizer slots and metadata, new ones start with fresh slots.

        Raises:
          ValueError: keys of another dtype, or values that are not `[len(keys), dim]` floats.
        """
        del name
        new_keys = self._int64_keys(keys)
        values = tf.convert_to_tensor(values)
        if not values.dtype.is_floating:
            raise ValueError(f"de.Variable {self._name!r}: values must be floats; got {values.dtype.name}.")
        if values.shape.rank is not None and values.shape[-1] is not None and values.shape[-1] != self.dim:
            raise ValueError(
                f"de.Variable {self._name!r}: values must have {self.dim} columns (dim); got shape {values.shape}."
            )
        values = tf.reshape(tf.cast(values, tf.float32), [-1, self.dim])
        check = tf.debugging.assert_equal(
            tf.shape(values)[0], tf.size(new_keys), message=f"de.Variable {self._name!r}: one row of values per key"
        )
        with tf.control_dependencies([check] if check is not None else []):  # in a graph: before the import
            values = tf.identity(values)
        table = self.table
        c = table.export()
        n_old, n_new = tf.size(c["keys"]), tf.size(new_keys)
        keys = tf.concat([c["keys"], new_keys], 0)
        unique, index = tf.unique(keys)
        positions = tf.range(n_old + n_new)
        count = tf.size(unique)
        last = tf.math.unsorted_segment_max(positions, index, count)
        first = tf.math.unsorted_segment_min(positions, index, count)
        fresh_slots = tf.tile(self._initial_slot_row()[tf.newaxis], [n_new, 1])
        fresh_meta = tf.ones([n_new], tf.int64)
        step = tf.fill([n_new], table.step.read_value())
        return table.import_(
            unique,
            tf.gather(tf.concat([c["weights"], values], 0), last),
            slots=tf.gather(tf.concat([c["slots"], fresh_slots], 0), first),
            counts=tf.gather(tf.concat([c["counts"], fresh_meta], 0), first),
            last_steps=tf.gather(tf.concat([c["last_steps"], step], 0), first),
        )

    def _initial_slot_row(self) -> tf.Tensor:
        attrs = dynamic_config.handle_attrs(self.table.config)
        parts = [
            tf.fill([w], tf.constant(v, tf.float32))
            for w, v in zip(self.table.slot_widths, attrs["slot_initial_values"], strict=True)
        ]
        return tf.concat(parts, 0) if parts else tf.zeros([0], tf.float32)

    def remove(self, keys: Any, name: str | None = None) -> tf.Tensor:
        """Removes the rows of `keys` (keys without a row are ignored); returns how many went."""
        del name
        return self.table.evict_keys(tf.reshape(self.keys_of(keys, "keys"), [-1]))

    def clear(self, name: str | None = None) -> Any:
        """Removes every row."""
        del name
        empty = tf.zeros([0], tf.int64)
        return self.table.import_(empty, tf.zeros([0, self.dim], tf.float32))

    def size(self, index: Any = None, name: str | None = None) -> tf.Tensor:
        """Rows in the table (int64 scalar)."""
        del index, name
        return self.table.size()

    def export(self, name: str | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        """(keys, values) of every row, sorted by key.

        Raises:
          ValueError: for a string table, whose keys are kept as their 64-bit fingerprints
            (`te.dynamic.string_keys`); read those with `.table.export()`.
        """
        del name
        if self._key_dtype == tf.string:
            raise ValueError(
                f"de.Variable {self._name!r}: a string-keyed table keeps each key's 64-bit fingerprint "
                "(te.dynamic.string_keys), not the string, so export() cannot return the strings; "
                "`.table.export()['keys']` gives the fingerprints."
            )
        c = self.table.export()
        return tf.cast(c["keys"], self._key_dtype), c["weights"]

    def restrict(self, num_reserved: int, trigger: int | None = None, **kwargs: Any) -> Any:
        """Shrinks the table to `num_reserved` rows by its restrict policy when it holds more than `trigger`
        (default `num_reserved`) rows; returns how many rows went.

        Raises:
          ValueError: without a restrict policy, or with `num_reserved` < 1.
        """
        del kwargs
        if self._restrict_policy is None:
            raise ValueError(f"de.Variable {self._name!r}: restrict() needs restrict_policy= on the variable.")
        policy = self._restrict_policy.eviction(int(num_reserved))
        trigger = int(num_reserved) if trigger is None else int(trigger)
        table = self.table
        return tf.cond(
            table.size() > trigger, lambda: tf.cast(table.evict(policy), tf.int64), lambda: tf.constant(0, tf.int64)
        )

    def get_slot_variables(self, optimizer_: Any = None) -> list:
        """TFRA's slot variables: here the slots are columns of the table itself (`.table.export()['slots']`)."""
        del optimizer_
        return []


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_.-" else "_" for ch in name) or "table"


def get_variable(
    name: str,
    key_dtype: Any = tf.int64,
    value_dtype: Any = tf.float32,
    dim: int = 1,
    devices: Any = None,
    partitioner: Any = None,
    initializer: Any = None,
    trainable: bool = True,
    checkpoint: bool = True,
    init_size: int = 0,
    kv_creator: Any = None,
    restrict_policy: Any = None,
    bp_v2: bool = False,
    short_file_name: bool = False,
    **kwargs: Any,
) -> Variable:
    """A new `de.Variable` (TFRA's signature; see `Variable` for the arguments)."""
    return Variable(
        key_dtype=key_dtype,
        value_dtype=value_dtype,
        dim=dim,
        devices=devices,
        partitioner=partitioner,
        name=name,
        initializer=initializer,
        trainable=trainable,
        checkpoint=checkpoint,
        init_size=init_size,
        kv_creator=kv_creator,
        restrict_policy=restrict_policy,
        bp_v2=bp_v2,
        short_file_name=short_file_name,
        **kwargs,
    )
