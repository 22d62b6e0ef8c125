"""The embedding lookup as stock TensorFlow ops, equal to the op bit for bit: under XLA and in every serving form.

`lookup` is the `EmbeddingActivations` op written with stock TensorFlow ops, computing the op's values bit for bit
(not only to rounding): the combiner's norm summed in float64 in input order, the per-id factor
``float(w) * float(1 / norm)`` (0 where the norm is 0), the rows widened to float32 (16-bit tables) and quantized as
the op does, then summed per sample in input order from zero (cc/lib/feature_layout.cc,
cc/lib/embedding_forward.h). It is the one plain-TensorFlow lookup of the library:

- XLA cannot compile custom ops, so when a lookup is traced in an XLA context (`tf.function(jit_compile=True)`,
  `model.compile(jit_compile=True)`) the front ends call it. Training cannot run under XLA (the fused table update
  is a custom op with side effects): `training_refused` is the error then.
- Every serving form (`te.keras.export_for_serving`, `te.serving.Publisher`, `te.keras.plain_lookup`) calls it, with
  the table or the table's serving form (an object with `gather_rows(ids)`: encoded or pruned rows, a frozen
  dynamic table), whose float32 rows it combines exactly as the op combines a table holding those rows. A served
  model therefore answers bitwise what the trained layer answers (with a quantized export: what the layer answers
  from the dequantized rows).

Example:
    >>> @tf.function(jit_compile=True)
    ... def serve(ids):
    ...     return layer({"user": ids})   # compiles: the lookup lowers to gathers and segment sums
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops as _ops
from tensorflow.python.ops import control_flow_util as _control_flow_util

__all__ = ["gather_rows", "in_xla_context", "lookup", "training_refused"]


def in_xla_context() -> bool:
    """True while tracing a function XLA compiles (`jit_compile=True`, or inside an XLA cluster's context)."""
    if tf.executing_eagerly():
        return False
    return bool(_control_flow_util.GraphOrParentsInXlaContext(_ops.get_default_graph()))


def training_refused(owner: str) -> ValueError:
    """The error of a training step traced under XLA, naming `owner` (e.g. "Layer 'embedding' (TPUEmbedding)")."""
    return ValueError(
        f"{owner}: training cannot be compiled with XLA (jit_compile=True): each table is updated in place by the "
        "fused TfEmbed>SendTPUEmbeddingGradients op, which XLA cannot compile. Compile the model with "
        "model.compile(..., jit_compile=False) (Keras' default 'auto' already does this for this layer), or run "
        "the training step in a tf.function without jit_compile. Lookups (training=False) do compile with XLA."
    )


# Simulated quantization with at most this many buckets reads its levels from a table computed here.
_MAX_LEVEL_TABLE = 1 << 16


def _quantize(rows: tf.Tensor, quantization: Any) -> tf.Tensor:
    """The op's Quantizer: bounds and step in float32, step = (hi - lo) / float(N - 1), then
    floor((x - lo) / step + 0.5) * step + lo. XLA's CPU compiler fuses the last multiply and add into one fused
    multiply-add (one rounding instead of two), so the N possible results are computed here in float32 as the op
    computes them and gathered by bucket. XLA also replaces the division by a constant with a multiplication by
    its reciprocal, so a value within an ulp of a bucket boundary may fall in the neighbouring bucket."""
    n = int(quantization.num_buckets)
    lo, hi = np.float32(quantization.lower), np.float32(quantization.upper)
    step = np.float32((hi - lo) / np.float32(n - 1))
    x = tf.minimum(tf.maximum(rows, lo), hi)
    level = tf.floor((x - lo) / step + np.float32(0.5))
    if n > _MAX_LEVEL_TABLE:
        return level * step + lo
    with np.errstate(all="ignore"):
        values = np.arange(n, dtype=np.float32) * step + lo  # float32 multiply, then float32 add
    index = tf.clip_by_value(tf.cast(level, tf.int32), 0, n - 1)
    return tf.where(tf.math.is_nan(level), level, tf.gather(tf.constant(values), index))


def _inverse_norm(combiner: str, sum_w: tf.Tensor, sum_w2: tf.Tensor) -> tf.Tensor:
    """float32(1 / norm) from float64 sums, 0 where the norm is 0 (cc/lib/combiner.h `InverseNorm`)."""
    if combiner == "sum":
        return tf.ones_like(sum_w, tf.float32)
    norm = sum_w if combiner == "mean" else tf.sqrt(sum_w2)
    safe = tf.where(tf.equal(norm, 0.0), tf.ones_like(norm), norm)
    return tf.where(tf.equal(norm, 0.0), tf.zeros_like(norm, tf.float32), tf.cast(1.0 / safe, tf.float32))


def gather_rows(table: Any, ids: tf.Tensor) -> tf.Tensor:
    """Float32 rows of `ids`: from a serving form's `gather_rows` (decoded, pruned, frozen), else gathered from the
    table as stored (16-bit rows widen exactly)."""
    if hasattr(table, "gather_rows"):
        return table.gather_rows(ids)
    return tf.cast(tf.gather(table, ids), tf.float32)


def lookup(feature_input: Any, dense: bool, table: Any, dim: int, combiner: str, quantization: Any = None):
    """One feature's activations from a normalised `FeatureInput` with stock TensorFlow ops, equal to the op's.

    Args:
      feature_input: `embedding_ops.FeatureInput` (what `normalize_feature` returns).
      dense: True when the feature came from a dense Tensor (its splits input is then empty).
      table: the [vocabulary_size, dim] table (variable or tensor; float32, bfloat16 or float16), or an object
        with a `gather_rows(ids)` method returning float32 rows [n, dim] (a table's serving form:
        `tf_embed_ops.serving.tables.ServedTable`, a frozen dynamic table).
      dim: the table's dimension.
      combiner: "sum", "mean" or "sqrtn".
      quantization: the table's `QuantizationConfig`, or None.

    Returns:
      A float32 tensor of shape sample_shape + [dim].
    """
    splits, ids, weights, sample_shape = feature_input
    ids = tf.cast(ids, tf.int64)
    sample_shape = tf.cast(sample_shape, tf.int64)
    num_ids = tf.size(ids, out_type=tf.int64)
    num_samples = tf.reduce_prod(sample_shape)
    weights = tf.cast(weights, tf.float32)
    if weights.shape.rank == 1 and weights.shape[0] == 0:
        weights = tf.ones([num_ids], tf.float32)
    elif weights.shape[0] is None:
        weights = tf.cond(tf.size(weights) > 0, lambda: weights, lambda: tf.ones([num_ids], tf.float32))
    if splits.shape.rank == 2:
        # Sparse: the sample is the row-major position of indices[:, :-1] inside sample_shape.
        coords = tf.cast(splits[:, :-1], tf.int64)
        strides = tf.math.cumprod(sample_shape, exclusive=True, reverse=True)
        sample = tf.reduce_sum(coords * strides[tf.newaxis, :], axis=1)
    elif dense:
        sample = tf.range(num_ids, dtype=tf.int64)
    else:
        sample = tf.ragged.row_splits_to_segment_ids(tf.cast(splits, tf.int64), out_type=tf.int64)
    if dense:  # each id is its own sample: factor w * InverseNorm(w, w * w)
        w64 = tf.cast(weights, tf.float64)
        scale = weights * _inverse_norm(combiner, w64, w64 * w64)
    else:
        w64 = tf.cast(weights, tf.float64)
        sum_w = tf.math.unsorted_segment_sum(w64, sample, num_samples)
        sum_w2 = tf.math.unsorted_segment_sum(w64 * w64, sample, num_samples)
        scale = weights * tf.gather(_inverse_norm(combiner, sum_w, sum_w2), sample)
    rows = gather_rows(table, ids)
    if quantization is not None:
        rows = _quantize(rows, quantization)
    acts = tf.math.unsorted_segment_sum(scale[:, tf.newaxis] * rows, sample, num_samples)
    return tf.reshape(acts, tf.concat([sample_shape, [dim]], axis=0))
