"""One Keras `TPUEmbedding` layer's tables, mod-sharded over the workers of a collective job.

Each worker holds, per table, its rows `w, w + N, ...` (`layout.shard_rows`) and their optimizer slots in a
mid-level `tf_embed_ops.TPUEmbedding` of its own (plain variables of this process, one feature per table,
combiner "sum"): its fused update is the one the single-process kernels run, on the shard's local rows.

The layer keeps its full tables (the checkpoint form: a checkpoint holds the single-process keys and shapes).
`load` slices them into the shards (at the start of training, after a restore); `store` assembles them back from
every worker's shard with an all-gather (before callbacks and checkpoints see the layer).

Example:
    >>> shards = LayerShards(layer, exchange, worker=0)
    >>> shards.load()          # shards <- layer
    >>> ...                    # training steps
    >>> shards.store()         # layer <- all shards (every worker calls it)
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops import tpu_embedding as mid_level
from tf_embed_ops.distribute.collective import layout
from tf_embed_ops.distribute.collective.exchange import Exchange

__all__ = ["LayerShards"]


class LayerShards:
    """The shards of one layer's tables on this worker, and the layer's feature -> table wiring."""

    def __init__(self, layer: Any, exchange: Exchange, worker: int):
        self.layer = layer
        self.exchange = exchange
        self.worker = int(worker)
        n = exchange.num_workers
        name = getattr(layer, "name", type(layer).__name__)
        if layer.dynamic_tables:
            raise ValueError(
                f"Layer {name!r}: dynamic tables {sorted(t.name for t in layer.dynamic_tables)} are not sharded by "
                "the collective mode yet; use static tables (te.TableConfig) in this mode."
            )
        if layer.tiered_tables:
            raise ValueError(
                f"Layer {name!r}: tiered tables {sorted(t.name for t in layer.tiered_tables)} cannot be sharded by "
                "the collective mode; keep them in memory (no storage=te.Tiered)."
            )
        self.tables = list(layer.embedding_tables)  # TableConfigs in table order, optimizers filled in
        self.features = tf.nest.flatten(layer.feature_config)
        for table in self.tables:
            if getattr(table, "quantization_config", None) is not None:
                raise ValueError(
                    f"Layer {name!r}, table {table.name!r}: quantization_config is not supported in the collective "
                    "mode (the lookup's straight-through gradient is the kernel's, not an autodiff of the rounding)."
                )
            for attribute in ("storage_dtype", "slot_storage_dtype"):
                dtype = getattr(table, attribute, None)
                if dtype is not None and tf.as_dtype(dtype) != tf.float32:
                    raise ValueError(
                        f"Layer {name!r}, table {table.name!r}: {attribute}={tf.as_dtype(dtype).name} is not supported "
                        "in the collective mode (its rounding would not be the single process's); use float32."
                    )
            if table.vocabulary_size < n:
                raise ValueError(
                    f"Layer {name!r}, table {table.name!r}: vocabulary_size {table.vocabulary_size} is smaller than "
                    f"the number of workers ({n}): every worker must hold at least one row."
                )
        # Per table, the positions of its features in the layer's flattened feature order (input order).
        self.table_features = [[i for i, f in enumerate(self.features) if f.table is t] for t in self.tables]
        shard_features = {}
        for table in self.tables:
            shard = copy.copy(table)
            shard.vocabulary_size = layout.shard_rows(table.vocabulary_size, n, self.worker)
            shard.combiner = "sum"  # the update's inputs are per-id gradient rows, one per sample
            shard.initializer = tf.zeros_initializer()  # `load` writes the rows
            shard_features[table.name] = tf.tpu.experimental.embedding.FeatureConfig(shard, name=table.name)
        self.shard = mid_level.TPUEmbedding(shard_features, None)
        self.shard.build()
        self.shard_tables = self.shard.table_configs
        # The padded shard height: every worker's shard gathers as ceil(V / N) rows.
        self.padded_rows = [-(-t.vocabulary_size // n) for t in self.tables]
        self._gather = None  # traced once: every trace takes new collective keys

    @property
    def trained(self) -> list[bool]:
        """Per table: does it train (frozen tables have no optimizer)."""
        return [t.optimizer is not None for t in self.tables]

    def _pairs(self):
        """(layer variable, shard variable, table index) for every table and slot."""
        layer_slots = self.layer.slot_variables
        shard_vars = self.shard.variables
        for i, table in enumerate(self.tables):
            yield self.layer.embedding_tables[table], shard_vars[table.name]["parameters"], i
            for slot, var in layer_slots[table].items():
                yield var, shard_vars[table.name][slot], i

    def load(self) -> None:
        """Shards <- the layer's full tables and slots (rows `w::N`)."""
        rows = layout.shard_slice(self.exchange.num_workers, self.worker)
        for full, shard, _ in self._pairs():
            shard.assign(tf.convert_to_tensor(full)[rows])

    def store(self) -> None:
        """The layer's full tables and slots <- every worker's shard (an all-gather; every worker must call it)."""
        pairs = list(self._pairs())
        for (layer_var, _, _), value in zip(pairs, self.full_values(), strict=True):
            layer_var.assign(value)

    def full_values(self) -> list[tf.Tensor]:
        """The full tables and slots assembled from every worker's shard, in `_pairs` order (collective)."""
        if self._gather is None:
            self._gather = _gather_function(self, list(self._pairs()))
        return self._gather()


def _unshard_order(vocabulary_size: int, num_workers: int, padded: int) -> np.ndarray:
    """Row r of the full table is row `(r % N) * padded + r // N` of the gathered, padded shards."""
    r = np.arange(vocabulary_size, dtype=np.int64)
    return (r % num_workers) * padded + r // num_workers


def _gather_function(shards: LayerShards, pairs: list):
    n = shards.exchange.num_workers

    @tf.function(autograph=False)
    def gather():
        out = []
        for _, var, i in pairs:
            value = tf.convert_to_tensor(var)
            pad = shards.padded_rows[i] - tf.shape(value)[0]
            padded = tf.pad(value, [[0, pad], [0, 0]])
            gathered = shards.exchange.all_gather(padded)
            order = _unshard_order(shards.tables[i].vocabulary_size, n, shards.padded_rows[i])
            out.append(tf.gather(gathered, order))
        return out

    return gather
