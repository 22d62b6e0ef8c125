"""Splits one feature's ids by the table shard that owns them, keeping every id's output sample.

Runs on the worker.  Shard k gets a `FeatureInput` with only its ids (as local row numbers, id - first row of
the shard), always in sparse-indices form (the coordinates of each id's output sample plus a zero column), so
its activation has the full output shape with zeros where other shards' ids land: the full activation is the
sum of the shards' partial activations.

Mean and sqrtn normalise each sample by all of its weights, which no single shard sees.  So the worker divides
every weight by its sample's norm (computed from all the sample's weights, 0 where the norm is 0, as the
kernel does) and the shards run the "sum" combiner: the partial sums add up to the combined activation, and the
backward op gives each row the same contribution ``w_i / norm_s * dL/dact[s]`` as the unsharded op.

What travels (the compact protocol of `ShardedTPUEmbedding`): per server and table, only the distinct local ids
of the step (`distinct_rows`) go out and their rows come back; the worker combines them into the activations
(`combine_rows`, the kernel's sum in the kernel's order) and sends back one summed gradient row per distinct id
(`summed_row_gradients`, the per-row sum the fused op would accumulate, in its order).

Example:
    >>> parts = partition_feature(feature_input, "mean", [0, 4, 7, 10])   # three shards
    >>> parts[1].ids   # ids 4..6 of the batch, as rows 0..2 of shard 1
"""

from __future__ import annotations

import tensorflow as tf

from tf_embed_ops import embedding_ops

__all__ = [
    "combine_rows",
    "distinct_rows",
    "partition_feature",
    "partition_feature_by_key",
    "row_gradients",
    "scaled_weights",
    "summed_row_gradients",
]


def _static_rank_and_size(tensor: tf.Tensor) -> tuple[int | None, int | None]:
    shape = tensor.shape
    if shape.rank is None:
        return None, None
    return shape.rank, (shape[0] if shape.rank >= 1 else None)


def _sample_coordinates(feature: embedding_ops.FeatureInput, num_ids: tf.Tensor) -> tf.Tensor:
    """[num_ids, rank(sample_shape)] int64: the output sample of every id (the kernel's layout rules)."""
    splits = tf.convert_to_tensor(feature.sample_indices_or_row_splits, tf.int64)
    sample_shape = tf.cast(feature.sample_shape, tf.int64)
    rank, size = _static_rank_and_size(splits)
    if rank == 2:
        # Sparse indices: the sample is indices[:, :-1]; the last column is the reduced one.
        return splits[:, :-1]
    if rank == 1 and size == 0:
        # Dense: every id is its own sample, in row-major order.
        positions = tf.range(num_ids, dtype=tf.int64)
        return tf.transpose(tf.unravel_index(positions, sample_shape))
    if rank == 1:
        # Ragged row_splits: the sample is the row.
        rows = tf.ragged.row_splits_to_segment_ids(splits, out_type=tf.int64)
        return rows[:, tf.newaxis]
    raise ValueError(
        f"sample_indices_or_row_splits must have a static rank of 1 (row_splits, or empty for dense) or 2 "
        f"(sparse indices); got shape {splits.shape}."
    )


def _flat_samples(coordinates: tf.Tensor, sample_shape: tf.Tensor) -> tf.Tensor:
    """Row-major position of each coordinate row inside sample_shape."""
    strides = tf.math.cumprod(sample_shape, exclusive=True, reverse=True)
    return tf.reduce_sum(coordinates * strides[tf.newaxis, :], axis=1)


def scaled_weights(feature: embedding_ops.FeatureInput, combiner: str) -> tf.Tensor:
    """Every id's combiner factor ``w_i / norm_s`` (float32, one per id), computed from the whole feature.

    Args:
      feature: a normalised feature (`embedding_ops.normalize_feature`).
      combiner: "sum", "mean" or "sqrtn".

    Returns:
      The factors; for "sum" the weights themselves (ones when the feature has none).

    Raises:
      ValueError: for an unknown combiner.
    """
    if combiner not in ("sum", "mean", "sqrtn"):
        raise ValueError(f"Argument `combiner` must be 'sum', 'mean' or 'sqrtn'; got {combiner!r}.")
    ids = tf.convert_to_tensor(feature.ids, tf.int64)
    num_ids = tf.size(ids, out_type=tf.int64)
    weights = tf.convert_to_tensor(feature.weights, tf.float32)
    weights = tf.cond(tf.equal(tf.size(weights), 0), lambda: tf.ones([num_ids], tf.float32), lambda: weights)
    if combiner == "sum":
        return weights
    sample_shape = tf.cast(feature.sample_shape, tf.int64)
    samples = _flat_samples(_sample_coordinates(feature, num_ids), sample_shape)
    per_id = weights if combiner == "mean" else tf.square(weights)
    totals = tf.math.unsorted_segment_sum(per_id, samples, tf.reduce_prod(sample_shape))
    norms = totals if combiner == "mean" else tf.sqrt(totals)
    return tf.math.divide_no_nan(weights, tf.gather(norms, samples))


