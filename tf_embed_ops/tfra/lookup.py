"""`de.embedding_lookup`, `de.embedding_lookup_sparse`, `de.safe_embedding_lookup_sparse`.

Each is a per-id lookup of a `de.Variable` (`Variable.rows`) followed by plain TensorFlow ops, so gradients reach
the looked-up rows through TensorFlow's own gradients, and the fused update of the table runs in the backward pass
of the variable's trigger. With `return_trainable=True` the trigger is returned too: give it to the optimizer
(`optimizer.apply_gradients(zip(tape.gradient(loss, [trainable]), [trainable]))`) as TFRA's trainable wrapper is
given.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_embed_ops.tfra import variable as variable_lib

__all__ = ["embedding_lookup", "embedding_lookup_sparse", "safe_embedding_lookup_sparse"]

_COMBINERS = ("sum", "mean", "sqrtn")


def _check_params(params: Any, function: str) -> variable_lib.Variable:
    if isinstance(params, (list, tuple)) and len(params) == 1:
        params = params[0]  # TFRA takes `[var]` as TensorFlow's embedding_lookup takes a list of shards
    if not isinstance(params, variable_lib.Variable):
        raise ValueError(f"de.{function}: params must be a de.Variable; got {type(params).__name__}.")
    return params


def _max_norm(rows: tf.Tensor, max_norm: Any) -> tf.Tensor:
    return rows if max_norm is None else tf.clip_by_norm(rows, max_norm, axes=[-1])


def embedding_lookup(
    params: Any,
    ids: Any,
    partition_strategy: Any = None,
    name: str | None = None,
    validate_indices: Any = None,
    max_norm: Any = None,
    return_trainable: bool = False,
) -> Any:
    """The rows of `ids` (shape `ids.shape + [dim]`), trained through the backward pass in train mode.

    Args:
      params: a `de.Variable`.
      ids: int or string ids (the variable's key dtype), any shape.
      partition_strategy, validate_indices: TFRA's signature; no effect.
      name: a name scope.
      max_norm: clip each row to this L2 norm (in the result only, as TensorFlow's `embedding_lookup`).
      return_trainable: also return the variable whose gradient trains the table.

    Raises:
      ValueError: params not a de.Variable, ids of another dtype than the variable's keys.
    """
    del partition_strategy, validate_indices
    params = _check_params(params, "embedding_lookup")
    with tf.name_scope(name or "embedding_lookup"):
        rows = _max_norm(params.rows(ids, params.trigger), max_norm)
    return (rows, params.trigger) if return_trainable else rows


def embedding_lookup_sparse(
    params: Any,
    sp_ids: tf.SparseTensor,
    sp_weights: tf.SparseTensor | None,
    partition_strategy: Any = None,
    name: str | None = None,
    combiner: str | None = None,
    max_norm: Any = None,
    return_trainable: bool = False,
) -> Any:
    """The combined rows of each row of `sp_ids` (`[batch, dim]`), as `tf.nn.embedding_lookup_sparse`.

    Args:
      sp_ids: a 2-D `tf.SparseTensor` of ids.
      sp_weights: None (weights 1) or a `tf.SparseTensor` of float weights with `sp_ids`' indices.
      combiner: "sum", "mean" (default) or "sqrtn".

    Raises:
      ValueError: an unknown combiner, ids that are not a SparseTensor.
    """
    del partition_strategy
    params = _check_params(params, "embedding_lookup_sparse")
    combiner = combiner or "mean"
    if combiner not in _COMBINERS:
        raise ValueError(f"de.embedding_lookup_sparse: combiner must be one of {_COMBINERS}; got {combiner!r}.")
    if not isinstance(sp_ids, tf.SparseTensor):
        raise ValueError(f"de.embedding_lookup_sparse: sp_ids must be a tf.SparseTensor; got {type(sp_ids).__name__}.")
    with tf.name_scope(name or "embedding_lookup_sparse"):
        segments = tf.cast(sp_ids.indices[:, 0], tf.int32)
        rows = _max_norm(params.rows(sp_ids.values, params.trigger), max_norm)
        if sp_weights is None:
            weights = tf.ones_like(segments, tf.float32)
        else:
            weights = tf.cast(sp_weights.values, tf.float32)
        batch = tf.cast(sp_ids.dense_shape[0], tf.int32)
        total = tf.math.unsorted_segment_sum(rows * weights[:, tf.newaxis], segments, batch)
        if combiner == "sum":
            out = total
        elif combiner == "mean":
            out = tf.math.divide_no_nan(total, tf.math.unsorted_segment_sum(weights, segments, batch)[:, tf.newaxis])
        else:
            norm = tf.sqrt(tf.math.unsorted_segment_sum(weights * weights, segments, batch))
            out = tf.math.divide_no_nan(total, norm[:, tf.newaxis])
    return (out, params.trigger) if return_trainable else out


def safe_embedding_lookup_sparse(
    embedding_weights: Any,
    sparse_ids: tf.SparseTensor,
    sparse_weights: tf.SparseTensor | None = None,
    combiner: str = "mean",
    default_id: Any = None,
    name: str | None = None,
    partition_strategy: Any = None,
    max_norm: Any = None,
    return_trainable: bool = False,
) -> Any:
    """`embedding_lookup_sparse` where rows of `sparse_ids` without ids give zeros (or `default_id`'s row).

    Raises:
      ValueError: as `embedding_lookup_sparse`.
    """
    embedding_weights = _check_params(embedding_weights, "safe_embedding_lookup_sparse")
    out = embedding_lookup_sparse(
        embedding_weights, sparse_ids, sparse_weights, partition_strategy, name, combiner, max_norm
    )
    if default_id is not None:
        params = _check_params(embedding_weights, "safe_embedding_lookup_sparse")
        batch = tf.cast(sparse_ids.dense_shape[0], tf.int32)
        present = tf.math.unsorted_segment_max(
            tf.ones_like(sparse_ids.indices[:, 0], tf.int32), tf.cast(sparse_ids.indices[:, 0], tf.int32), batch
        )
        default = params.rows(tf.fill([1], tf.cast(default_id, sparse_ids.values.dtype)), params.trigger)
        out = tf.where(present[:, tf.newaxis] > 0, out, default)
    return (out, embedding_weights.trigger) if return_trainable else out
