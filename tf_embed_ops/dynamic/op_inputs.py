"""The argument conversions of the dynamic-table op wrappers: keys, table handles, feature inputs and steps, each
checked for static misuse with a `ValueError` naming the argument (the ops validate the rest at run time)."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_embed_ops import embedding_ops
from tf_embed_ops.embedding_ops import FeatureInput, int64_scalar

__all__ = ["feature_arguments", "feature_inputs", "handle_tensor", "handle_tensors", "keys_tensor", "step_tensor"]


def keys_tensor(keys, argument: str) -> tf.Tensor:
    """int64 or string keys, rank 1 (integers are widened to int64)."""
    if isinstance(keys, (tf.SparseTensor, tf.RaggedTensor)):
        raise ValueError(f"{argument}: expected a dense 1-D tensor of keys, got {type(keys).__name__}")
    keys = tf.convert_to_tensor(keys)
    if keys.dtype == tf.string:
        pass
    elif keys.dtype.is_integer:
        keys = tf.cast(keys, tf.int64)
    else:
        raise ValueError(f"{argument}: keys must be integers or strings, got {keys.dtype.name}")
    if keys.shape.rank not in (None, 1):
        raise ValueError(f"{argument}: keys must be rank 1, got shape {keys.shape}")
    return keys


def handle_tensor(table, argument: str, kind: str = "dynamic") -> tf.Tensor:
    """The resource handle of a table object (its `handle`) or a handle itself; `kind` names the table kind in
    the error."""
    handle = getattr(table, "handle", table)
    if not isinstance(handle, tf.Tensor) or handle.dtype != tf.resource:
        raise ValueError(f"{argument}: expected a {kind} table handle (resource tensor), got {type(table).__name__}")
    return handle


def handle_tensors(tables, argument: str, kind: str = "dynamic") -> list[tf.Tensor]:
    if not isinstance(tables, Sequence) or not tables:
        raise ValueError(f"{argument}: expected a non-empty list of {kind} table handles")
    return [handle_tensor(t, f"{argument}[{i}]", kind) for i, t in enumerate(tables)]


def feature_arguments(feats: list) -> dict:
    """The fused ops' per-feature list inputs of normalised `FeatureInput`s, by the ops' argument names."""
    return {
        "sample_indices_or_row_splits": [f.sample_indices_or_row_splits for f in feats],
        "keys": [f.ids for f in feats],
        "aggregation_weights": [f.weights for f in feats],
        "sample_shapes": [f.sample_shape for f in feats],
    }


def feature_inputs(features, argument: str) -> list[FeatureInput]:
    """FeatureInputs whose ids may be strings (kept) or integers (widened to int64)."""
    return embedding_ops.as_feature_inputs(features, argument, convert_ids=keys_tensor)


def step_tensor(step) -> tf.Tensor:
    return int64_scalar(step, "step")
