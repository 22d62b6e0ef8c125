"""The fused training ops of dynamic tables: `TfEmbed>DynamicEmbeddingActivations` (lookup; a training lookup
inserts admitted keys) and `TfEmbed>DynamicSendTPUEmbeddingGradients` (the update, then the eviction policies)."""

from __future__ import annotations

import tensorflow as tf

from tf_embed_ops import _loader
from tf_embed_ops.dynamic.op_inputs import feature_arguments, feature_inputs, handle_tensors, step_tensor
from tf_embed_ops.embedding_ops import checked_combiners, learning_rate_values, serialized_config

__all__ = ["dynamic_embedding_activations", "dynamic_send_tpu_embedding_gradients"]


def dynamic_embedding_activations(
    features, tables, step, config, combiners=None, training: bool = False, name=None
) -> list[tf.Tensor]:
    """Looks up and combines every feature's embeddings over dynamic tables (the forward pass).

    As :func:`tf_embed_ops.embedding_ops.embedding_activations`, with keys (int64 or string ids) in place of row
    ids.  ``training=True`` inserts admitted new keys and stamps ``step`` on every key seen; ``training=False``
    changes nothing.  A key without a row reads zeros.

    Args:
      features: list of FeatureInput whose ``ids`` are the keys, in feature-descriptor order.
      tables: dynamic table handles, in table order.
      step: int64 scalar, the global step.
      config: TPUEmbeddingConfiguration (proto or bytes): per table dim, vocabulary_size = max_rows, optimizer.
      combiners: as for the static op.
      training: whether this is the training lookup.
      name: op name.

    Returns:
      One float32 activation per feature.

    Example:
      >>> acts = dynamic_embedding_activations([normalize_feature(ids)], [h], step, config, training=True)
    """
    with tf.name_scope(name or "dynamic_embedding_activations"):
        feats = feature_inputs(features, "features")
        return _loader.load_ops().tf_embed_dynamic_embedding_activations(
            **feature_arguments(feats),
            tables=handle_tensors(tables, "tables"),
            step=step_tensor(step),
            config=serialized_config(config),
            combiners=checked_combiners(combiners),
            training=bool(training),
        )


def dynamic_send_tpu_embedding_gradients(
    gradients,
    learning_rates,
    features,
    tables,
    step,
    config,
    combiners=None,
    check_numerics=False,
    name=None,
    validate_only=False,
):
    """Applies one training step to dynamic tables in place, then their end-of-step eviction.

    As :func:`tf_embed_ops.embedding_ops.send_tpu_embedding_gradients`, with keys in place of row ids and the
    table handles (which hold their optimizer slots) in place of the variables.  Keys without a row get no
    update.  A rejected call changes nothing.

    Args:
      gradients: one float32 tensor per feature, shaped like its activation.
      learning_rates: one scalar per dynamic learning-rate tag (float, tensor or zero-argument callable).
      features: the FeatureInput list the activations were computed from.
      tables: dynamic table handles, in table order.
      step: int64 scalar, the global step this update ends.
      config, combiners, check_numerics: as for the static op.
      name: op name.
      validate_only: run every check (with check_numerics, the update computed without writing) and write
        nothing; run before another op that writes, it makes the pair all-or-nothing.

    Returns:
      The update op (eagerly: None after it ran).

    Example:
      >>> dynamic_send_tpu_embedding_gradients(grads, [], feats, [h], step, config)
    """
    with tf.name_scope(name or "dynamic_send_tpu_embedding_gradients"):
        feats = feature_inputs(features, "features")
        grads = [tf.convert_to_tensor(g, tf.float32) for g in gradients]
        if len(grads) != len(feats):
            raise ValueError(f"gradients: expected one per feature ({len(feats)}), got {len(grads)}")
        return _loader.load_ops().tf_embed_dynamic_send_tpu_embedding_gradients(
            inputs=grads,
            learning_rates=learning_rate_values(learning_rates),
            **feature_arguments(feats),
            tables=handle_tensors(tables, "tables"),
            step=step_tensor(step),
            config=serialized_config(config),
            combiners=checked_combiners(combiners),
            check_numerics=bool(check_numerics),
            validate_only=bool(validate_only),
        )
