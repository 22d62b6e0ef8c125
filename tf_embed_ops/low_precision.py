"""The storage options of a table and creating 16-bit table and slot variables (docs/low_precision.md).

`storage_options` is the one declaration of the three options both table configurations take
(`te.TableConfig` and `te.DynamicTableConfig`): ``storage_dtype``, ``slot_storage_dtype`` and ``rounding``, with
their defaults, validation and error messages.

A 16-bit variable is initialised in float32 and rounded to nearest (TensorFlow's cast), so a bfloat16 table starts
from the nearest values of the float32 table the same initializer would give. A pending checkpoint value (a
restore that ran before the variables were built) is converted the same way, whatever dtype it was saved in: a
float32 checkpoint restores into 16-bit tables rounded to nearest, a 16-bit one into float32 tables exactly.

Example:
    >>> init = storage_initializer(tf.keras.initializers.Constant(0.1), tf.bfloat16)
    >>> init((2, 2)).dtype
    tf.bfloat16
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat

STORAGE_DTYPES = (tf.float32, tf.bfloat16, tf.float16)
ROUNDINGS = ("stochastic", "nearest")


def _storage_dtype(value: Any, argument: str, owner: str) -> tf.DType:
    try:
        dtype = tf.as_dtype(value)
    except TypeError:
        dtype = None
    if dtype not in STORAGE_DTYPES:
        raise ValueError(
            f"{owner}: {argument}={value!r} is not supported; expected tf.float32, tf.bfloat16 or tf.float16"
        )
    return dtype


def storage_options(
    owner: str, storage_dtype: Any = tf.float32, slot_storage_dtype: Any = None, rounding: str | None = None
) -> tuple[tf.DType, tf.DType, str]:
    """The validated storage options of a table: (storage dtype, slots' storage dtype, rounding).

    Args:
      owner: names the table in errors ("TableConfig 'video'", "DynamicTableConfig 'users'").
      storage_dtype: tf.float32 (default), tf.bfloat16 or tf.float16 (or their names).
      slot_storage_dtype: the slots' dtype, same choices; None (default) = `storage_dtype`.
      rounding: "stochastic" or "nearest"; None (default) = "stochastic". Used only where something is 16-bit.

    Returns:
      (storage_dtype, slot_storage_dtype, rounding) as tf.DType, tf.DType, str.

    Raises:
      ValueError: an unsupported dtype or rounding, naming the owner, the argument and the value.
    """
    storage = _storage_dtype(storage_dtype, "storage_dtype", owner)
    slots = storage if slot_storage_dtype is None else _storage_dtype(slot_storage_dtype, "slot_storage_dtype", owner)
    if rounding is None:
        rounding = "stochastic"
    if rounding not in ROUNDINGS:
        raise ValueError(f"{owner}: rounding={rounding!r} is not supported; expected one of {ROUNDINGS}")
    return storage, slots, rounding


def set_storage_attributes(config: Any, options: tuple[tf.DType, tf.DType, str], tiered: Any) -> None:
    """Sets the storage attributes every table config carries: `storage_dtype`, `slot_storage_dtype` and `rounding`
    (`options`, as `storage_options` returns them) and `storage` (the tiered placement, or None)."""
    config.storage_dtype, config.slot_storage_dtype, config.rounding = options
    config.storage = tiered


def storage_initializer(initializer: Callable, dtype: tf.DType) -> Callable:
    """`initializer(shape, dtype)` giving `dtype` values: float32 values (or a checkpoint's, in its saved dtype)
    cast to `dtype`. A float32 `dtype` with a float32 initializer is returned unchanged."""
    dtype = tf.as_dtype(dtype)

    def init(shape: Any, dtype: Any = None, **kwargs: Any) -> Any:
        del dtype
        if isinstance(initializer, _tf_compat.CheckpointInitialValueCallable):
            value = initializer(shape, **kwargs)
            if value.wrapped_value.dtype != storage:
                # Keep the restore marker (the variable then skips the deferred restore it came from).
                value.wrapped_value = tf.cast(value.wrapped_value, storage)
            return value
        return tf.cast(initializer(shape, dtype=tf.float32, **kwargs), storage)

    storage = dtype
    if storage == tf.float32 and not isinstance(initializer, _tf_compat.CheckpointInitialValueCallable):
        return initializer
    return init


def is_low_precision(table: Any) -> bool:
    """True when `table` (a `te.TableConfig`, `te.DynamicTableConfig` or TensorFlow's `TableConfig`) or its slots
    are stored in 16 bits."""
    return (
        getattr(table, "storage_dtype", tf.float32) != tf.float32
        or getattr(table, "slot_storage_dtype", tf.float32) != tf.float32
    )
