"""The tracker's view of a dynamic table, in memory or tiered, all its shards (`tf_embed_ops.tracking`,
docs/tracking.md): its resources' own change log and eviction log, and the changed rows' contents.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops import _loader
from tf_embed_ops.backends.touched_rows import TableChanges

__all__ = ["DynamicRowsView"]


def _ops():
    return _loader.load_ops()


_CONTENT = ("keys", "weights", "slots", "counts", "last_steps", "pending_keys", "pending_counts", "pending_last_steps")


class DynamicRowsView:
    """A dynamic table (all its shards), in memory or tiered: its resource's own change log and eviction log."""

    kind = "dynamic"

    def __init__(self, name: str, table: Any):
        self.name = name
        self.table = table
        self.shards = list(getattr(table, "shards", None) or [table])
        # A tiered dynamic table (unsharded): changed rows' values are read through its cache by the query op; a
        # full answer carries keys and metadata only (`read` gives the values by key).
        self.tiered = getattr(table, "tiered", None) is not None

    def _query(self, shard: Any, since: tuple, mark_all: bool = False, version_only: bool = False) -> tuple:
        with tf.device(shard.resource_handle.device):
            out = _ops().tf_embed_dynamic_table_changed_since(
                shard.resource_handle,
                tf.constant(since[0], tf.int64),
                tf.constant(since[1], tf.int64),
                num_slots=shard.num_slots,
                mark_all=mark_all,
                version_only=version_only,
            )
        return out

    def versions(self) -> tuple:
        out = []
        for shard in self.shards:
            r = self._query(shard, (-1, -1), version_only=True)
            out.append((int(r.id), int(r.version)))
        return tuple(out)

    def changed_since(self, since: tuple | None) -> tuple[TableChanges, tuple]:
        since = since or ((-1, -1),) * len(self.shards)
        if len(since) != len(self.shards):
            since = ((-1, -1),) * len(self.shards)
        full, now, evicted, parts = False, [], [], []
        for p, shard in enumerate(self.shards):
            r = self._query(shard, since[p])
            now.append((int(r.id), int(r.version)))
            full = full or bool(r.full)
            evicted.append(r.evicted_keys.numpy())
            n = int(r.keys.shape[0])
            part = {k: getattr(r, k).numpy() for k in _CONTENT if k != "slots"}
            part["slots"] = np.concatenate([s.numpy() for s in r.slots], 1) if r.slots else np.zeros([n, 0], np.float32)
            if self.tiered and bool(r.full):  # keys and metadata only: the values are read by key (`read`)
                part["weights"] = part["slots"] = None
            parts.append(part)
        if full and len(self.shards) > 1:
            # One shard's full answer means a restore or a non-lazy update: take every shard whole.
            parts = []
            for p, shard in enumerate(self.shards):
                c = {k: v.numpy() for k, v in shard.export().items()}
                parts.append(c)
                evicted[p] = np.zeros([0], np.int64)
        contents = _union(parts)
        ev = np.unique(np.concatenate(evicted)).astype(np.int64) if evicted else np.zeros([0], np.int64)
        if full:
            ev = np.zeros([0], np.int64)
        return TableChanges("dynamic", full, contents["keys"], ev, contents), tuple(now)

    def mark_all(self) -> None:
        for shard in self.shards:
            self._query(shard, (-1, -1), mark_all=True, version_only=True)

    def read(self, keys: Any) -> dict:
        if not self.tiered:
            raise ValueError(
                f"table {self.name!r} is dynamic: its rows come with changed_since(...).tables[name].contents"
            )
        from tf_embed_ops.dynamic import ops as dynamic_ops  # pylint: disable=import-outside-toplevel

        keys = np.asarray(keys, np.int64).reshape([-1])
        shard = self.shards[0]
        with tf.device(shard.resource_handle.device):
            weights, slots = dynamic_ops.dynamic_table_tiered_read_rows(
                shard.resource_handle, keys, num_slots=shard.num_slots
            )
        n = int(keys.size)
        out_slots = np.concatenate([x.numpy() for x in slots], 1) if slots else np.zeros([n, 0], np.float32)
        return {"weights": weights.numpy(), "slots": out_slots}


def _union(parts: list) -> dict:
    """Shard contents (disjoint keys) joined and sorted by key."""
    # None: not read (a tiered table's full answer carries no values).
    out = {k: None if any(p[k] is None for p in parts) else np.concatenate([p[k] for p in parts], 0) for k in _CONTENT}
    order = np.argsort(out["keys"], kind="stable")
    for k in ("keys", "weights", "slots", "counts", "last_steps"):
        out[k] = None if out[k] is None else out[k][order]
    porder = np.argsort(out["pending_keys"], kind="stable")
    for k in ("pending_keys", "pending_counts", "pending_last_steps"):
        out[k] = out[k][porder]
    return out
