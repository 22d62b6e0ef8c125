"""A batch into and out of `TPUEmbeddingV2`: the host preprocessing of its ids, run as a `tf.numpy_function`, into
the engine's inputs (or counted, `compute_sparse_core_stats`), and the activations' gradients into the engine's
form.

The preprocessing is SparseCore's (`preprocess`: repeated ids merged, the combiner folded into per-id gains,
capacity limits checked or ids dropped); each feature comes out as a ragged batch of ids with their gains as
weights, one row per sample, which the engine's fused ops take as any ragged feature.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
from absl import logging

from tf_embed_ops import embedding_ops
from tf_embed_ops.sparse_core import coo as coo_lib
from tf_embed_ops.sparse_core import preprocess as preprocess_lib

__all__ = ["Chips", "engine_gradients", "host_preprocess", "sparse_core_stats"]


class Chips(NamedTuple):
    """The SparseCore topology and limits the preprocessing lays a batch out for."""

    num_replicas: int
    num_sc_per_chip: int
    max_ids_per_chip_per_sample: Any
    allow_id_dropping: bool


def _preprocess(triples: list, plans: list, stacks: Any, chips: Chips, check_capacity: bool = True) -> tuple:
    """`preprocess.preprocess` of one batch's `(rows, ids, weights)` per feature, laid out for `chips`."""
    return preprocess_lib.preprocess(
        triples,
        plans,
        stacks,
        chips.num_replicas,
        chips.num_sc_per_chip,
        chips.max_ids_per_chip_per_sample,
        chips.allow_id_dropping,
        check_capacity,
    )


def host_preprocess(
    feature_config: Any, paths: list, features: Any, weights: Any, plans: list, stacks: Any, chips: Chips
) -> tuple[list, dict]:
    """`(the engine's FeatureInputs in feature order, {stack: ids dropped})` of one batch.

    Args:
      feature_config: the features' nest; paths: each feature's key path (in messages).
      features, weights: the batch's ids and weights (None), nests matching `feature_config`.
      plans, stacks: `preprocess.plans`' answer for the features.
      chips: the topology and limits.

    Raises:
      ValueError: `features` or `weights` do not match `feature_config`'s structure.
      InvalidArgumentError: (when it runs) ids outside their table, unsorted SparseTensor rows, or a batch over a
        SparseCore capacity limit (unless `allow_id_dropping`: then the ids over `max_ids_per_chip_per_sample` are
        dropped, with a warning).
    """
    tf.nest.assert_same_structure(feature_config, features)
    flat_inputs = tf.nest.flatten(features)
    flat_weights = [None] * len(flat_inputs)
    if weights is not None:
        tf.nest.assert_same_structure(feature_config, weights)
        flat_weights = tf.nest.flatten(weights)
    coo = []
    for path, plan, inp, weight in zip(paths, plans, flat_inputs, flat_weights, strict=True):
        coo.extend(coo_lib.feature_coo(path, inp, weight, plan.sample_count))
    num_features = len(plans)

    def run(*arrays):
        triples = [tuple(arrays[3 * i : 3 * i + 3]) for i in range(num_features)]
        try:
            kept, _, _, dropped = _preprocess(triples, plans, stacks, chips)
        except ValueError as e:
            raise tf.errors.InvalidArgumentError(None, None, str(e)) from e
        for name, count in dropped.items():
            if count:
                logging.warning("Table %s is dropping %d ids so that the batch fits SparseCore's buffer.", name, count)
        out = []
        for samples, ids, gains in kept:
            out.extend([samples, ids, gains])
        out.append(np.asarray([dropped[n] for n in sorted(dropped)], np.int64))
        return out

    with tf.name_scope("tpu_embedding_v2_enqueue"):
        flat = tf.numpy_function(run, coo, [tf.int64, tf.int64, tf.float32] * num_features + [tf.int64], stateful=False)
    inputs = []
    for i, plan in enumerate(plans):
        samples, ids, gains = flat[3 * i : 3 * i + 3]
        ids = tf.ensure_shape(ids, [None])
        ragged_ids = tf.RaggedTensor.from_value_rowids(ids, tf.ensure_shape(samples, [None]), nrows=plan.sample_count)
        ragged_gains = ragged_ids.with_values(tf.ensure_shape(gains, [None]))
        inputs.append(embedding_ops.normalize_feature(ragged_ids, weights=ragged_gains))
    dropped = dict(zip(sorted(stacks), tf.unstack(tf.ensure_shape(flat[-1], [len(stacks)])), strict=True))
    return inputs, dropped


def sparse_core_stats(
    feature_config: Any, paths: list, features: Any, plans: list, stacks: Any, chips: Chips
) -> tuple[dict, dict]:
    """`(max_ids, max_unique_ids)` per stacked table (int32 scalars) of one chip's batch `features` (a nest matching
    `feature_config`), counted as the preprocessing counts them, capacity limits unchecked."""
    tf.nest.assert_same_structure(feature_config, features)
    triples = []
    for path, plan, inp in zip(paths, plans, tf.nest.flatten(features), strict=True):
        rows, ids, w = coo_lib.feature_coo(path, inp, None, plan.sample_count)
        triples.append((rows.numpy(), ids.numpy(), w.numpy()))
    _, max_ids, max_unique, _ = _preprocess(triples, plans, stacks, chips, check_capacity=False)
    as_tensors = functools.partial(tf.constant, dtype=tf.int32)
    return ({k: as_tensors(v) for k, v in max_ids.items()}, {k: as_tensors(v) for k, v in max_unique.items()})


def engine_gradients(flat_gradients: list, flat_features: list) -> list:
    """The activations' gradients (feature order; None: zeros, with TensorFlow's warning) as the engine's update
    takes them: float32 `[samples, dim]`.

    Raises:
      ValueError: a gradient that is not a Tensor, or not of its activation's shape (`output_shape + [dim]`).
    """
    flat = []
    for gradient, (path, feature) in zip(flat_gradients, flat_features, strict=True):
        shape = feature.output_shape.as_list() + [feature.table.dim]
        samples = functools.reduce(operator.mul, feature.output_shape.as_list(), 1)
        if gradient is not None and not isinstance(gradient, tf.Tensor):
            raise ValueError(f"found non-tensor type: {type(gradient)} at path {path}.")
        if gradient is None:
            logging.warning(
                "No gradient passed for feature %s, sending zero gradient. This may not be correct behavior for "
                "certain optimizers like Adam.",
                path,
            )
            gradient = tf.zeros(shape, tf.float32)
        elif not gradient.shape.is_compatible_with(shape):
            raise ValueError(f"Found gradient of shape {gradient.shape} at path {path}. Expected shape {shape}.")
        flat.append(tf.reshape(tf.cast(gradient, tf.float32), [samples, feature.table.dim]))
    return flat
