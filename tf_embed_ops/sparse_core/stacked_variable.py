"""`StackedVariable`: one stacked table of `TPUEmbeddingV2`, as TensorFlow's `embedding_tables` holds it.

TensorFlow's `TPUEmbeddingV2.embedding_tables` is `{stacked table name: variable}`: one `[rows, dim]` variable per
stack, sharded over the chips in even row blocks, the tables of the stack interleaved by their
`SparseCoreTableLayout`. Here the tables train as one variable each; a `StackedVariable` presents a stack as that
one variable: reading it stacks the current per-table values (the same tensor a TensorFlow checkpoint holds),
assigning it splits the value back into the per-table variables, and `values` (TensorFlow's name; `shards` is the
same) gives the per-chip row blocks. It converts to a tensor wherever TensorFlow takes one (`tf.convert_to_tensor`,
ops, `np.asarray`).

The members user code touches on TensorFlow's variable behave as there: `values` (and iteration) the per-chip row
blocks in order, `variables` the same list as `tf.distribute` sharded variables name it, `shape`, `dtype`, `name`,
`numpy()`, `read_value()`, `[...]` (a slice of the stacked value, `Tensor.__getitem__`'s contract), the tensor
operators (`stacked * 2`, `-stacked`, ...), and `assign`, `assign_add`, `assign_sub` (each returns the variable, as
`ShardedVariable`'s do). The stack's padding (rows and columns beyond each table's, TensorFlow's layout) is not
stored: it reads as zero after any write. The blocks are tensors read now, not variables: write through `assign*`
on the stack. The scatter methods and `sparse_read` are not provided (the tables train through the embedding API).

Example:
    >>> stacked = emb.embedding_tables["video_user"]
    >>> stacked.shape, stacked.read_value()        # (rows, dim), the stacked values
    >>> stacked.assign(tf.zeros(stacked.shape))   # writes every table of the stack
"""

from __future__ import annotations

import operator
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

    name = property(operator.attrgetter("_name"), doc="The stacked table's name (str).")
    shape = property(operator.attrgetter("_shape"), doc="The stacked shape `[rows, dim]` (`tf.TensorShape`).")
    dtype = property(operator.attrgetter("_dtype"), doc="The stored `tf.DType`.")

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
    def values(self) -> tuple:
        """The per-chip row blocks of the stacked value, in chip order (TensorFlow's `values` of the variable)."""
        return tuple(tf.split(self._read(), self._num_shards, axis=0))

    @property
    def shards(self) -> list:
        """`values` as a list (the name this class had first)."""
        return list(self.values)

    @property
    def variables(self) -> list:
        """`values` as a list: the name `tf.distribute`'s `ShardedVariable` gives its shards."""
        return list(self.values)

    def __iter__(self):
        return iter(self.values)

    def __getitem__(self, slice_spec: Any) -> tf.Tensor:
        """A slice of the stacked value, as `tf.Tensor.__getitem__` (and `ShardedVariable.__getitem__`)."""
        return self._read()[slice_spec]

    def assign(self, value: Any, use_locking: Any = None, name: Any = None, read_value: bool = True) -> StackedVariable:
        """Writes `value` (the stacked shape) into the tables of the stack; returns this variable.

        `use_locking`, `name` and `read_value` are accepted for TensorFlow's signature and have no effect.

        Raises:
          ValueError: `value` does not have the stacked shape (nothing is written).
        """
        del use_locking, name, read_value
        self._write(self._checked(value, "assign"))
        return self

    def assign_add(
        self, delta: Any, use_locking: Any = None, name: Any = None, read_value: bool = True
    ) -> StackedVariable:
        """Adds `delta` (the stacked shape) to the stacked value; returns this variable. Raises as `assign`."""
        return self._update("assign_add", operator.add, delta)

    def assign_sub(
        self, delta: Any, use_locking: Any = None, name: Any = None, read_value: bool = True
    ) -> StackedVariable:
        """Subtracts `delta` (the stacked shape) from the stacked value; returns this variable. Raises as `assign`."""
        return self._update("assign_sub", operator.sub, delta)

    def _update(self, verb: str, op: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], delta: Any) -> StackedVariable:
        """`verb` (for errors): writes `op(value, delta)`, `delta` checked first. The locking, name and read_value
        arguments of `tf.Variable`'s signature do not apply: the write is one assignment of the shards' value."""
        delta = self._checked(delta, verb)
        self._write(op(self._read(), delta))
        return self

    def _checked(self, value: Any, what: str) -> tf.Tensor:
        value = tf.convert_to_tensor(value, dtype_hint=self._dtype)
        if not self._shape.is_compatible_with(value.shape):
            raise ValueError(
                f"Stacked table {self._name!r}: cannot {what} a value of shape {value.shape}; expected {self._shape}."
            )
        return tf.cast(value, self._dtype)

    def __repr__(self) -> str:
        return f"<StackedVariable {self._name!r} shape={self._shape} dtype={self._dtype.name}>"


def _to_tensor(value: StackedVariable, dtype: Any = None, name: Any = None, as_ref: bool = False) -> tf.Tensor:
    del name, as_ref
    out = value.read_value()
    return out if dtype is None else tf.cast(out, dtype)


tf.register_tensor_conversion_function(StackedVariable, _to_tensor)


def _overload_operator(operator: str) -> None:
    tensor_operator = getattr(tf.Tensor, operator)

    def _operator(self: StackedVariable, *args: Any, **kwargs: Any) -> Any:
        return tensor_operator(self.read_value(), *args, **kwargs)

    setattr(StackedVariable, operator, _operator)


# The tensor operators on the stacked value, as TensorFlow's sharded variables overload them (`__getitem__` above).
for _operator_name in tf.Tensor.OVERLOADABLE_OPERATORS - {"__getitem__"}:
    _overload_operator(_operator_name)
