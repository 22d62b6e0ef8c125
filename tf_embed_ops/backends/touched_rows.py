"""The tracker's view of a table of numbered rows in variables (the in-memory kind; the tiered kind's builds on it):
which rows changed since a version (`tf_embed_ops.tracking`, docs/tracking.md), and their values.

Every fused update marks the rows it wrote in a tracker of each shard variable (one store per de-duplicated row, in
C++); `changed_since` reads them as global row ids. `TableChanges` is what every kind's view answers
(`te.tracking.TableChanges`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops import _loader

__all__ = ["StaticRowsView", "TableChanges"]


def _ops():
    return _loader.load_ops()


@dataclasses.dataclass
class TableChanges:
    """What changed in one table since a cursor.

    Attributes:
      kind: "static" or "dynamic".
      full: every row must be taken as changed (a restore, tracking started after the cursor, non-lazy Adam,
        a dropped eviction-log entry); `rows` then lists every row (static: all ids; dynamic: all live keys)
        and `evicted` is empty: a consumer replaces its whole copy.
      rows: int64, ascending: global row ids (static) or keys (dynamic) inserted or changed.
      evicted: int64 keys evicted since the cursor and not live now (dynamic only).  Apply order: remove
        `evicted`, then write `rows`.
      contents: dynamic tables only: the changed rows' content in key order (`keys`, `weights`, `slots` [n, W]
        side by side, `counts`, `last_steps`) and the whole admission table (`pending_keys`, `pending_counts`,
        `pending_last_steps`), read under the table's lock together with `rows`.
    """

    kind: str
    full: bool
    rows: np.ndarray
    evicted: np.ndarray
    contents: dict | None = None


def _backing(var: Any) -> Any:
    """The tf.Variable behind a keras.Variable (its `.value`), or the variable itself."""
    return var if isinstance(var, tf.Variable) else getattr(var, "value", var)


def _shards(var: Any) -> list:
    """The tf.Variable shards of a table or slot variable (one for an unsharded one)."""
    var = _backing(var)
    inner = getattr(var, "variables", None)
    if isinstance(inner, (list, tuple)) and inner and all(isinstance(v, tf.Variable) for v in inner):
        return list(inner)
    return [var]


class StaticRowsView:
    """A static table in memory (all its shards): one tracker per shard variable, which its fused update marks."""

    kind = "static"
    tiered = False

    def __init__(self, name: str, variables: dict, slot_names: list):
        self.name = name
        self.parameters = _shards(variables["parameters"])
        self.slots = {s: _shards(variables[s]) for s in slot_names}
        sizes = [int(v.shape[0]) for v in self.parameters]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.num_rows = int(self.offsets[-1])
        self.devices = [v.device for v in self.parameters]
        self.trackers = []
        for v in self.parameters:
            with tf.init_scope(), tf.device(v.device):
                self.trackers.append(_ops().tf_embed_touched_rows_track(v.handle))

    def versions(self) -> tuple:
        out = []
        for tracker, device in zip(self.trackers, self.devices, strict=True):
            with tf.device(device):
                tid, version, _, _ = _ops().tf_embed_touched_rows_since(tracker, tf.constant(-1, tf.int64), -1)
            out.append((int(tid), int(version)))
        return tuple(out)

    def changed_since(self, since: tuple | None) -> tuple[TableChanges, tuple]:
        since = since or ((-1, -1),) * len(self.trackers)
        if len(since) != len(self.trackers):
            since = ((-1, -1),) * len(self.trackers)  # another shard count: everything
        full = False
        parts, now = [], []
        for p, (tracker, device) in enumerate(zip(self.trackers, self.devices, strict=True)):
            with tf.device(device):
                tid, version, shard_full, rows = _ops().tf_embed_touched_rows_since(
                    tracker, tf.constant(since[p][0], tf.int64), tf.constant(since[p][1], tf.int64)
                )
            now.append((int(tid), int(version)))
            full = full or bool(shard_full)
            parts.append(rows.numpy() + self.offsets[p])
        if full:
            rows = np.arange(self.num_rows, dtype=np.int64)
        else:
            rows = np.concatenate(parts).astype(np.int64) if parts else np.zeros([0], np.int64)
        return TableChanges("static", full, rows, np.zeros([0], np.int64)), tuple(now)

    def read(self, rows: np.ndarray) -> dict:
        rows = np.asarray(rows, np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise ValueError(
                f"table {self.name!r}: rows must be in [0, {self.num_rows}), got {rows.min()}..{rows.max()}"
            )
        out = {"parameters": self._gather(self.parameters, rows)}
        for slot, shards in self.slots.items():
            out[slot] = self._gather(shards, rows)
        return out

    def _gather(self, shards: list, rows: np.ndarray) -> np.ndarray:
        if len(shards) == 1:
            with tf.device(shards[0].device):
                return tf.gather(shards[0], rows).numpy()
        shard = np.searchsorted(self.offsets, rows, side="right") - 1
        width = int(shards[0].shape[1])
        out = np.zeros([rows.size, width], shards[0].dtype.as_numpy_dtype)
        for p, v in enumerate(shards):
            mine = np.nonzero(shard == p)[0]
            if mine.size:
                with tf.device(v.device):
                    out[mine] = tf.gather(v, rows[mine] - self.offsets[p]).numpy()
        return out

    def mark_all(self) -> None:
        for tracker, device in zip(self.trackers, self.devices, strict=True):
            with tf.device(device):
                _ops().tf_embed_touched_rows_mark_all(tracker)
