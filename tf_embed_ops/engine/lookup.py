"""The lookup's shapes: the op gives `sample_shape + [dim]`; a `FeatureConfig.output_shape` reshapes it.

`static_activation_shape` is what a gradient must be compatible with, `activation_shape_tensor` the same at run
time (for a zero gradient), `reshape_activations` applies `output_shape` to the op's results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_embed_ops import embedding_ops
from tf_embed_ops import features as features_lib

__all__ = [
    "activation_shape_tensor",
    "lookup_shape_tensor",
    "pack_subset",
    "reshape_activations",
    "static_activation_shape",
]


def static_activation_shape(feature_input: embedding_ops.FeatureInput, feature: Any) -> tf.TensorShape:
    """Static activation shape: `sample_shape + [dim]`, or `output_shape + [dim]`."""
    dim = feature.table.dim
    if feature.output_shape:
        return tf.TensorShape(feature.output_shape.as_list() + [dim])
    sample_shape = feature_input.sample_shape
    static = tf.get_static_value(sample_shape) if isinstance(sample_shape, tf.Tensor) else sample_shape
    if static is None:
        rank = sample_shape.shape[0] if isinstance(sample_shape, tf.Tensor) else None
        return tf.TensorShape(None if rank is None else [None] * int(rank) + [dim])
    return tf.TensorShape([int(x) for x in static] + [dim])


def activation_shape_tensor(feature_input: embedding_ops.FeatureInput, feature: Any) -> Any:
    """The activation's shape at run time (`output_shape + [dim]` when set, else the op's)."""
    if feature.output_shape:
        return feature.output_shape.as_list() + [feature.table.dim]
    return lookup_shape_tensor(feature_input, feature.table.dim)


def lookup_shape_tensor(feature_input: embedding_ops.FeatureInput, dim: int) -> tf.Tensor:
    """The op's activation shape at run time: `sample_shape + [dim]`."""
    return tf.concat([tf.cast(feature_input.sample_shape, tf.int32), [dim]], axis=0)


def reshape_activations(activations: Sequence[tf.Tensor], features: Sequence[Any]) -> list:
    """Applies each `FeatureConfig.output_shape` (the op gives `sample_shape + [dim]`)."""
    out = []
    for act, feature in zip(activations, features, strict=True):
        if feature.output_shape:
            act = tf.reshape(act, feature.output_shape.as_list() + [feature.table.dim])
        out.append(act)
    return out


def pack_subset(feature_config: Any, activations: list, present: list, subset: Any) -> Any:
    """The activations of the features of `subset` (key paths `present`, in its order), reshaped by their
    `output_shape` and packed in the nest of `subset`, whose leaves need not be in feature order."""
    position = {path: i for i, (path, _) in enumerate(features_lib.flatten_with_paths(feature_config))}
    wanted = [position[path] for path in present]
    flat_config = tf.nest.flatten(feature_config)
    reshaped = reshape_activations([activations[i] for i in wanted], [flat_config[i] for i in wanted])
    return tf.nest.pack_sequence_as(subset, reshaped)
