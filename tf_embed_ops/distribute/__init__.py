"""Scale-out with `tf.distribute.experimental.ParameterServerStrategy` (docs/distributed.md).

* `ShardedTPUEmbedding`: the mid-level API with tables and slots DIV row-sharded over parameter servers;
  lookups and the fused update run on the server that owns the rows; checkpoints match the single-process class.
* `ShardedEmbeddingLayer`: the Keras 3 layer over a `ShardedTPUEmbedding` (imported on first use).
* `SyncSparseAggregator`: synchronous (SyncReplicas-style) rounds through per-shard sparse accumulators.
* `fit`: Keras `fit` for a compiled Keras 3 model on the cluster (callbacks, History, checkpoints); under
  `MultiWorkerMirroredStrategy`, synchronous training with the tables sharded over the workers (`collective`).
* `WorkerLostError`: what the collective `fit` raises when a worker stops answering.
* `create_local_cluster`: an in-process localhost cluster for tests and examples.
* `python -m tf_embed_ops.distribute.server`: runs a ps/worker task from TF_CONFIG with our kernels loaded.
* `python -m tf_embed_ops.distribute.launch --ps 2 --workers 2 -- python train.py`: a local job of processes;
  `--workers 2 --collective -- python train.py` runs the command on every worker of a collective job.
* `div_shard_sizes`, `div_shard_boundaries`, `num_table_shards`: the DIV sharding arithmetic.

Example:
    >>> from tf_embed_ops import distribute as ted
    >>> strategy = ted.create_local_cluster(num_workers=2, num_ps=2)
    >>> with strategy.scope():
    ...   emb = ted.ShardedTPUEmbedding(feature_config, tf.tpu.experimental.embedding.SGD(0.1))
"""

from __future__ import annotations

from tf_embed_ops.distribute.collective.loop import WorkerLostError
from tf_embed_ops.distribute.fit import TrainingInterruptedError, fit
from tf_embed_ops.distribute.local_cluster import create_local_cluster
from tf_embed_ops.distribute.sharded_embedding import ShardedTPUEmbedding
from tf_embed_ops.distribute.sharding import div_shard_boundaries, div_shard_sizes, num_table_shards
from tf_embed_ops.distribute.sync_aggregator import SyncSparseAggregator

__all__ = [
    "ShardedEmbeddingLayer",
    "ShardedTPUEmbedding",
    "SyncSparseAggregator",
    "TrainingInterruptedError",
    "WorkerLostError",
    "create_local_cluster",
    "div_shard_boundaries",
    "div_shard_sizes",
    "fit",
    "num_table_shards",
]


def __getattr__(name: str):
    # Lazy: the Keras layer imports keras, which the strategy-only path does not need.
    if name == "ShardedEmbeddingLayer":
        from tf_embed_ops.distribute.keras_layer import ShardedEmbeddingLayer

        return ShardedEmbeddingLayer
    raise AttributeError(f"module 'tf_embed_ops.distribute' has no attribute {name!r}")
