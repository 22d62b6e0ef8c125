"""The tracker's view of a static tiered table (`tf_embed_ops.tracking`, docs/tracking.md): which rows changed since a
version, and their values read from the tier.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops import _loader
from tf_embed_ops.backends import touched_rows

__all__ = ["TieredRowsView"]


class TieredRowsView(touched_rows.StaticRowsView):
    """A static tiered table (`storage=te.Tiered`): one tracker on its TieredTableResource, which its fused
    update (TieredSendTPUEmbeddingGradients) and its row writes (initialisation, restore) mark; rows are read
    from the tier through the cache's dirty rows, without filling the cache."""

    tiered = True

    def __init__(self, name: str, table: Any):  # pylint: disable=super-init-not-called
        self.name = name
        self.table = table
        self.devices = [table.handle.device]  # one "shard"
        self.offsets = np.array([0, table.num_rows], np.int64)
        self.num_rows = int(table.num_rows)
        with tf.init_scope(), tf.device(table.handle.device):
            self.trackers = [_loader.load_ops().tf_embed_touched_rows_track(table.handle)]

    def read(self, rows: np.ndarray) -> dict:
        rows = np.asarray(rows, np.int64).reshape([-1])
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise ValueError(
                f"table {self.name!r}: rows must be in [0, {self.num_rows}), got {rows.min()}..{rows.max()}"
            )
        with tf.device(self.table.handle.device):
            values, slots = self.table.gather_rows(rows)
        # The storage dtype, as the in-memory table's variables give it (float32 -> 16-bit is exact here).
        dtypes = self.table.dtypes
        out = {"parameters": tf.cast(values, dtypes[0]).numpy()}
        for k, slot in enumerate(self.table.slot_names):
            out[slot] = tf.cast(slots[slot], dtypes[1 + k]).numpy()
        return out
