"""`StackedVariable`: one stacked table of `TPUEmbeddingV2`, as TensorFlow's `embedding_tables` holds it.

TensorFlow's `TPUEmbeddingV2.embedding_tables` is `{stacked table name: variable}`: one `[rows, dim]` variable per
stack, sharded over the chips in even row blocks, the tables of the stack interleaved by their
`SparseCoreTableLayout`. Here the tables train as one variable each; a `StackedVariable` presents a stack as that
one variable: reading it stacks the current per-table values (the same tensor a TensorFlow checkpoint holds),
assigning it splits the value back into the per-table variables, and `shards` gives the per-chip row blocks. It
converts to a tensor wherever TensorFlow takes one (`tf.convert_to_tensor`, ops, `np.asarray`).

Example:
    >>> stacked = emb.embedding_tables["video_user"]
    >>> stacked.shape, stacked.read_value()        # (rows, dim), the stacked values
    >>> stacked.assign(tf.zeros(stacked.shape))   # writes every table of the stack
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["StackedVariable"]


class StackedVariable:
    """A stacked table's values over its tables' variables (module docstring).

    Args:
      name: the stacked table's name.
      read: returns the stacked value (a tensor).
      write: takes a stacked value and assigns every table of the stack from it.
      shape: the stacked shape `[rows, dim]`.
      dtype: the stored dtype.
      num_shards: chips the rows are split over (even row blocks, as TensorFlow shards the variable).
    """

    def __init__(
        self,
        name: str,
        read: Callable[[], tf.Tensor],
        write: Callable[[tf.Tensor], Any],
        shape: tf.TensorShape,
        dtype: tf.DType,
        num_shards: int,
    ):
        self._name = name
        self._read = read
        self._write = write
        self._shape = tf.TensorShape(shape)
        self._dtype = tf.as_dtype(dtype)
        self._num_shards = num_shards

    @property
    def name(self) -> str:
        return self._name

    @property
    def shape(self) -> tf.TensorShape:
        return self._shape

    @property
    def dtype(self) -> tf.DType:
        return self._dtype

    def read_value(self) -> tf.Tensor:
        """The stacked values, read from the tables now."""
        return self._read()

    def value(self) -> tf.Tensor:
        return self._read()

    def numpy(self) -> np.ndarray:
        return self._read().numpy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.numpy()
        return out if dtype is None else out.astype(dtype)

    @property
    def shards(self) -> list:
        """The per-chip row blocks of the stacked value (TensorFlow's shards of the variable)."""
        return tf.split(self._read(), self._num_shards, axis=0)

    def assign(self, value: Any) -> Any:
        """Writes `value` (the stacked shape) into the tables of the stack.

        Raises:
          ValueError: `value` does not have the stacked shape (nothing is written).
        """
        value = tf.convert_to_tensor(value, dtype_hint=self._dtype)
        if not self._shape.is_compatible_with(value.shape):
            raise ValueError(
                f"Stacked table {self._name!r}: cannot assign a value of shape {value.shape}; expected {self._shape}."
            )
        return self._write(tf.cast(value, self._dtype))

    def __repr__(self) -> str:
        return f"<StackedVariable {self._name!r} shape={self._shape} dtype={self._dtype.name}>"


def _to_tensor(value: StackedVariable, dtype: Any = None, name: Any = None, as_ref: bool = False) -> tf.Tensor:
    del name, as_ref
    out = value.read_value()
    return out if dtype is None else tf.cast(out, dtype)


tf.register_tensor_conversion_function(StackedVariable, _to_tensor)
