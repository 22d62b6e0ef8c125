"""Keras optimizers as table optimizers: `tf_embed_ops.optimizer_mapping`, under the name the Keras docs use.

The mapping lives below the mid-level API (which converts a Keras optimizer given to `tf_embed_ops.TPUEmbedding`
too), so it is defined there and only named here.
"""

from tf_embed_ops.optimizer_mapping import STRING_OPTIMIZERS, KerasLearningRate, to_table_optimizer

__all__ = ["KerasLearningRate", "STRING_OPTIMIZERS", "to_table_optimizer"]
