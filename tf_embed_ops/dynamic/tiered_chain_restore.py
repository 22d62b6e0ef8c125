"""An incremental checkpoint chain's deltas applied to a tiered dynamic table without its rows in memory.

`te.checkpoint.IncrementalCheckpointManager` restores a dynamic table kept in memory by merging its full checkpoint's
content with the deltas' (later deltas win key by key; evicted keys go) and importing the result whole. A tiered dynamic
table's rows can be larger than memory, so only its keys and metadata (in DRAM anyway, about 24 bytes a key) are
merged whole; each final key's row is remembered by where it comes from: a position in the full checkpoint (its
streamed format keeps the rows in key order as row slices, `tf_embed_ops.dynamic.tiered_checkpoint`) or a row of a
delta (the deltas are in memory already: they were read and checksummed whole). Then the table is written:

1. the final keys and metadata (`TfEmbed>DynamicTableTieredImportKeys`, which drops the previous rows);
2. the full checkpoint's surviving rows, one checkpoint chunk at a time (chunks without a surviving row are not
   read), by key (`TfEmbed>DynamicTableTieredWriteRows`);
3. the deltas' rows, one chunk of keys at a time;
4. the lifecycle policies' state and the step of the last delta.

The result is what the in-memory merge imports, key for key and bit for bit. Everything (the full checkpoint's
part, every delta's arrays, the merged content) is checked by the constructor, before the manager changes any
state (a ValueError naming the table, which the manager reports as a `CheckpointError`); the full checkpoint's files
were checksummed by the manager before.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops.dynamic import ops as dynamic_ops
from tf_embed_ops.dynamic import tiered_checkpoint

__all__ = ["TieredDynamicRestore", "is_streamed"]

_META = ("keys", "counts", "last_steps")
_PENDING = ("pending_keys", "pending_counts", "pending_last_steps")


def is_streamed(reader: Any, object_name: str) -> bool:
    """Whether the checkpoint read by `reader` holds the table at `object_name` in the streamed format."""
    return tiered_checkpoint.manifest_key(object_name) in reader.get_variable_to_shape_map()


class TieredDynamicRestore:
    """The restore of one tiered dynamic table from a full (streamed) checkpoint and deltas, checked.

    Args:
      name: the table's name in the deltas (`dynamic/<name>/...`).
      table: the tiered `DynamicTable`.
      object_name: the table's object path in the full checkpoint.
      prefix: the full checkpoint.
      reader: `tf.train.load_checkpoint(prefix)`.
      deltas: [(header, arrays)] in chain order, every one holding the table.

    Raises:
      ValueError: the full checkpoint's part or a delta does not fit the table (naming it); nothing changed.
    """

    def __init__(self, name: str, table: Any, object_name: str, prefix: str, reader: Any, deltas: list):
        self._table = table
        self._checked = tiered_checkpoint.check_streamed(
            table.spec,
            table.policy_tensor_names,
            object_name,
            prefix,
            reader,
            verify=False,  # checksummed file by file by the manager
            filter_bytes=table.bloom_bytes,
        )
        base = self._checked.tensors
        n = int(base["keys"].shape[0])
        meta = {k: np.asarray(base[k]) for k in _META}
        position = np.arange(n, dtype=np.int64)  # the row's position in the full checkpoint, or -1
        source = np.full([n], -1, np.int64)  # the row's index among the deltas' rows, or -1
        pending = {k: np.asarray(base[k]) for k in _PENDING}
        weights, slots, offset = [], [], 0
        step = int(base["step"])
        policy = {k: np.asarray(base[k]) for k in table.policy_tensor_names}
        dim, width = int(table.dim), int(sum(table.slot_widths))
        for header, arrays in deltas:
            where = f"{header['name']}: table {name!r}"
            d = {k: arrays[f"dynamic/{name}/{k}"] for k in (*_META, *_PENDING, "weights", "slots")}
            m = int(d["keys"].shape[0])
            if d["keys"].ndim != 1 or d["weights"].shape != (m, dim) or d["slots"].shape != (m, width):
                raise ValueError(
                    f"{where}: keys {list(d['keys'].shape)}, weights {list(d['weights'].shape)} and slots "
                    f"{list(d['slots'].shape)} do not fit the table's dim {dim} and slot width {width}"
                )
            mine = offset + np.arange(m, dtype=np.int64)
            offset += m
            weights.append(np.asarray(d["weights"], np.float32))
            slots.append(np.asarray(d["slots"], np.float32))
            if header["tables"][name]["full"]:
                meta = {k: np.asarray(d[k]) for k in _META}
                position, source = np.full([m], -1, np.int64), mine
            else:
                gone = np.concatenate([arrays[f"dynamic/{name}/evicted"], d["keys"]])
                keep = ~np.isin(meta["keys"], gone)
                meta = {k: np.concatenate([meta[k][keep], np.asarray(d[k])]) for k in _META}
                position = np.concatenate([position[keep], np.full([m], -1, np.int64)])
                source = np.concatenate([source[keep], mine])
                order = np.argsort(meta["keys"], kind="stable")
                meta = {k: v[order] for k, v in meta.items()}
                position, source = position[order], source[order]
            pending = {k: np.asarray(d[k]) for k in _PENDING}
            step = int(arrays[f"dynamic/{name}/step"].max())
            prefix_ = f"dynamic/{name}/policy/"
            policy.update({k[len(prefix_) :]: v for k, v in arrays.items() if k.startswith(prefix_)})
        count = int(meta["keys"].shape[0])
        # The merged content as the import will take it (the rows by shape and dtype only).
        tensors = {
            **meta,
            **pending,
            "step": np.int64(step),
            "weights": np.broadcast_to(np.zeros((), np.float32), (count, dim)),
            "slots": np.broadcast_to(np.zeros((), np.float32), (count, width)),
            **policy,
        }
        try:
            table.spec.validate(tensors)
            tiered_checkpoint.check_policy_state(
                tensors, table.policy_tensor_names, table.bloom_bytes, f"DynamicTable {table.table_name!r}:"
            )
        except ValueError as e:
            raise ValueError(f"{prefix} and its deltas: {e}") from None
        self._meta, self._pending, self._step, self._policy = meta, pending, step, policy
        self._position, self._source = position, source
        self._weights = np.concatenate(weights) if weights else np.zeros([0, dim], np.float32)
        self._slots = np.concatenate(slots) if slots else np.zeros([0, width], np.float32)

    def apply(self) -> None:
        """Writes the table (see the module docstring)."""
        table, handle = self._table, self._table.handle
        keys = self._meta["keys"]
        dynamic_ops.dynamic_table_tiered_import_keys(
            handle, keys, self._meta["counts"], self._meta["last_steps"], *(self._pending[k] for k in _PENDING)
        )
        from_full = np.nonzero(self._position >= 0)[0]
        positions = self._position[from_full]  # ascending: both orders are the keys'
        for start, count in self._checked.chunks:
            lo, hi = np.searchsorted(positions, [start, start + count])
            if lo == hi:
                continue
            weights, slots = self._checked.read_chunk(start, count)
            at = positions[lo:hi] - start
            self._write(keys[from_full[lo:hi]], tf.gather(weights, at), tf.gather(slots, at))
        from_deltas = np.nonzero(self._source >= 0)[0]
        rows = tiered_checkpoint.chunk_rows(table)
        for start in range(0, from_deltas.size, rows):
            chosen = from_deltas[start : start + rows]
            index = self._source[chosen]
            self._write(keys[chosen], self._weights[index], self._slots[index])
        table.import_policy_state(self._policy)
        table.step.assign(self._step)

    def _write(self, keys: np.ndarray, weights: Any, slots: Any) -> None:
        table = self._table
        slots = tf.convert_to_tensor(slots, tf.float32)
        parts = tf.split(slots, table.slot_widths, axis=1) if table.num_slots else []
        dynamic_ops.dynamic_table_tiered_write_rows(table.handle, keys, tf.convert_to_tensor(weights), parts)
