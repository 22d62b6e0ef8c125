"""Creating 16-bit table and slot variables (docs/low_precision.md).

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
