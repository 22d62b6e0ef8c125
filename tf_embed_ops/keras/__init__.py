"""Keras 3 integration: the `TPUEmbedding` layer and a serving exporter that needs no custom op.

Example:
    >>> from tf_embed_ops import keras as te_keras
    >>> layer = te_keras.TPUEmbedding(feature_config, tf.tpu.experimental.embedding.Adagrad(0.05))
    >>> te_keras.export_for_serving(model, "/tmp/model", input_signature=spec)
"""
from tf_embed_ops.keras.layer import TPUEmbedding
from tf_embed_ops.keras.serving import export_for_serving, plain_lookup, serving_mode

__all__ = ["TPUEmbedding", "export_for_serving", "plain_lookup", "serving_mode"]
