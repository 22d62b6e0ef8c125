"""One Keras `TPUEmbedding` layer's tables, mod-sharded over the workers of a collective job.

Each worker holds, per table, its rows `w, w + N, ...` (`layout.shard_rows`) and their optimizer slots in a
mid-level `tf_embed_ops.TPUEmbedding` of its own (plain variables of this process, one feature per table,
combiner "sum"): its fused update is the one the single-process kernels run, on the shard's local rows. A dynamic
table's shard is a dynamic table of its own holding the keys `shard_of_keys` gives this worker.

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
from tf_embed_ops.dynamic import table as table_lib

__all__ = ["LayerShards"]


class LayerShards:
    """The shards of one layer's tables on this worker, and the layer's feature -> table wiring."""

    def __init__(self, layer: Any, exchange: Exchange, worker: int):
        self.layer = layer
        self.exchange = exchange
        self.worker = int(worker)
        n = exchange.num_workers
        name = getattr(layer, "name", type(layer).__name__)
        if layer.tiered_tables:
            raise ValueError(
                f"Layer {name!r}: tiered tables {sorted(t.name for t in layer.tiered_tables)} cannot be sharded by "
                "the collective mode; keep them in memory (no storage=te.Tiered)."
            )
        self.static_tables = list(layer.embedding_tables)  # TableConfigs in table order, optimizers filled in
        self.dynamic_configs = list(layer.dynamic_tables)
        self.tables = self.static_tables + self.dynamic_configs
        self.features = tf.nest.flatten(layer.feature_config)
        for table in self.dynamic_configs:
            refused = [
                f"{what}={value!r}"
                for what, value in (
                    ("admission", table.admission),
                    ("eviction", table.eviction),
                    ("storage", getattr(table, "storage", None)),
                )
                if value is not None
            ]
            if table.key_dtype != tf.int64:
                refused.append(f"key_dtype={table.key_dtype.name}")
            if refused:
                raise ValueError(
                    f"Layer {name!r}, dynamic table {table.name!r}: {', '.join(refused)} is not supported in the "
                    "collective mode (a shard would count, admit or evict by its own keys, not as one process); "
                    "use an int64-keyed in-memory dynamic table without admission and eviction."
                )
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
            if table in self.dynamic_configs:
                continue
            if table.vocabulary_size < n:
                raise ValueError(
                    f"Layer {name!r}, table {table.name!r}: vocabulary_size {table.vocabulary_size} is smaller than "
                    f"the number of workers ({n}): every worker must hold at least one row."
                )
        # Per table, the positions of its features in the layer's flattened feature order (input order).
        self.table_features = [[i for i, f in enumerate(self.features) if f.table is t] for t in self.tables]
        shard_features = {}
        for table in self.static_tables:
            shard = copy.copy(table)
            shard.vocabulary_size = layout.shard_rows(table.vocabulary_size, n, self.worker)
            shard.combiner = "sum"  # the update's inputs are per-id gradient rows, one per sample
            shard.initializer = tf.zeros_initializer()  # `load` writes the rows
            shard_features[table.name] = tf.tpu.experimental.embedding.FeatureConfig(shard, name=table.name)
        self.shard = mid_level.TPUEmbedding(shard_features, None) if shard_features else None
        if self.shard is not None:
            self.shard.build()
        # A dynamic table's shard: a one-table mid-level object of its own (its group, its step counter), holding
        # the keys `shard_of_keys` gives this worker; the keys' rows start as one process's (a function of the key).
        self.dynamic_groups, self._dynamic_embeddings = [], []
        for table in self.dynamic_configs:
            shard = copy.copy(table)
            shard.combiner = "sum"
            embedding = mid_level.TPUEmbedding(
                {table.name: tf.tpu.experimental.embedding.FeatureConfig(shard, name=table.name)}, None
            )
            embedding.build()
            self.dynamic_groups.append(embedding.dynamic_group)
            self._dynamic_embeddings.append(embedding)
        # The padded shard height: every worker's static shard gathers as ceil(V / N) rows.
        self.padded_rows = [-(-t.vocabulary_size // n) for t in self.static_tables]
        self._gather = None  # traced once: every trace takes new collective keys
        self._gather_dynamic = None

    @property
    def trained(self) -> list[bool]:
        """Per table: does it train (frozen tables have no optimizer)."""
        return [t.optimizer is not None for t in self.tables]

    def is_dynamic(self, index: int) -> bool:
        return index >= len(self.static_tables)

    def dynamic_group(self, index: int):
        return self.dynamic_groups[index - len(self.static_tables)]

    def _pairs(self):
        """(layer variable, shard variable, table index) for every static table and slot."""
        layer_slots = self.layer.slot_variables
        shard_vars = self.shard.variables
        for i, table in enumerate(self.static_tables):
            yield self.layer.embedding_tables[table], shard_vars[table.name]["parameters"], i
            for slot, var in layer_slots[table].items():
                yield var, shard_vars[table.name][slot], i

    def load(self) -> None:
        """Shards <- the layer's full tables and slots (rows `w::N`)."""
        rows = layout.shard_slice(self.exchange.num_workers, self.worker)
        for full, shard, _ in self._pairs():
            shard.assign(tf.convert_to_tensor(full)[rows])
        n = self.exchange.num_workers
        for config, group in zip(self.dynamic_configs, self.dynamic_groups, strict=True):
            full = self.layer.dynamic_tables[config]
            (shard,) = group.tables.values()
            shard.import_contents(table_lib.restrict_to_shard(full.export(), n, self.worker))
            shard.step.assign(full.step)

    def store(self) -> None:
        """The layer's full tables and slots <- every worker's shard (an all-gather; every worker must call it)."""
        pairs = list(self._pairs())
        if pairs:
            for (layer_var, _, _), value in zip(pairs, self.full_values(), strict=True):
                layer_var.assign(value)
        if self.dynamic_configs:
            if self._gather_dynamic is None:
                self._gather_dynamic = _dynamic_gather_function(self)
            for config, group, contents in zip(
                self.dynamic_configs, self.dynamic_groups, self._gather_dynamic(), strict=True
            ):
                full = self.layer.dynamic_tables[config]
                full.import_contents(contents)
                (shard,) = group.tables.values()
                full.step.assign(shard.step)

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


