"""How an incremental checkpoint's delta stores a variable's values in an .npz file (numpy and stock TensorFlow).

numpy cannot store bfloat16 portably: 16-bit floats are written as their uint16 bits and read back by the dtype's
name, which the delta's header records beside them.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

__all__ = ["from_storage", "storage", "stored_dtype"]


def storage(array: np.ndarray) -> tuple[np.ndarray, str]:
    """`(what the delta stores, the dtype's name)` of `array` (16-bit floats as their uint16 bits)."""
    dtype = tf.as_dtype(array.dtype)
    if dtype in (tf.bfloat16, tf.float16):
        return array.view(np.uint16), dtype.name
    return array, dtype.name


def stored_dtype(dtype_name: str) -> np.dtype:
    """The numpy dtype a delta stores a variable of `dtype_name` in (`storage`)."""
    if dtype_name in ("bfloat16", "float16"):
        return np.dtype(np.uint16)
    return np.dtype(tf.as_dtype(dtype_name).as_numpy_dtype)


def from_storage(array: np.ndarray, dtype_name: str) -> np.ndarray:
    """The values `storage` stored as `array` for a variable of `dtype_name`."""
    if dtype_name in ("bfloat16", "float16"):
        return array.view(tf.as_dtype(dtype_name).as_numpy_dtype)
    return array
