"""The update's parts: the gradients the fused op takes, and the 16-bit rounding step.

`gradients_for_send` turns a nest of activation gradients into the op's form (TensorFlow's checks and warning;
a None gradient is a zero; `output_shape` undone); `rounding_arguments` / `advance_rounding_step` give the send
op its stochastic-rounding step and count it once the step's updates have run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from tf_embed_ops import features as features_lib
from tf_embed_ops import table_config
from tf_embed_ops.engine import lookup

__all__ = ["advance_rounding_step", "gradients_for_send", "rounding_arguments"]


def gradients_for_send(feature_config: Any, gradients: Any, inputs: Sequence[Any]) -> list:
    """The activation gradients as the fused op takes them: float32, in feature order, `output_shape` undone.

    Args:
      feature_config: the nest of `FeatureConfig`s.
      gradients: a nest matching it of gradients (None: no gradient, a zero is sent with TensorFlow's warning).
      inputs: the batch's `FeatureInput`s, in feature order.

    Returns:
      One float32 gradient per feature.

    Raises:
      ValueError: the nest does not match, a gradient is not a Tensor or has the wrong shape.
    """
    try:
        tf.nest.assert_same_structure(feature_config, gradients)
    except (ValueError, TypeError) as e:
        raise ValueError(f"Argument `gradients` must have the structure of `feature_config`: {e}") from e
    flat = []
    for (path, gradient), feature, feature_input in zip(
        features_lib.flatten_with_paths(gradients), tf.nest.flatten(feature_config), inputs, strict=False
    ):
        # The expected shape is the activation's: recompute it from the op's shape function (cheap, static).
        expected = lookup.static_activation_shape(feature_input, feature)
        if gradient is None:
            logging.warning(
                "No gradient passed for feature %s, sending zero gradient. This may not be correct "
                "behavior for certain optimizers like Adam.",
                path,
            )
            gradient = tf.zeros(lookup.activation_shape_tensor(feature_input, feature), tf.float32)
        elif not isinstance(gradient, tf.Tensor):
            raise ValueError(f"found non-tensor type: {type(gradient)} at path {path}.")
        elif not gradient.shape.is_compatible_with(expected):
            raise ValueError(f"Found gradient of shape {gradient.shape} at path {path}. Expected shape {expected}.")
        if feature.output_shape:
            gradient = tf.reshape(gradient, lookup.lookup_shape_tensor(feature_input, feature.table.dim))
        flat.append(tf.cast(gradient, tf.float32))
    return flat


def rounding_arguments(tables: Sequence[Any], step: tf.Variable | None, table_ids: Sequence[int] | None = None) -> dict:
    """The send op's rounding arguments for 16-bit tables (docs/low_precision.md), {} without them: the
    rounding per table, with stochastic rounding the current value of the step counter `step`, and, when
    `table_ids` is given (from `tiered.engine.rounding_table_ids`), the op's `rounding_table_ids`."""
    if not any(table_config.is_low_precision(t) for t in tables):
        return {}
    args = {"rounding": [table_config.rounding(t) for t in tables]}
    if step is not None:
        args["rounding_step"] = step.read_value()
    if table_ids is not None:
        args["rounding_table_ids"] = list(table_ids)
    return args


def advance_rounding_step(step: tf.Variable | None, updates: Sequence[Any]) -> None:
    """Counts one step once `updates` (the send ops of the step; None entries: ran eagerly) have run, so a
    rejected step leaves the counter unchanged."""
    if step is None:
        return
    with tf.control_dependencies([u for u in updates if u is not None]):
        step.assign_add(1)
