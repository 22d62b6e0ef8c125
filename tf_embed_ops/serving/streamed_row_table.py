"""A tiered dynamic table in a published servable: `servable.MutableRowTable`'s state, its rows streamed from the tier.

`te.serving.Publisher` serves a dynamic table as a `MutableRowTable` (a `MutableHashTable` key -> slot over a
preallocated row variable `values` [capacity + 1, dim], float32, and an int8 slot-state variable), which deltas
update in place. Made from a table in memory, it is built from the table's whole export. A tiered dynamic table can
be larger than memory, so `StreamedRowTable` makes the same state without reading the rows:

- the keys (in DRAM anyway) are read whole (`TfEmbed>DynamicTableTieredExportKeys`), sorted as the in-memory
  export sorts them; key i (in key order) takes slot i, as in `MutableRowTable`; the hash table and the slot
  states are built from them;
- `values` is created without a value (TensorFlow's `UninitializedVariable`): the servable is saved around it,
  then `tf_embed_ops.serving.streamed.write_rows` writes its rows as row slices of its checkpoint tensor, one chunk
  of keys at a time read through the table's cache (dirty rows included, without filling it:
  `TfEmbed>DynamicTableTieredReadRows`), then the free slots and the default row (zeros), a chunk at a time too.

A loader restores `values` from its slices with stock `RestoreV2`, so the servable holds bitwise what a
`MutableRowTable` of the same table in memory holds. Memory: the keys (and the hash table's index of them, the
slot states, 1 byte a slot) and one chunk of rows and slots (`te.Tiered(chunk_bytes=...)`, float32).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops import _tf_compat
from tf_embed_ops.dynamic import ops as dynamic_ops
from tf_embed_ops.dynamic import tiered_checkpoint
from tf_embed_ops.serving import servable as servable_lib
from tf_embed_ops.serving import streamed as streamed_lib
from tf_embed_ops.serving.tables import module_name

__all__ = ["StreamedRowTable"]


class StreamedRowTable(streamed_lib.Streamed, servable_lib.MutableRowTable):
    """A tiered dynamic table's `MutableRowTable` with `values` written by `streamed.write_rows` (see the module
    docstring); before the servable is saved `values` has no value.

    Args:
      table: the tiered `DynamicTable` (read only: its keys now, its rows when the servable is saved).
      capacity: slots (>= the table's keys; deltas insert into the free ones), or a callable of the number of keys
        that returns them.

    Raises:
      ValueError: a table kept in memory, or a capacity below the table's keys (naming the table).
    """

    streamed_variable = "values"

    def __init__(self, table: Any, capacity: Any):
        # Not MutableRowTable's constructor: it takes the rows.
        tf.Module.__init__(self, name=module_name(table.table_name))  # pylint: disable=non-parent-init-called
        name = table.table_name
        if getattr(table, "tiered", None) is None:
            raise ValueError(f"DynamicTable {name!r} is kept in memory: its servable table is a MutableRowTable")
        with tf.init_scope():  # eagerly, even while the serving function is traced
            keys = dynamic_ops.dynamic_table_tiered_export_keys(table.handle)[0].numpy()
            keys = np.sort(keys, kind="stable")  # the in-memory export's order (it is sorted already)
            n = int(keys.shape[0])
            capacity = int(capacity(n)) if callable(capacity) else int(capacity)
            if capacity < n:
                raise ValueError(f"table {name}: capacity {capacity} is below its {n} rows")
            self.table_name = name
            self.key_dtype = tf.as_dtype(table.key_dtype)
            self.dim = int(table.dim)
            self.capacity = int(capacity)
            self.dtype = tf.float32  # a dynamic table's rows as its export gives them
            self.width = self.dim
            self.num_rows = self.capacity + 1  # `values`: the slots, then the default row
            self.values = _tf_compat.UninitializedVariable(
                shape=[self.num_rows, self.dim], dtype=self.dtype, trainable=False, name="values"
            )
            state = np.zeros([self.capacity], np.int8)
            state[:n] = servable_lib.SLOT_USED
            self.state = tf.Variable(state, trainable=False, name="state")
            self.index = tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.int64, default_value=np.int64(self.capacity)
            )
            self.index.insert(tf.constant(keys), tf.range(n, dtype=tf.int64))
        self._hold_source(table)
        self._source.keys = keys

    def streamed_chunks(self) -> Any:
        """`values`' rows in order: the keys' rows (float32, read through the table's cache) chunk by chunk, then
        zeros for the free slots and the default row."""
        table, keys = self._source.table, self._source.keys
        rows = tiered_checkpoint.chunk_rows(table)
        n = int(keys.shape[0])
        for start in range(0, n, rows):
            weights, _ = dynamic_ops.dynamic_table_tiered_read_rows(
                table.handle, keys[start : start + rows], num_slots=table.num_slots
            )
            yield start, tf.cast(weights, self.dtype)
        for start in range(n, self.num_rows, rows):
            yield start, tf.zeros([min(rows, self.num_rows - start), self.dim], self.dtype)
