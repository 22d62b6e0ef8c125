"""`ShardedDynamicTable`: one dynamic table split by key over `DynamicTable` shards, checkpointed as one table
(docs/dynamic_tables.md, "Sharding")."""

from __future__ import annotations

import copy
from typing import Any

import tensorflow as tf

from tf_embed_ops.dynamic import checkpoint_check
from tf_embed_ops.dynamic.sharding import shard_of_keys
from tf_embed_ops.dynamic.table import DynamicTable
from tf_embed_ops.dynamic.table_state import (
    EXPORT_TENSORS,
    CheckpointTensors,
    all_eager,
    checked_step,
    policy_state_checks,
    restrict_to_shard,
    sorted_union,
    tensor_shapes,
    variable_name,
)

__all__ = ["ShardedDynamicTable"]


class ShardedDynamicTable(CheckpointTensors, tf.Module):
    """A dynamic table split by key over `num_shards` `DynamicTable`s, checkpointed as one table.

    Its checkpoint is the union of the shards sorted by key, in the format of one `DynamicTable`, so it restores
    into any number of shards, or into a single `DynamicTable` at the same place in a checkpoint (and the reverse).
    The shards are not checkpoint dependencies of their own: only the union is written, once.

    Args:
      config: a `te.DynamicTableConfig`.
      num_shards: number of shards (>= 1).
      devices: optional device per shard (e.g. the parameter servers); shard i's resource is created there.

    Raises:
      ValueError: if `num_shards` < 1 or `devices` has another length.
    """

    def __init__(self, config: Any, num_shards: int, devices: list | None = None):
        super().__init__(name=variable_name(config.name))
        if int(num_shards) < 1:
            raise ValueError(f"ShardedDynamicTable {config.name!r}: num_shards must be >= 1, got {num_shards}")
        if devices is not None and len(devices) != int(num_shards):
            raise ValueError(f"ShardedDynamicTable {config.name!r}: {len(devices)} devices for {num_shards} shards")
        shards = []
        for i in range(int(num_shards)):
            with tf.device(devices[i] if devices else None):
                shards.append(DynamicTable(config, num_shards=int(num_shards), shard_index=i))
        self._shard_tuple = tuple(shards)  # a tuple of resources; kept out of the checkpoint below
        self._config = config

    @property
    def shards(self) -> tuple[DynamicTable, ...]:
        return self._shard_tuple

    @property
    def config(self) -> Any:
        return self._config

    @property
    def table_name(self) -> str:
        return self._shard_tuple[0].table_name

    @property
    def key_dtype(self) -> tf.DType:
        return self._shard_tuple[0].key_dtype

    @property
    def dim(self) -> int:
        return self._shard_tuple[0].dim

    def export(self) -> dict[str, tf.Tensor]:
        """The union of the shards' contents, sorted by key (what one unsharded table would export)."""
        return sorted_union([s.export() for s in self._shard_tuple])

    def stats(self) -> dict[str, tf.Tensor]:
        """Every counter summed over the shards."""
        per_shard = [s.stats() for s in self._shard_tuple]
        return {k: tf.add_n([p[k] for p in per_shard]) for k in per_shard[0]}

    def lookup(self, ids: Any) -> tf.Tensor:
        """Serving lookup over the shards (each id read from its own shard); never inserts."""
        first = self._shard_tuple[0]
        ids = first.check_ids(ids)
        flat = tf.reshape(ids, [-1])
        n = len(self._shard_tuple)
        if n == 1:
            return first.lookup(ids)
        which = shard_of_keys(flat, n)
        parts = tf.dynamic_partition(flat, which, n)
        positions = tf.dynamic_partition(tf.range(tf.size(flat)), which, n)
        rows = [s.lookup(p) for s, p in zip(self._shard_tuple, parts, strict=True)]
        out = tf.dynamic_stitch(positions, rows)
        return tf.reshape(out, tf.concat([tf.shape(ids, out_type=tf.int32), [first.dim]], 0))

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = dict(super()._trackable_children(save_type, **kwargs))
        if save_type == "checkpoint":  # a SavedModel must still reach the shards' resources
            children.pop("_shard_tuple", None)
        return children

    def _export_to_saved_model_graph(self, object_map, tensor_map, **kwargs):
        # As DynamicTable's: the SavedModel serialises a copy that must use the shards' copies (exported first).
        tensors = super()._export_to_saved_model_graph(object_map=object_map, tensor_map=tensor_map, **kwargs)
        new = copy.copy(self)
        new.__dict__["_shard_tuple"] = tuple(object_map.get(s, s) for s in self._shard_tuple)
        object_map[self] = new
        return tensors

    def _serialize_to_tensors(self) -> dict[str, tf.Tensor]:
        out = self.export()
        out["step"] = self._shard_tuple[0].step.read_value()
        parts = [s.export_policy_state() for s in self._shard_tuple]
        if "bloom_counters" in parts[0]:
            out["bloom_counters"] = tf.concat([p["bloom_counters"] for p in parts], 0)
        if "decayed_keys" in parts[0]:
            keys = tf.concat([p["decayed_keys"] for p in parts], 0)
            order = tf.argsort(keys, stable=True)
            out["decayed_keys"] = tf.gather(keys, order)
            out["decayed_counts"] = tf.gather(tf.concat([p["decayed_counts"] for p in parts], 0), order)
        return out

    def evicted_keys(self, include_refused: bool = False, strict: bool = True) -> tuple[tf.Tensor, tf.Tensor]:
        """Every shard's `DynamicTable.evicted_keys`, concatenated in shard order."""
        parts = [s.evicted_keys(include_refused, strict) for s in self._shard_tuple]
        return tf.concat([p[0] for p in parts], 0), tf.concat([p[1] for p in parts], 0)

    @property
    def spec(self) -> checkpoint_check.TableSpec:
        """What a checkpoint of this table must hold (every shard's part checked)."""
        first = self._shard_tuple[0]
        return checkpoint_check.TableSpec.of(first.handle_attrs, first.num_shards, tuple(range(first.num_shards)))

    def _checkpoint_adapter(self, path: str) -> None:
        # As DynamicTable's: the whole check before TensorFlow reads any tensor (every shard's part).
        def layout(tensors: dict) -> None:
            for shard in self._shard_tuple:
                shard.check_contents(tensor_shapes(tensors), "restore")

        checkpoint_check.check_restore(self, self.spec, path, layout)
        return None

    def _restore_from_tensors(self, restored_tensors: dict) -> Any:
        contents = {k: restored_tensors[k] for k in EXPORT_TENSORS}
        parts = []
        # Every shard checks its part before any shard imports: a refused restore changes no shard.
        for shard in self._shard_tuple:
            shard.check_contents(contents, "restore")
        step = checked_step(restored_tensors["step"], self.table_name)
        checks = [step]
        if all_eager(restored_tensors):
            self.spec.validate({k: v.numpy() for k, v in restored_tensors.items()})
        else:
            checks += policy_state_checks(self.spec, restored_tensors)
        for shard in self._shard_tuple:
            mine = restrict_to_shard(contents, shard.num_shards, shard.shard_index)
            shard.check_fits(mine)
            parts.append(mine)
        ops = []
        for shard, mine in zip(self._shard_tuple, parts, strict=True):
            with tf.control_dependencies(checks):
                imported = shard.import_contents(mine)
            with tf.control_dependencies([imported]):
                restored = shard.import_policy_state(restored_tensors)
            with tf.control_dependencies([restored]):
                ops.append(shard.step.assign(step))
        return tf.group(ops)
