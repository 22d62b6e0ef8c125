"""What a dynamic table's checkpoint must hold, checked in numpy before any row is imported.

`TableSpec.validate` takes a checkpoint's nine tensors (`keys`, `weights`, `slots`, `counts`, `last_steps`,
`pending_keys`, `pending_counts`, `pending_last_steps`, `step`; docs/dynamic_tables.md, "Checkpoints") and raises
`ValueError` naming the table, the tensor and the value on the first thing the import would refuse or that
would leave the table unusable: missing tensors, dtypes, shapes, a step that is not a scalar >= 0, counts and
steps out of range, duplicate keys, rows or admission counters beyond what a shard may hold, admission counters
for a table that does not count. It runs both from a table's own restore and from `te.TPUEmbedding`'s, which
checks every table before it lets TensorFlow write any (tf_embed_ops/engine/checkpoint.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tf_embed_ops.dynamic.sharding import shard_of_keys

__all__ = ["MAX_COUNT", "TENSORS", "TableSpec"]

# Per-row counts saturate at the core's uint32 (cc/lib/dynamic_table.h kMaxCount).
MAX_COUNT = 0xFFFFFFFF
_INT = ("keys", "counts", "last_steps", "pending_keys", "pending_counts", "pending_last_steps", "step")
_FLOAT = ("weights", "slots")
TENSORS = ("keys", "weights", "slots", "counts", "last_steps", "pending_keys", "pending_counts", "pending_last_steps")


class TableSpec(NamedTuple):
    """The table a checkpoint is restored into: its name, row layout, limits and which shards of it are here."""

    name: str
    dim: int
    slot_width: int
    max_rows: int
    max_pending_keys: int
    num_shards: int
    shard_indices: tuple[int, ...]

    @classmethod
    def of(cls, attrs: Mapping[str, Any], num_shards: int = 1, shard_indices: tuple[int, ...] = (0,)) -> TableSpec:
        """From the table's handle attributes (`dynamic.config.handle_attrs`)."""
        widths = list(attrs.get("slot_widths", ())) or [int(attrs["dim"])] * len(attrs.get("slot_initial_values", ()))
        return cls(
            name=str(attrs["table_name"]),
            dim=int(attrs["dim"]),
            slot_width=int(sum(widths)),
            max_rows=int(attrs["max_rows"]),
            max_pending_keys=int(attrs.get("max_pending_keys", 0)),
            num_shards=int(num_shards),
            shard_indices=tuple(shard_indices),
        )

    def validate(self, tensors: Mapping[str, Any], what: str = "restore") -> None:
        """Raises ValueError on the first problem of a checkpoint's tensors (numpy arrays or eager tensors).

        Args:
          tensors: the checkpoint's tensors by name (`TENSORS` and `step`).
          what: the operation, for the message.

        Raises:
          ValueError: naming the table, the tensor and the value; the caller has changed nothing yet.
        """
        where = f"DynamicTable {self.name!r}: {what}:"
        source = "the checkpoint" if what == "restore" else "the content"
        end = "; nothing was changed"
        missing = [k for k in (*TENSORS, "step") if k not in tensors]
        if missing:
            raise ValueError(f"{where} {source} lacks {missing}{end}")
        t = {k: np.asarray(tensors[k]) for k in (*TENSORS, "step")}
        for k in _INT:
            if t[k].dtype != np.int64:
                raise ValueError(f"{where} {k} must be int64, got {t[k].dtype}{end}")
        for k in _FLOAT:
            if t[k].dtype != np.float32:
                raise ValueError(f"{where} {k} must be float32, got {t[k].dtype}{end}")
        if t["step"].shape != ():
            raise ValueError(f"{where} the step must be a scalar (shape []), got shape {list(t['step'].shape)}{end}")
        if int(t["step"]) < 0:
            raise ValueError(f"{where} the step must be >= 0, got {int(t['step'])}{end}")
        n = t["keys"].shape[0] if t["keys"].ndim == 1 else None
        want = {
            "keys": (n,),
            "weights": (n, self.dim),
            "slots": (n, self.slot_width),
            "counts": (n,),
            "last_steps": (n,),
        }
        p = t["pending_keys"].shape[0] if t["pending_keys"].ndim == 1 else None
        want.update({k: (p,) for k in ("pending_keys", "pending_counts", "pending_last_steps")})
        for k, shape in want.items():
            if n is None or p is None or t[k].shape != shape:
                raise ValueError(
                    f"{where} {k} has shape {list(t[k].shape)}, expected {list(shape)} (n = {n} rows, "
                    f"p = {p} admission counters, dim {self.dim}, {self.slot_width} slot values per row){end}"
                )
        self._check_range(t, "counts", 0, "keys", where, end)
        self._check_range(t, "pending_counts", 1, "pending_keys", where, end)
        for k, key in (("last_steps", "keys"), ("pending_last_steps", "pending_keys")):
            bad = np.flatnonzero(t[k] < 0)
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"{where} {k}[{i}] (key {int(t[key][i])}) is {int(t[k][i])}, must be >= 0{end}")
        for k in ("keys", "pending_keys"):
            values, counts = np.unique(t[k], return_counts=True)
            if np.any(counts > 1):
                raise ValueError(f"{where} key {int(values[counts > 1][0])} appears more than once in {k}{end}")
        both = np.intersect1d(t["keys"], t["pending_keys"])
        if both.size:
            raise ValueError(f"{where} key {int(both[0])} is both a row and a pending admission counter{end}")
        if p and self.max_pending_keys == 0:
            raise ValueError(
                f"{where} {source} holds {p} pending admission counters but the table counts none (no "
                f"te.dynamic.FrequencyAdmission with min_count > 1); restore into a table with the checkpoint's "
                f"admission{end}"
            )
        rows = self._per_shard(t["keys"])
        pending = self._per_shard(t["pending_keys"])
        for index in self.shard_indices:
            shard = f" for shard {index} of {self.num_shards}" if self.num_shards > 1 else ""
            if rows[index] > self.max_rows:
                raise ValueError(
                    f"{where} {source} holds {rows[index]} rows{shard}, more than max_rows={self.max_rows}; "
                    f"raise max_rows or restore into more shards. Nothing was changed"
                )
            if pending[index] > self.max_pending_keys:
                raise ValueError(
                    f"{where} {source} holds {pending[index]} pending admission counters{shard}, more than "
                    f"max_pending_keys={self.max_pending_keys}; raise max_pending_keys or restore into more "
                    f"shards. Nothing was changed"
                )

    @staticmethod
    def _check_range(t: dict, k: str, low: int, key: str, where: str, end: str) -> None:
        bad = np.flatnonzero((t[k] < low) | (t[k] > MAX_COUNT))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"{where} {k}[{i}] (key {int(t[key][i])}) is {int(t[k][i])}, must be in [{low}, {MAX_COUNT}]{end}"
            )

    def _per_shard(self, keys: np.ndarray) -> np.ndarray:
        if self.num_shards == 1:
            return np.array([keys.shape[0]])
        which = shard_of_keys(tf.constant(keys, tf.int64), self.num_shards).numpy()
        return np.bincount(which, minlength=self.num_shards)
