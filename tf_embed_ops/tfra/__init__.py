"""TFRA's `dynamic_embedding` API over tf_embed_ops' dynamic tables: change one import.

    import tensorflow_recommenders_addons.dynamic_embedding as de   # before
    import tf_embed_ops.tfra as de                                   # after

- ``de.keras.layers.Embedding`` / ``SquashedEmbedding`` / ``FieldWiseEmbedding`` (Keras 3 layers).
- ``de.DynamicEmbeddingOptimizer(keras_optimizer)``: the tables train with the fused optimizer of the same family
  (SGD, Adagrad, Adam, Ftrl; Keras 3 optimizers), in place.
- ``de.get_variable`` / ``de.Variable`` (``lookup``, ``upsert``, ``remove``, ``size``, ``export``, ``clear``,
  ``restrict``), ``de.embedding_lookup``, ``de.embedding_lookup_sparse``, ``de.safe_embedding_lookup_sparse``.
- ``de.TimestampRestrictPolicy``, ``de.FrequencyRestrictPolicy``; ``de.enable_train_mode``,
  ``de.enable_inference_mode``.
- TFRA's checkpoints: ``python -m tf_embed_ops import-tfra SRC DST`` (``checkpoint_import``).

What TFRA has and this does not (Redis, HKV and GPU tables, Horovod, ...) raises ``NotImplementedError`` naming the
alternative (``refused``). docs/migrating.md is the guide.
"""

from __future__ import annotations

from tf_embed_ops._lazy_exports import lazy_exports
from tf_embed_ops.tfra import refused

_LAZY: dict[str, tuple[str, str | None]] = {
    "Variable": ("tf_embed_ops.tfra.variable", "Variable"),
    "get_variable": ("tf_embed_ops.tfra.variable", "get_variable"),
    "embedding_lookup": ("tf_embed_ops.tfra.lookup", "embedding_lookup"),
    "embedding_lookup_sparse": ("tf_embed_ops.tfra.lookup", "embedding_lookup_sparse"),
    "safe_embedding_lookup_sparse": ("tf_embed_ops.tfra.lookup", "safe_embedding_lookup_sparse"),
    "DynamicEmbeddingOptimizer": ("tf_embed_ops.tfra.optimizer", "DynamicEmbeddingOptimizer"),
    "RestrictPolicy": ("tf_embed_ops.tfra.policies", "RestrictPolicy"),
    "TimestampRestrictPolicy": ("tf_embed_ops.tfra.policies", "TimestampRestrictPolicy"),
    "FrequencyRestrictPolicy": ("tf_embed_ops.tfra.policies", "FrequencyRestrictPolicy"),
    "ModelMode": ("tf_embed_ops.tfra.mode", "ModelMode"),
    "enable_train_mode": ("tf_embed_ops.tfra.mode", "enable_train_mode"),
    "enable_inference_mode": ("tf_embed_ops.tfra.mode", "enable_inference_mode"),
    "get_model_mode": ("tf_embed_ops.tfra.mode", "get_model_mode"),
    "keras": ("tf_embed_ops.tfra.keras", None),
}


def _refusal(name: str) -> NotImplementedError | None:
    """A TFRA name this package refuses, with the reason and the alternative (`refused`)."""
    return refused.refusal(name) if name in refused.REFUSED else None


__all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY, refusal=_refusal)
