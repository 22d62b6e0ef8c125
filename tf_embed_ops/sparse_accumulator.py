"""An eager-capable ``SparseConditionalAccumulator``: TensorFlow's contract on a resource handle.

Same constructor and methods as ``tf.compat.v1.sparse.SparseConditionalAccumulator``; works eagerly, inside
``tf.function`` (including ``tf.cond``/``tf.while_loop``) and in TF1 graphs.  Semantics and every difference
from TensorFlow: ``docs/sparse_accumulator.md``.
"""

from __future__ import annotations

import collections
import math
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops import _loader

__all__ = ["SparseConditionalAccumulator", "TakeGradResult"]

_SUPPORTED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
_REDUCTION_TYPES = ("MEAN", "SUM")

# grad_shape when it is unknown: an empty int64 vector, converted by the op itself.
_NO_SHAPE: list[int] = []

TakeGradResult = collections.namedtuple("TakeGradResult", ["indices", "values", "shape"])
TakeGradResult.__doc__ = "The aggregate a take returns: sorted unique int64 indices, the rows, the int64 dense shape."


def _int64(value: Any, argument: str) -> tf.Tensor:
    """Converts an index-like argument to int64 (int32 tensors are widened; other dtypes are an error)."""
    if isinstance(value, tf.Tensor) and value.dtype == tf.int64:
        return value  # the common case, first: eager applies are bound by this wrapper's overhead
    if isinstance(value, (tf.Tensor, tf.Variable)) or tf.is_tensor(value):
        if value.dtype not in (tf.int32, tf.int64):
            raise ValueError(f"{argument} must be int32 or int64, got a {value.dtype.name} tensor")
        return tf.cast(value, tf.int64)
    try:
        return tf.convert_to_tensor(value, dtype=tf.int64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{argument} must be convertible to int64: {e}") from e


def _step(value: Any, argument: str) -> tf.Tensor | int:
    # As TensorFlow's wrapper does: any number is accepted and cast (a float 7.9 becomes 7).
    if type(value) is int:  # exactly int, not bool: the op converts it to int64 itself, no cast op needed
        return value
    tensor = value if tf.is_tensor(value) else tf.convert_to_tensor(value)
    if not (tensor.dtype.is_integer or tensor.dtype.is_floating):
        raise ValueError(f"{argument} must be a number, got dtype {tensor.dtype.name}")
    return tf.cast(tensor, tf.int64)


class SparseConditionalAccumulator:
    """Aggregates sparse gradients (IndexedSlices) until enough are held, then hands out their mean or sum.

    A gradient is accepted unless it is stale (``local_step`` below the accumulator's global step).  A take
    waits until ``num_required`` gradients are held, returns the aggregate of all of them (each row divided by
    the number of gradients that touched it for ``"MEAN"``), empties the accumulator and increments the
    global step.  Incoming indices are canonicalised: sorted, duplicates summed.

    Without ``shared_name`` each instance is its own accumulator: eagerly it is owned by the handle and freed
    with the last reference to it; in a graph it is private to the creating kernel (as in TensorFlow).  With
    ``shared_name``, instances with the same name share one accumulator, which must have the same dtype,
    shape and reduction type.

    Example:
      >>> acc = SparseConditionalAccumulator(tf.float32, shape=[10, 2])
      >>> acc.apply_grad([0, 3], [[1.0, 1.0], [2.0, 2.0]])
      >>> acc.apply_grad([3], [[4.0, 4.0]])
      >>> indices, values, shape = acc.take_grad(2)  # [0, 3], [[1, 1], [3, 3]], [10, 2]
    """

    def __init__(
        self,
        dtype: tf.dtypes.DType | str | type,
        shape: tf.TensorShape | list | tuple | None = None,
        shared_name: str | None = None,
        name: str = "sparse_conditional_accumulator",
        reduction_type: str = "MEAN",
    ) -> None:
        """Creates (or, with ``shared_name``, looks up) the accumulator.

        Args:
          dtype: type of the gradient values: float16, bfloat16, float32 or float64.
          shape: partial shape of the dense gradient.  A known rank is a minimum rank for the values, known
            dims 1.. must match theirs, a known dim 0 bounds the indices.  None or ``[]``: no constraint.
          shared_name: share the accumulator with every other one of this name (same resource manager).
          name: name of the creating op (eagerly: just this object's name).
          reduction_type: ``"MEAN"`` (per-row mean) or ``"SUM"``.

        Raises:
          ValueError: for an unsupported dtype, an unknown reduction_type or an invalid shape.
          tf.errors.InvalidArgumentError: when ``shared_name`` names an accumulator with another dtype, shape
            or reduction type.
        """
        self._dtype = tf.as_dtype(dtype)
        if self._dtype not in _SUPPORTED_DTYPES:
            raise ValueError(f"dtype must be one of {[d.name for d in _SUPPORTED_DTYPES]}, got {self._dtype.name}")
        if reduction_type not in _REDUCTION_TYPES:
            raise ValueError(f"reduction_type must be one of {list(_REDUCTION_TYPES)}, got {reduction_type!r}")
        self._shape = tf.TensorShape(shape)
        self._reduction_type = reduction_type
        ops = _loader.load_ops()
        if tf.executing_eagerly() and not shared_name:
            # Eager kernels are cached by attrs, so a kernel-private resource would be shared by every instance
            # with the same attrs (the aliasing bug of TensorFlow's own eager ConditionalAccumulator).  An
            # anonymous accumulator is owned by its reference-counting handle instead.
            self._handle = ops.tf_embed_anonymous_sparse_accumulator(
                dtype=self._dtype, shape=self._shape, reduction_type=reduction_type, name=name
            )
            self._name = name
        else:
            self._handle = ops.tf_embed_sparse_accumulator(
                dtype=self._dtype,
                shape=self._shape,
                shared_name=shared_name or "",
                reduction_type=reduction_type,
                name=name,
            )
            self._name = name if tf.executing_eagerly() else self._handle.op.name.split("/")[-1]

    @property
    def accumulator_handle(self) -> tf.Tensor:
        """The scalar resource handle of the accumulator."""
        return self._handle

    handle = accumulator_handle

    @property
    def accumulator_ref(self) -> tf.Tensor:
        """The accumulator's scalar resource handle (a `tf.resource` tensor), as TensorFlow's property names it.

        TensorFlow's class holds a ref-typed handle in graphs and a resource handle eagerly; ours is always the
        resource handle (the same tensor as `accumulator_handle`), which is what the ops here take.
        """
        return self._handle

    @property
    def dtype(self) -> tf.dtypes.DType:
        """The dtype of the gradient values."""
        return self._dtype

    @property
    def name(self) -> str:
        """The name of the accumulator (the creating op's name in a graph)."""
        return self._name

    @property
    def shape(self) -> tf.TensorShape:
        """The partial shape given at construction."""
        return self._shape

    @property
    def reduction_type(self) -> str:
        """``"MEAN"`` or ``"SUM"``."""
        return self._reduction_type

    def _values(self, grad_values: Any) -> tf.Tensor:
        if isinstance(grad_values, tf.Tensor) and grad_values.dtype == self._dtype:
            return grad_values
        if tf.is_tensor(grad_values) or isinstance(grad_values, tf.Variable):
            if grad_values.dtype != self._dtype:
                raise ValueError(
                    f"grad_values has dtype {grad_values.dtype.name} but the accumulator holds {self._dtype.name}; "
                    f"cast it first (tf.cast(grad_values, {self._dtype.name!r}))"
                )
            return tf.convert_to_tensor(grad_values)
        if isinstance(grad_values, np.ndarray) and not (
            np.issubdtype(grad_values.dtype, np.number) or grad_values.dtype == np.bool_
        ):
            raise ValueError(f"grad_values must be numeric, got a numpy array of dtype {grad_values.dtype}")
        try:
            # Python numbers and lists (and numpy arrays) convert to the accumulator dtype, as a constant would.
            return tf.convert_to_tensor(grad_values, dtype=self._dtype)
        except (TypeError, ValueError) as e:
            raise ValueError(f"grad_values cannot be converted to the accumulator dtype {self._dtype.name}: {e}") from e

    def apply_grad(
        self,
        grad_indices: Any,
        grad_values: Any,
        grad_shape: Any = None,
        local_step: Any = 0,
        name: str | None = None,
    ) -> tf.Operation | None:
        """Adds a sparse gradient, unless it is stale (``local_step`` < the accumulator's global step).

        Args:
          grad_indices: int32/int64 vector of row indices (any order; duplicates are summed).
          grad_values: the rows, ``[len(grad_indices), ...]``; a tensor must have the accumulator dtype,
            Python numbers and lists are converted to it.
          grad_shape: the dense shape, checked against the accumulator shape; None: unknown.
          local_step: the step the gradient was computed at.
          name: op name.

        Returns:
          The apply op in a graph; None eagerly.

        Raises:
          ValueError: for a values tensor of another dtype or non-integer indices/shape.
          tf.errors.InvalidArgumentError: for a malformed gradient (also when it is stale); nothing changes.

        Example:
          >>> acc.apply_grad([0, 2], [[1.0, 2.0], [3.0, 4.0]], grad_shape=[3, 2], local_step=0)
        """
        with tf.name_scope(name or "apply_grad"):
            indices = _int64(grad_indices, "grad_indices")
            values = self._values(grad_values)
            has_known_shape = grad_shape is not None
            shape = _int64(grad_shape, "grad_shape") if has_known_shape else _NO_SHAPE
            step = _step(local_step, "local_step")
            return _loader.load_ops().tf_embed_sparse_accumulator_apply_gradient(
                self._handle, step, indices, values, shape, has_known_shape=has_known_shape
            )

    def apply_indexed_slices_grad(
        self, grad: tf.IndexedSlices, local_step: Any = 0, name: str | None = None
    ) -> tf.Operation | None:
        """Adds ``grad`` (an IndexedSlices; ``dense_shape`` None means unknown).  See ``apply_grad``.

        Example:
          >>> acc.apply_indexed_slices_grad(tf.IndexedSlices(values, indices, dense_shape=[3, 2]))
        """
        if not isinstance(grad, tf.IndexedSlices):
            raise ValueError(f"grad must be a tf.IndexedSlices, got {type(grad).__name__}")
        return self.apply_grad(grad.indices, grad.values, grad.dense_shape, local_step, name=name)

    def take_grad(self, num_required: Any, name: str | None = None, timeout: float | None = None) -> TakeGradResult:
        """Waits for ``num_required`` gradients, then returns the aggregate of all held gradients.

        Takes are served in arrival order; the first waiting take blocks later ones.  On success the
        accumulator is emptied and its global step incremented.

        Args:
          num_required: int32 scalar > 0.
          name: op name.
          timeout: seconds to wait at most (None: no limit).

        Returns:
          ``TakeGradResult(indices, values, shape)``: sorted unique int64 indices, the rows, and the int64 dense
          shape (accumulator dim 0 or -1, then the values' dims 1..).

        Raises:
          ValueError: for a negative or NaN ``timeout``.
          tf.errors.InvalidArgumentError: for ``num_required`` <= 0 (at once, nothing changes).
          tf.errors.DeadlineExceededError: when ``timeout`` passes; nothing changes.
          tf.errors.CancelledError: when the step is cancelled (a session closed); nothing changes.

        Example:
          >>> indices, values, shape = acc.take_grad(2, timeout=10.0)
        """
        if timeout is None:
            seconds = -1.0
        else:
            seconds = float(timeout)
            if math.isnan(seconds) or seconds < 0:
                raise ValueError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")
        with tf.name_scope(name or "take_grad"):
            # Python ints and floats go to the op as they are: it converts them without extra ops.
            required = num_required if type(num_required) is int else tf.convert_to_tensor(num_required, dtype=tf.int32)
            out = _loader.load_ops().tf_embed_sparse_accumulator_take_gradient(
                self._handle, required, seconds, dtype=self._dtype
            )
            return TakeGradResult(out.indices, out.values, out.shape)

    def take_indexed_slices_grad(
        self, num_required: Any, name: str | None = None, timeout: float | None = None
    ) -> tf.IndexedSlices:
        """``take_grad`` as a ``tf.IndexedSlices(values, indices, dense_shape)``.

        Example:
          >>> grad = acc.take_indexed_slices_grad(2)
        """
        out = self.take_grad(num_required, name=name, timeout=timeout)
        return tf.IndexedSlices(indices=out.indices, values=out.values, dense_shape=out.shape)

    def num_accumulated(self, name: str | None = None) -> tf.Tensor:
        """The number of gradients accepted since the last take (int32 scalar).

        Example:
          >>> int(acc.num_accumulated())
        """
        if name is None and not tf.executing_eagerly():
            name = f"{self._name}_NumAccumulated"
        return _loader.load_ops().tf_embed_sparse_accumulator_num_accumulated(self._handle, name=name)

    def set_global_step(self, new_global_step: Any, name: str | None = None) -> tf.Operation | None:
        """Sets the global step, unconditionally (lowering it logs a warning); held gradients stay.

        Example:
          >>> acc.set_global_step(10)  # gradients with local_step < 10 are now dropped
        """
        with tf.name_scope(name or "set_global_step"):
            return _loader.load_ops().tf_embed_sparse_accumulator_set_global_step(
                self._handle, _step(new_global_step, "new_global_step")
            )
