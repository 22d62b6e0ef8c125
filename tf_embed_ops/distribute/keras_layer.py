"""`ShardedEmbeddingLayer`: the Keras 3 embedding layer over a `ShardedTPUEmbedding` (tables on parameter servers).

Same training contract as `tf_embed_ops.keras.TPUEmbedding`: in training mode the lookup goes through a custom
gradient whose backward pass runs the per-shard fused updates, and the layer's trainable scalar *update
trigger* receives a zero gradient that depends on those updates, so whoever applies the model's gradients runs
them.  The tables and slots are the embedding's `ShardedVariable`s, tracked under `_tpu_embedding` (so
`tf.train.Checkpoint(model)` keys match the single-machine layer); they are not Keras weights.

Keras 3 (3.15) has no ParameterServerStrategy support in `Model.fit` (it cannot drive a `ClusterCoordinator`;
fit raises "To use this dataset, you need to pass this dataset to ClusterCoordinator.create_per_worker_dataset"),
so under the strategy train with a custom step scheduled by `ClusterCoordinator.schedule` (docs/distributed.md).
Without a strategy (shards on one machine) `fit` works as for the unsharded layer.

Example:
    >>> with strategy.scope():
    ...   layer = ShardedEmbeddingLayer(feature_config, tf.tpu.experimental.embedding.Adagrad(0.1))
    ...   model = keras.Sequential([...])   # uses layer
"""

from __future__ import annotations

from typing import Any

import keras

from tf_embed_ops.distribute.sharded_embedding import ShardedTPUEmbedding
from tf_embed_ops.keras.layer import activation_specs, apply_frozen_tables, layer_activations

__all__ = ["ShardedEmbeddingLayer"]


class ShardedEmbeddingLayer(keras.layers.Layer):
    """Embedding lookups over DIV-sharded tables, trained by the tables' TPU optimizers on the backward pass.

    `call(features, weights=None, training=None)` returns activations in the nest of `feature_config`, as
    `tf_embed_ops.keras.TPUEmbedding` does.

    Example:
        >>> layer = ShardedEmbeddingLayer(feature_config, tf.tpu.experimental.embedding.SGD(0.1), num_shards=2)
        >>> acts = layer({"watched": ids}, training=True)
    """

    def __init__(
        self,
        feature_config: Any,
        optimizer: Any = None,
        pipeline_execution_with_tensor_core: bool = False,
        *,
        strategy: Any = None,
        num_shards: int | None = None,
        frozen_tables: Any = None,
        **kwargs: Any,
    ):
        """Creates the layer, its sharded tables/slots and the update trigger.

        Args:
          feature_config, optimizer, pipeline_execution_with_tensor_core: as `tf_embed_ops.TPUEmbedding`.
          strategy, num_shards: as `ShardedTPUEmbedding`.
          frozen_tables: as `tf_embed_ops.keras.TPUEmbedding`: names of the tables that are looked up but never
            trained (no optimizer, not even the default `optimizer`, and no slots). Every other table must have an
            optimizer, its own or the default one.
          **kwargs: `keras.layers.Layer` arguments (name, ...).

        Raises:
          ValueError: as `ShardedTPUEmbedding`; as `tf_embed_ops.keras.TPUEmbedding` for a table without an
            optimizer that `frozen_tables` does not name, or a `frozen_tables` name that is not a table or names a
            table with its own optimizer.
        """
        super().__init__(**kwargs)
        # The same check (and errors) as te.keras.TPUEmbedding; the frozen tables keep no optimizer.
        self._frozen_tables, optimizer = apply_frozen_tables(feature_config, optimizer, frozen_tables)
        # Custom ops: no XLA; ids stay integers and Sparse/Ragged inputs stay composite.
        self.supports_jit = False
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        self._tpu_embedding = ShardedTPUEmbedding(
            feature_config, optimizer, pipeline_execution_with_tensor_core, strategy=strategy, num_shards=num_shards
        )
        self._tpu_embedding.build()
        self._update_trigger = self.add_weight(
            name="table_update_trigger", shape=(), initializer="zeros", dtype="float32", trainable=True, autocast=False
        )
        self.built = True

    @property
    def embedding(self) -> ShardedTPUEmbedding:
        """The underlying `ShardedTPUEmbedding` (tables, slots, shard layout)."""
        return self._tpu_embedding

    @property
    def embedding_tables(self) -> dict:
        """`{TableConfig: ShardedVariable}`."""
        return self._tpu_embedding.embedding_tables

    def build(self, input_shape: Any = None) -> None:  # variables exist from __init__
        self.built = True

    def call(self, features: Any, weights: Any = None, training: bool | None = None) -> Any:
        store = self._tpu_embedding
        inputs, shapes = store.normalize_inputs(features, weights)
        store.merge_output_shapes(shapes)
        # Its groups are the sharded kinds (`sharded_groups`): the training lookup hangs the per-server updates on the
        # trigger's gradient, as `te.keras.TPUEmbedding`'s does.
        return layer_activations(store, inputs, self._update_trigger, training)

    def compute_output_spec(self, features: Any, weights: Any = None, training: bool | None = None) -> Any:
        return activation_specs(features, self._tpu_embedding.feature_config)
