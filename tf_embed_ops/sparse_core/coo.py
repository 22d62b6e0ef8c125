"""A SparseCore feature as COO (sample rows, ids, weights): the conversion TensorFlow's SparseCore preprocessing
starts from, with its checks (ragged splits, weights of the ids' structure, dense sample counts), each error naming
the feature."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["check_row_splits", "check_same", "feature_coo", "row_splits_problem"]


def row_splits_problem(splits: np.ndarray, num_values: int) -> str | None:
    """What is wrong with ragged row splits over `num_values` values, or None."""
    if splits.size == 0:
        return "row_splits is empty (it needs at least [0])"
    if splits[0] != 0:
        return f"row_splits[0] is {splits[0]}, not 0"
    if np.any(np.diff(splits) < 0):
        i = int(np.flatnonzero(np.diff(splits) < 0)[0])
        return f"row_splits decreases at position {i + 1} ({splits[i]} then {splits[i + 1]})"
    if splits[-1] != num_values:
        return f"row_splits ends at {splits[-1]} but there are {num_values} values"
    return None


def check_row_splits(path: str, what: str, ragged: tf.RaggedTensor) -> list:
    """Refuses malformed row splits (a RaggedTensor built with validate=False) naming the feature and the splits:
    a ValueError when eager, else returns the assert (InvalidArgumentError) to run before the splits are used."""
    splits = ragged.row_splits
    num_values = tf.size(ragged.values, out_type=splits.dtype)
    if tf.executing_eagerly():
        problem = row_splits_problem(splits.numpy(), int(num_values))
        if problem is not None:
            raise ValueError(
                f"Feature {path}: bad row_splits of the {what}: {problem}: row_splits = {splits.numpy().tolist()}."
            )
        return []
    label = f"Feature {path}: row_splits of the {what} must start at 0, not decrease and end at the number of values"
    ok = tf.logical_and(
        tf.logical_and(tf.size(splits) > 0, tf.equal(splits[0], 0)),
        tf.logical_and(tf.reduce_all(splits[1:] >= splits[:-1]), tf.equal(splits[-1], num_values)),
    )
    return [tf.debugging.Assert(ok, [label, "row_splits:", splits, "values:", num_values])]


def check_same(path: str, what: str, ids_part: tf.Tensor, weights_part: tf.Tensor) -> None:
    """The weights' `what` (row_splits / indices) must equal the ids'."""
    if tf.executing_eagerly():
        a, b = ids_part.numpy(), weights_part.numpy()
        if a.shape != b.shape or not np.array_equal(a, b):
            raise ValueError(
                f"Feature {path}: the weights' {what} {b.tolist()} differ from the ids' {a.tolist()}; weights must "
                "have the structure of their ids."
            )


def feature_coo(path: str, inp: Any, weight: Any, samples: int) -> tuple:
    """One feature as (sample rows, ids, weights) tensors, as SparseCore's COO conversion reads it."""
    if isinstance(inp, tf.SparseTensor):
        if weight is not None and not isinstance(weight, tf.SparseTensor):
            raise ValueError(f"Expect weight to be SparseTensor type but got {type(weight)}")
        rank = inp.shape.rank
        if rank is None or rank < 2:
            raise ValueError(f"Feature {path}: a SparseTensor needs rank >= 2; got shape {inp.shape}.")
        # The sample of an id is its index without the last coordinate, row-major.
        strides = tf.math.cumprod(inp.dense_shape[:-1], exclusive=True, reverse=True)
        rows = tf.reduce_sum(inp.indices[:, :-1] * strides[None, :], axis=1)
        values = inp.values
        if weight is not None:
            check_same(path, "indices", inp.indices, weight.indices)
        w = weight.values if weight is not None else tf.ones_like(values, tf.float32)
    elif isinstance(inp, tf.RaggedTensor):
        if weight is not None and not isinstance(weight, tf.RaggedTensor):
            raise ValueError(f"Expect weight to be RaggedTensor type but got {type(weight)}")
        if inp.shape.rank != 2:
            raise ValueError(f"Feature {path}: a RaggedTensor must have rank 2; got shape {inp.shape}.")
        checks = check_row_splits(path, "input", inp)
        if weight is not None:
            checks += check_row_splits(path, "weights", weight)
            check_same(path, "row_splits", inp.row_splits, weight.row_splits)
        nrows = inp.nrows()
        tf.debugging.assert_equal(
            nrows,
            tf.cast(samples, nrows.dtype),
            message=f"Feature {path}: the ragged batch must have {samples} rows (the product of output_shape).",
        )
        with tf.control_dependencies(checks):  # bad splits fail here, not inside the preprocessing
            rows, values = tf.identity(inp.value_rowids()), tf.identity(inp.values)
        w = weight.values if weight is not None else tf.ones_like(values, tf.float32)
    else:
        inp = tf.convert_to_tensor(inp)
        values = tf.reshape(inp, [-1])
        if weight is None:
            w = tf.ones_like(values, tf.float32)
        elif isinstance(weight, tf.Tensor) or not isinstance(weight, (tf.SparseTensor, tf.RaggedTensor)):
            w = tf.reshape(tf.convert_to_tensor(weight, tf.float32), [-1])
        else:
            raise ValueError(f"Expect weight to be Tensor type but got {type(weight)}")
        message = (
            f"Feature {path}: Dense tensor input should have values elements number the same as the sample "
            f"count (or none). Sample count (product of output_shape): {samples}."
        )
        count = inp.shape.num_elements()
        if count is not None and count not in (0, samples):
            raise ValueError(f"{message} Got {count} elements.")
        if count is None:
            size = tf.size(values, out_type=tf.int64)
            tf.debugging.Assert(tf.logical_or(tf.equal(size, 0), tf.equal(size, samples)), [message, size])
        rows = tf.range(tf.size(values, out_type=tf.int64))
    if not values.dtype.is_integer:
        raise ValueError(f"Feature {path}: ids must be integers; got {values.dtype.name}.")
    return tf.cast(rows, tf.int64), tf.cast(values, tf.int64), tf.cast(w, tf.float32)
