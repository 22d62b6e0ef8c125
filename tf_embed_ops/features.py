"""The feature-config nest: its check, its key paths, and TensorFlow's output-shape rule.

Every front end (the mid-level classes, the Keras layers, the sharded layer, the config builder) describes its
features with a nest of `tf.tpu.experimental.embedding.FeatureConfig`; this module is the one place that checks
such a nest, names its leaves the way TensorFlow reports them (key paths joined with "/"), and says which shape a
feature's activation has for a given input (`output_shape`, `batch_output_shapes`, `activation_shape`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat

__all__ = [
    "activation_shape",
    "batch_output_shapes",
    "check_feature_configs",
    "check_feature_keys",
    "flatten_with_paths",
    "is_sequence",
    "output_shape",
]


def flatten_with_paths(structure: Any) -> list[tuple[str, Any]]:
    """`[(path, leaf)]` in `tf.nest.flatten` order, the path's keys joined with "/" as TensorFlow reports them.

    Args:
      structure: any nest.

    Returns:
      One `(path, leaf)` pair per leaf.
    """
    paths = _tf_compat.yield_flat_paths(structure)
    leaves = tf.nest.flatten(structure)
    return [("/".join(str(k) for k in path), leaf) for path, leaf in zip(paths, leaves, strict=False)]


def check_feature_configs(feature_config: Any, argument: str = "feature_config") -> list:
    """Checks that `feature_config` is a non-empty nest of `FeatureConfig`s; returns it flattened.

    Args:
      feature_config: the nest to check.
      argument: the argument's name, for the error.

    Returns:
      The flattened `FeatureConfig`s.

    Raises:
      ValueError: the nest is empty, or a leaf is not a `tf.tpu.experimental.embedding.FeatureConfig` (the
        message gives its position in the flattened nest and its key path).
    """
    flat = flatten_with_paths(feature_config)
    if not flat:
        raise ValueError(f"Argument `{argument}` holds no FeatureConfig; it must contain at least one.")
    for i, (path, feature) in enumerate(flat):
        if not isinstance(feature, tf.tpu.experimental.embedding.FeatureConfig):
            raise ValueError(
                f"Argument `{argument}` must hold tf.tpu.experimental.embedding.FeatureConfig objects; entry {i} of "
                f"the flattened nest is a {type(feature).__name__} (at {path!r})."
            )
    return [feature for _, feature in flat]


def check_feature_keys(feature_config: Any, given: Any, argument: str) -> None:
    """Names the missing and unexpected keys of a feature dict, and the expected ones.

    TensorFlow's structure check would print both nests in full without saying which key differs; a misspelled
    feature name is the common case, so this runs first (other structure mismatches still reach that check).

    Args:
      feature_config: the configured nest.
      given: the nest a caller passed (features, weights, gradients).
      argument: the caller's argument name, for the error.

    Raises:
      ValueError: a key of `feature_config` is missing from `given`, or `given` has one it does not.
    """
    missing, unexpected = [], []

    def compare(expected: Any, got: Any, prefix: str) -> None:
        if not (isinstance(expected, Mapping) and isinstance(got, Mapping)):
            return
        missing.extend(prefix + str(k) for k in expected if k not in got)
        unexpected.extend(prefix + str(k) for k in got if k not in expected)
        for k in expected:
            if k in got:
                compare(expected[k], got[k], f"{prefix}{k}/")

    compare(feature_config, given, "")
    if not missing and not unexpected:
        return
    expected_paths = [path for path, _ in flatten_with_paths(feature_config)]
    parts = []
    if missing:
        parts.append("missing " + ", ".join(repr(k) for k in sorted(missing)))
    for key in sorted(unexpected):
        close = difflib.get_close_matches(key, missing, n=1)  # a misspelling stands in for a missing key
        parts.append(f"unexpected {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ValueError(
        f"Argument `{argument}` does not have the structure of `feature_config`: {'; '.join(parts)}. "
        f"Expected keys: {', '.join(repr(p) for p in expected_paths)}."
    )


# ---------------------------------------------------------------------------------------------- output shapes
# TensorFlow's rule (TPUEmbedding._get_output_shapes_from_input_shapes / _get_output_shapes_from_batch_size):
# a sequence feature (max_sequence_length > 0 and no output_shape) fed a rank-2 sequence input [B, n] has output
# shape [B, max_sequence_length]; any other input drops its last axis unless it has only one. The activation
# appends the table's dim, and a FeatureConfig.output_shape replaces the whole sample shape.


def is_sequence(feature: Any) -> bool:
    """Whether `feature` is a sequence feature: `max_sequence_length > 0` and no `output_shape`."""
    return feature.max_sequence_length > 0 and not feature.output_shape


def output_shape(input_shape: Any, feature: Any, sequence_input: bool) -> tf.TensorShape:
    """The output shape (the activation's shape without the embedding dim) TensorFlow gives an input shape.

    Args:
      input_shape: the input's shape (anything `tf.TensorShape` takes).
      feature: its `FeatureConfig`.
      sequence_input: whether a rank-2 input is a sequence of ids per sample: true for sparse and ragged ids;
        from a bare shape (`build(per_replica_input_shapes=...)`), TensorFlow takes any last axis but 1.

    Returns:
      `[B, max_sequence_length]` for a rank-2 sequence input of a sequence feature; else the input shape
      without its last axis (a rank-1 shape as it is); unknown rank for an unknown rank.
    """
    shape = tf.TensorShape(input_shape)
    if shape.rank is None:
        return tf.TensorShape(None)
    dims = shape.as_list()
    if len(dims) == 2 and sequence_input and is_sequence(feature):
        return tf.TensorShape([dims[0], feature.max_sequence_length])
    return tf.TensorShape(dims if len(dims) == 1 else dims[:-1])


def batch_output_shapes(features: Sequence[Any], batch_size: int) -> list[tf.TensorShape]:
    """Output shapes from a per-replica batch size: `[B, max_sequence_length]` per sequence feature, else `[B]`."""
    return [
        tf.TensorShape([batch_size, f.max_sequence_length]) if is_sequence(f) else tf.TensorShape([batch_size])
        for f in features
    ]


def activation_shape(input_shape: Any, feature: Any, sequence_input: bool) -> list:
    """The activation's shape for an input shape: `output_shape + [dim]` when the FeatureConfig sets one, else
    `output_shape(input_shape, ...) + [dim]` (a list; `None` for unknown dims; raises for an unknown rank)."""
    if feature.output_shape:
        return feature.output_shape.as_list() + [feature.table.dim]
    return output_shape(input_shape, feature, sequence_input).as_list() + [feature.table.dim]
