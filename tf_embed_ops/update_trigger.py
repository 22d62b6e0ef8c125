"""The fused-update trigger: activations whose backward pass updates the tables (the Keras training contract).

Keras' train step differentiates the loss only with respect to trainable weights, and the tables are not
trainable (only the fused send op changes them). So a layer owns one trainable float32 scalar, the *trigger*:
the lookup is made a function of it through `tf.custom_gradient`, and the trigger's gradient runs the update.
That gradient is a zero computed from a value read *after* the update (`_tf_compat.zero_depending_on`: exactly 0
even when the value is inf or NaN, and not foldable by Grappler), so the update is a data dependency of the gradient
Keras applies; a bare zero behind a control edge is not enough (Grappler was measured to drop the edge in Keras'
compiled train step with Adam), nor is `multiply_no_nan(value, 0)` on TensorFlow 2.16 (folded to a constant).

Every front end that trains inside Keras goes through `hang_update_on_trigger`: the static tables
(`embedding_ops.embedding_lookup_and_update`), the dynamic tables (`dynamic.engine.DynamicGroup`) and the
sharded layer (`distribute.keras_layer`); they differ only in the update they run and the value they probe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat

__all__ = ["hang_update_on_trigger", "probe_after"]


def hang_update_on_trigger(
    trigger: Any, lookup: Callable[[], Sequence[tf.Tensor]], update: Callable[[list[tf.Tensor]], tf.Tensor]
) -> list[tf.Tensor]:
    """Returns `lookup()`'s activations, made a function of `trigger` whose gradient runs `update`.

    Args:
      trigger: a float32 scalar (typically the value of the layer's trainable trigger variable).
      lookup: builds the activations (called once, now).
      update: called in the backward pass with the activations' gradients (float32; zeros where no gradient
        reaches an activation); runs the update and returns a scalar that depends on it by data (`probe_after`).

    Returns:
      The activations; the trigger's gradient is a zero computed from `update`'s result.
    """
    trigger = tf.convert_to_tensor(trigger, tf.float32)

    @tf.custom_gradient
    def looked_up(trigger_value):
        # custom_gradient itself links the outputs to `trigger_value` on the tape (eager record / graph
        # IdentityN), so no arithmetic on the trigger is needed.
        acts = list(lookup())

        def grad(*upstream):
            gradients = [
                tf.zeros_like(a) if g is None else tf.cast(g, tf.float32) for g, a in zip(upstream, acts, strict=False)
            ]
            probe = tf.cast(update(gradients), tf.float32)
            return tf.zeros_like(trigger_value) + _tf_compat.zero_depending_on(probe)

        return acts, grad

    return looked_up(trigger)


def probe_after(updates: Sequence[Any], variable: Any) -> tf.Tensor:
    """One element of `variable` read after `updates` (ops; None entries ran eagerly), as float32.

    A sparse read of one element: the fused ops put the variables in copy-on-read mode (as TensorFlow's sparse
    apply ops do), where a plain read would copy the whole table every step.
    """
    with tf.control_dependencies([u for u in updates if u is not None]):
        row = tf.raw_ops.ResourceGather(resource=variable.handle, indices=0, dtype=variable.dtype)
        return tf.cast(row[0], tf.float32)  # a 16-bit table's element (a no-op for float32)
