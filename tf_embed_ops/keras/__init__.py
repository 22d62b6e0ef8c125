"""Keras 3 integration: the `TPUEmbedding` layer, keras-rs's `DistributedEmbedding` on CPU, and a serving exporter
that needs no custom op.

Example:
    >>> from tf_embed_ops import keras as te_keras
    >>> layer = te_keras.TPUEmbedding(feature_config, tf.tpu.experimental.embedding.Adagrad(0.05))
    >>> layer = te_keras.DistributedEmbedding(keras_rs_feature_configs)   # keras-rs's layer, one import away
    >>> te_keras.export_for_serving(model, "/tmp/model", input_signature=spec)
"""

from tf_embed_ops.keras.distributed_embedding import DistributedEmbedding
from tf_embed_ops.keras.distributed_embedding_config import FeatureConfig, TableConfig
from tf_embed_ops.keras.layer import TPUEmbedding
from tf_embed_ops.keras.serialization import tiered_storage
from tf_embed_ops.keras.serving import export_for_serving, plain_lookup, serving_mode

__all__ = [
    "DistributedEmbedding",
    "FeatureConfig",
    "TPUEmbedding",
    "TableConfig",
    "export_for_serving",
    "plain_lookup",
    "serving_mode",
    "tiered_storage",
]