def partition_feature(feature: embedding_ops.FeatureInput, combiner: str, boundaries: list) -> list:
    """Splits `feature` over the DIV shards `boundaries` (shard k holds rows [b[k], b[k+1])).

    Ids outside [0, b[-1]) raise InvalidArgumentError at run time (naming the range), as the unsharded op does.

    Args:
      feature: a normalised feature (`embedding_ops.normalize_feature`).
      combiner: the table's combiner, "sum", "mean" or "sqrtn".
      boundaries: the table's DIV boundaries, at least two ascending ints from 0 to the vocabulary size.

    Returns:
      One `FeatureInput` per shard, for the "sum" combiner: sparse indices ``[n_k, rank(sample_shape) + 1]``,
      local ids ``id - b[k]``, weights ``w_i / norm_s``, and the feature's `sample_shape`.

    Raises:
      ValueError: for an unknown combiner or malformed `boundaries`.
    """
    ascending = all(a < b for a, b in zip(boundaries, boundaries[1:], strict=False))
    if len(boundaries) < 2 or boundaries[0] != 0 or not ascending:
        raise ValueError(f"Argument `boundaries` must be ascending from 0 with at least one shard; got {boundaries}.")
    num_shards = len(boundaries) - 1
    with tf.name_scope("partition_feature"):
        ids = tf.convert_to_tensor(feature.ids, tf.int64)
        vocabulary_size = boundaries[-1]
        checks = [
            tf.debugging.assert_non_negative(ids, message=f"embedding ids must be in [0, {vocabulary_size})"),
            tf.debugging.assert_less(
                ids, tf.constant(vocabulary_size, tf.int64), message=f"embedding ids must be in [0, {vocabulary_size})"
            ),
        ]
        with tf.control_dependencies(checks):
            ids = tf.identity(ids)
        num_ids = tf.size(ids, out_type=tf.int64)
        weights = scaled_weights(feature, combiner)
        sample_shape = tf.cast(feature.sample_shape, tf.int64)
        coordinates = _sample_coordinates(feature, num_ids)
        indices = tf.concat([coordinates, tf.zeros([num_ids, 1], tf.int64)], axis=1)

        upper = tf.constant(boundaries[1:-1], tf.int64)
        shard = tf.cast(tf.searchsorted(upper, ids, side="right", out_type=tf.int32), tf.int32)
        offsets = tf.constant(boundaries[:-1], tf.int64)
        local_ids = ids - tf.gather(offsets, shard)

        parts_ids = tf.dynamic_partition(local_ids, shard, num_shards)
        parts_weights = tf.dynamic_partition(weights, shard, num_shards)
        parts_indices = tf.dynamic_partition(indices, shard, num_shards)
        return [
            embedding_ops.FeatureInput(parts_indices[k], parts_ids[k], parts_weights[k], sample_shape)
            for k in range(num_shards)
        ]


def partition_feature_by_key(feature: embedding_ops.FeatureInput, combiner: str, num_shards: int) -> list:
    """Splits a dynamic table's feature over `num_shards` shards by key (`tf_embed_ops.dynamic.shard_of_keys`).

    As `partition_feature`, but the ids are keys (int64, or strings, placed by the key the ops give them) and
    stay as they are: shard k gets the keys it holds, in sparse-indices form with the weights ``w_i / norm_s``,
    for the "sum" combiner.

    Args:
      feature: a normalised feature whose ids are int64 or string keys.
      combiner: the table's combiner, "sum", "mean" or "sqrtn".
      num_shards: the number of shards, >= 1.

    Returns:
      One `FeatureInput` per shard.
    """
    from tf_embed_ops.dynamic.sharding import shard_of_keys  # pylint: disable=import-outside-toplevel

    with tf.name_scope("partition_feature_by_key"):
        keys = tf.convert_to_tensor(feature.ids)
        num_ids = tf.size(keys, out_type=tf.int64)
        # scaled_weights reads only the number of ids and the layout, never their values (keys may be strings).
        weights = scaled_weights(feature._replace(ids=tf.zeros([num_ids], tf.int64)), combiner)
        coordinates = _sample_coordinates(feature, num_ids)
        indices = tf.concat([coordinates, tf.zeros([num_ids, 1], tf.int64)], axis=1)
        shard = shard_of_keys(keys, num_shards)
        parts_keys = tf.dynamic_partition(keys, shard, num_shards)
        parts_weights = tf.dynamic_partition(weights, shard, num_shards)
        parts_indices = tf.dynamic_partition(indices, shard, num_shards)
        sample_shape = tf.cast(feature.sample_shape, tf.int64)
        return [
            embedding_ops.FeatureInput(parts_indices[k], parts_keys[k], parts_weights[k], sample_shape)
            for k in range(num_shards)
        ]