_ROW_FIELDS = ("keys", "weights", "slots", "counts", "last_steps")


def _dynamic_gather_function(shards: LayerShards):
    """Every worker's dynamic shards, gathered: per table the full content (sorted by key) to import."""
    ex = shards.exchange

    @tf.function(autograph=False)
    def gather():
        out = []
        for group in shards.dynamic_groups:
            (table,) = group.tables.values()
            c = table.export()
            size = tf.shape(c["keys"], out_type=tf.int64)[0]
            # At least one row: TensorFlow's gather of an empty tensor crashes the process.
            most = tf.maximum(ex.all_reduce(tf.reshape(size, [1]), "Max")[0], 1)
            pad = most - size
            valid = ex.all_gather(tf.pad(tf.ones([size], tf.int64), [[0, pad]]), most)
            keep = tf.equal(valid, 1)
            gathered = {}
            kept = tf.reduce_sum(valid)
            for field in _ROW_FIELDS:
                value = c[field]
                if value.shape.rank == 2 and value.shape[1] == 0:  # no slots (SGD): nothing to send (see above)
                    gathered[field] = tf.zeros([kept, 0], value.dtype)
                    continue
                paddings = [[0, pad]] + [[0, 0]] * (value.shape.rank - 1)
                gathered[field] = tf.boolean_mask(ex.all_gather(tf.pad(value, paddings), most), keep)
            order = tf.argsort(gathered["keys"], stable=True)
            full = {field: tf.gather(value, order) for field, value in gathered.items()}
            for field in ("pending_keys", "pending_counts", "pending_last_steps"):  # no admission in this mode
                full[field] = tf.zeros([0], tf.int64)
            out.append(full)
        return out

    return gather
