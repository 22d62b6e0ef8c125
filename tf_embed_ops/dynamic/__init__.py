"""Dynamic-vocabulary tables: embeddings keyed by any int64 or string id, rows created as ids arrive.

- ``DynamicTableConfig`` (also ``te.DynamicTableConfig``): a table configuration accepted wherever a
  ``TableConfig`` is.
- ``FrequencyAdmission`` (exact counts), ``BloomAdmission`` (a counting Bloom filter of fixed memory): give a key
  a row after ``min_count`` sightings; ``LRU``, ``LFU``, ``TTL``, ``L2Norm``, ``DecayedLFU``, ``CountAndAge``,
  ``Score``: eviction policies applied at step boundaries.
- ``shard_of_keys``: which parameter-server shard holds a key (plain TensorFlow ops); ``string_keys``: the int64
  key of a string id, as the ops compute it.
- ``DynamicTable``: the table object (resource, checkpoints, statistics, explicit eviction).

docs/dynamic_tables.md describes the semantics.
"""

from __future__ import annotations

from tf_embed_ops._lazy_exports import lazy_exports

_LAZY: dict[str, tuple[str, str]] = {
    "DynamicTableConfig": ("tf_embed_ops.dynamic.config", "DynamicTableConfig"),
    "FrequencyAdmission": ("tf_embed_ops.dynamic.policies", "FrequencyAdmission"),
    "LRU": ("tf_embed_ops.dynamic.policies", "LRU"),
    "LFU": ("tf_embed_ops.dynamic.policies", "LFU"),
    "TTL": ("tf_embed_ops.dynamic.policies", "TTL"),
    "BloomAdmission": ("tf_embed_ops.dynamic.policies", "BloomAdmission"),
    "L2Norm": ("tf_embed_ops.dynamic.policies", "L2Norm"),
    "DecayedLFU": ("tf_embed_ops.dynamic.policies", "DecayedLFU"),
    "CountAndAge": ("tf_embed_ops.dynamic.policies", "CountAndAge"),
    "Score": ("tf_embed_ops.dynamic.policies", "Score"),
    "shard_of_keys": ("tf_embed_ops.dynamic.sharding", "shard_of_keys"),
    "string_keys": ("tf_embed_ops.dynamic.ops", "string_keys_to_int64"),
    "DynamicTable": ("tf_embed_ops.dynamic.table", "DynamicTable"),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY)