def row_gradients(feature: embedding_ops.FeatureInput, combiner: str, gradient: tf.Tensor) -> tuple:
    """Every id's gradient contribution ``w_i / norm_s * dL/dact[s]`` (what the backward op accumulates per row).

    Args:
      feature: a normalised (or partitioned) feature.
      combiner: the combiner the feature runs with ("sum" for a partitioned one).
      gradient: dL/d(activation), shape ``sample_shape + [dim]``.

    Returns:
      ``(ids, rows)``: the feature's ids (int64 [n]) and their contributions (float32 [n, dim]), in input order.
    """
    with tf.name_scope("row_gradients"):
        ids = tf.convert_to_tensor(feature.ids, tf.int64)
        num_ids = tf.size(ids, out_type=tf.int64)
        sample_shape = tf.cast(feature.sample_shape, tf.int64)
        samples = _flat_samples(_sample_coordinates(feature, num_ids), sample_shape)
        gradient = tf.convert_to_tensor(gradient, tf.float32)
        dim = tf.shape(gradient, out_type=tf.int64)[-1]
        per_sample = tf.reshape(gradient, tf.stack([tf.reduce_prod(sample_shape), dim]))
        return ids, scaled_weights(feature, combiner)[:, tf.newaxis] * tf.gather(per_sample, samples)


def distinct_rows(features: list) -> tuple:
    """The distinct ids of features reading one table, and where each id of each feature sits among them.

    Args:
      features: the (partitioned) features of one table, in the order the fused op reads them.

    Returns:
      ``(unique, positions)``: int64 ``[u]`` in first-occurrence order over the features' ids in order, and per
      feature an int64 ``[n_f]`` index into `unique`.
    """
    with tf.name_scope("distinct_rows"):
        ids = [tf.convert_to_tensor(f.ids, tf.int64) for f in features]
        unique, index = tf.unique(tf.concat(ids, axis=0), out_idx=tf.int64)
        sizes = tf.stack([tf.size(i, out_type=tf.int64) for i in ids])
        return unique, tf.split(index, sizes, num=len(ids))


def _flat_layout(feature: embedding_ops.FeatureInput) -> tuple:
    """Every id's row-major sample index, and the number of samples."""
    num_ids = tf.size(feature.ids, out_type=tf.int64)
    sample_shape = tf.cast(feature.sample_shape, tf.int64)
    return _flat_samples(_sample_coordinates(feature, num_ids), sample_shape), tf.reduce_prod(sample_shape)


def combine_rows(feature: embedding_ops.FeatureInput, positions: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
    """The "sum"-combined activation of `feature` from the distinct rows it reads (`distinct_rows`).

    Per sample, ``0 + w_1 * rows[p_1] + w_2 * rows[p_2] + ...`` in input order: the products and the order of
    the forward kernel (cc/lib/embedding_forward.h), so the result equals the op's on the table those rows
    came from (a zero's sign aside).

    Args:
      feature: a partitioned feature (weights already divided by the sample norms), or one for "sum".
      positions: int64 ``[n]``, the index of each of its ids in `rows`.
      rows: float32 ``[u, dim]``.

    Returns:
      float32 ``sample_shape + [dim]``.
    """
    with tf.name_scope("combine_rows"):
        samples, num_samples = _flat_layout(feature)
        contributions = scaled_weights(feature, "sum")[:, tf.newaxis] * tf.gather(rows, positions)
        combined = tf.math.unsorted_segment_sum(contributions, samples, num_samples)
        sample_shape = tf.cast(feature.sample_shape, tf.int64)
        return tf.reshape(combined, tf.concat([sample_shape, tf.shape(rows, out_type=tf.int64)[1:]], axis=0))


def summed_row_gradients(features: list, positions: list, gradients: list, num_rows: tf.Tensor) -> tf.Tensor:
    """One gradient row per distinct id: the sum of its contributions ``w_i * dL/dact[s]`` (`row_gradients`)
    over `features` in order, then positions: the order the fused op accumulates in (gradient_accumulation.h).

    Args:
      features: the partitioned features of one table (as given to `distinct_rows`).
      positions: `distinct_rows`' positions of their ids.
      gradients: per feature, dL/d(activation), shape ``sample_shape + [dim]``.
      num_rows: the number of distinct ids.

    Returns:
      float32 ``[num_rows, dim]``.
    """
    with tf.name_scope("summed_row_gradients"):
        rows = [row_gradients(f, "sum", g)[1] for f, g in zip(features, gradients, strict=True)]
        return tf.math.unsorted_segment_sum(tf.concat(rows, axis=0), tf.concat(positions, axis=0), num_rows)
