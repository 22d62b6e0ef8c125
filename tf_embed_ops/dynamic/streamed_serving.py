"""Serving a tiered dynamic table without the plugin, its rows streamed from the tier into the SavedModel.

A tiered dynamic table (`te.DynamicTableConfig(storage=te.Tiered(...))`) keeps its rows on disk and may be larger
than memory, so `serving.freeze` (which reads the table's whole export) refuses it. `freeze_streamed` makes the same
servable as `freeze` (`serving.FrozenDynamicTable`: an int64 `keys` variable, a `tf.lookup.StaticHashTable` key ->
row initialised from it, `values` [n + 1, width] with a default row of zeros, in the same quantization modes)
without reading the rows:

- the keys (in DRAM anyway) are read whole, sorted, and (with `prune`) selected, as `freeze` selects them;
- `values` is created without a value (TensorFlow's `UninitializedVariable`), so the serving function can be
  traced and the SavedModel saved around it;
- `te.serving.save_streamed` (`tf_embed_ops.serving.streamed`, the machinery static tiered tables export through)
  then reads the rows of one chunk of keys at a time through the table's cache (dirty rows included, without
  filling it: `TfEmbed>DynamicTableTieredReadRows`), encodes them and writes them as a row slice of `values` into
  the SavedModel's checkpoint, then the default row.

A plain TensorFlow loader restores `values` from its slices with stock `RestoreV2`: the servable serves bitwise what
`freeze` of the same keys and rows serves. float16 rows (the "float16" mode) are kept as their int16 bits and
bitcast after the gather (TensorFlow restores no float16 tensor saved as slices).

Pruning decides from the keys' metadata in DRAM (`min_count`, `max_age_steps`, `max_rows` by "count" or
"recency"); criteria that read the rows' L2 norms (`min_l2_norm`, `max_rows` by "l2_norm") read the rows once more,
chunk by chunk, for their norms (8 bytes a key), before the export.

Memory: the keys and their metadata (about 24 bytes a key, plus the hash table's index of the kept keys) and one
chunk of rows and slots (`te.Tiered(chunk_bytes=...)`, float32) with its encoded copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops import _tf_compat
from tf_embed_ops.dynamic import frozen as frozen_lib
from tf_embed_ops.dynamic import ops as _ops
from tf_embed_ops.dynamic import tiered_checkpoint
from tf_embed_ops.serving import prune as prune_lib
from tf_embed_ops.serving import quantization as quantization_lib
from tf_embed_ops.serving import streamed as streamed_lib
from tf_embed_ops.serving.tables import module_name, table_metadata

__all__ = ["StreamedDynamicTable", "freeze_streamed"]


class StreamedDynamicTable(streamed_lib.Streamed, frozen_lib.FrozenDynamicTable):
    """A tiered dynamic table's serving form: `FrozenDynamicTable`'s state and lookups, `values` written by
    `te.serving.save_streamed` chunk by chunk (it has no value before: look it up in the saved servable).

    Attributes:
      keys, index, key_dtype, mode, dim, size, metadata: as `FrozenDynamicTable`.
      values: variable [size + 1, width] without a value until saved (float16 rows as their int16 bits).
    """

    streamed_variable = "values"

    def __init__(self, table: Any, quantization: str | None = None, prune: Any = None):
        # Not FrozenDynamicTable's constructor: it takes the rows.
        tf.Module.__init__(self, name=module_name(table.table_name))
        name = table.table_name
        if getattr(table, "tiered", None) is None:
            raise ValueError(
                f"DynamicTable {name!r} is kept in memory: freeze it with te.dynamic.serving.freeze (freeze_streamed "
                "is for tiered tables, storage=te.Tiered)"
            )
        self.table_name = name
        self.key_dtype = tf.as_dtype(table.key_dtype)
        self.mode = quantization_lib.check_mode(quantization, name)
        if prune is not None:
            prune_lib.check_applicable(prune, name, dynamic=True)
        self.dim = int(table.dim)
        self.width = quantization_lib.encoded_width(self.mode, self.dim)
        self.dtype = tf.as_dtype(quantization_lib.storage_dtype(self.mode))
        self.stored_dtype = tf.int16 if self.dtype == tf.float16 else self.dtype  # see the module docstring
        with tf.init_scope():  # eagerly, even while a serving function is traced
            keys, counts, last_steps, *_ = (t.numpy() for t in _ops.dynamic_table_tiered_export_keys(table.handle))
            order = np.argsort(keys, kind="stable")
            keys, counts, last_steps = keys[order], counts[order], last_steps[order]
            trained = int(keys.shape[0])
            self._hold_source(table)
            if prune is not None:
                norms = self._norms(keys) if prune_lib.needs_norms(prune) else None
                kept = prune_lib.select(
                    prune,
                    name,
                    np.zeros([trained, 0], np.float32),
                    order_keys=keys,
                    counts=counts,
                    last_steps=last_steps,
                    step=int(table.step.numpy()),
                    norms=norms,
                )
                keys = keys[kept]
            self.size = int(keys.shape[0])
            self.num_rows = self.size + 1
            self._source.keys = keys
            self.keys = tf.Variable(keys, trainable=False, name="keys")
            self.values = _tf_compat.UninitializedVariable(
                shape=[self.num_rows, self.width], dtype=self.stored_dtype, trainable=False, name="values"
            )
            self.index = tf.lookup.StaticHashTable(
                frozen_lib.KeysToRows(self.keys, self.size == 0),
                default_value=np.int64(self.size),
            )
        nbytes = self.num_rows * quantization_lib.row_bytes(self.mode, self.dim) + keys.nbytes
        metadata = table_metadata("dynamic", self.dim, self.size, self.size, self.mode, None, nbytes, "float32")
        metadata.update(rows_trained=trained, rows_pruned=trained - self.size, bytes_float32=trained * self.dim * 4)
        metadata["prune"] = prune.criteria() if prune is not None else None
        self.set_metadata(metadata)

    def _chunks(self, keys: np.ndarray) -> Any:
        """(first position, keys, float32 rows [n, dim]) of `keys`, one chunk (`te.Tiered(chunk_bytes)`) at a time,
        read through the table's cache without filling it."""
        table = self._source.table
        rows = tiered_checkpoint.chunk_rows(table)
        for start in range(0, int(keys.shape[0]), rows):
            chunk = keys[start : start + rows]
            weights, _ = _ops.dynamic_table_tiered_read_rows(table.handle, chunk, num_slots=table.num_slots)
            yield start, chunk, weights.numpy()

    def _norms(self, keys: np.ndarray) -> np.ndarray:
        """The L2 norms of `keys`' rows (`prune.row_norms`), read chunk by chunk."""
        norms = np.zeros([keys.shape[0]], np.float64)
        for start, chunk, weights in self._chunks(keys):
            norms[start : start + chunk.shape[0]] = prune_lib.row_norms(weights)
        return norms

    def _encode(self, weights: np.ndarray, start: int, keys: np.ndarray) -> tf.Tensor:
        """Rows [n, dim] (rows `start`... of `values`, of `keys`) encoded as `values` stores them.

        Raises:
          ValueError: a row the mode cannot encode, naming the table and the row's key.
        """
        try:
            encoded = quantization_lib.encode(weights, self.mode, self.table_name)
        except ValueError:
            for i in range(weights.shape[0]):  # which key's row: the message names it
                try:
                    quantization_lib.encode(weights[i : i + 1], self.mode, self.table_name)
                except ValueError as e:
                    raise ValueError(
                        f"{e} [the row of key {int(keys[i])}, row {start + i} of the serving export in key order]"
                    ) from None
            raise
        encoded = tf.constant(encoded)
        return tf.bitcast(encoded, self.stored_dtype) if self.stored_dtype != self.dtype else encoded

    def streamed_chunks(self) -> Any:
        """`values`' rows, encoded: the kept keys' rows chunk by chunk, then the default row (zeros)."""
        keys = self._source.keys
        for start, chunk, weights in self._chunks(keys):
            yield start, self._encode(weights, start, chunk)
        yield self.size, self._encode(np.zeros([1, self.dim], np.float32), self.size, np.zeros([1], np.int64))

    def _gather_values(self, rows: Any) -> tf.Tensor:
        values = tf.gather(self.values, rows)
        return tf.bitcast(values, self.dtype) if self.stored_dtype != self.dtype else values


def freeze_streamed(table: Any, quantization: str | None = None, prune: Any = None) -> StreamedDynamicTable:
    """The serving form of a tiered `DynamicTable`, as `freeze` makes an in-memory table's, its rows written by
    `te.serving.save_streamed` chunk by chunk from the tier (never the whole table in memory).

    Put it in the object to save (e.g. `root.users = freeze_streamed(table)`), trace the serving function over its
    `lookup(ids)` (or `rows` / `gather_rows`), and save with `te.serving.save_streamed(root, export_dir,
    signatures=...)`. The keys are read now; the rows when it is saved (train in between and the rows are the
    newer ones; freeze again for newer keys).

    Args:
      table: the tiered `DynamicTable` (`te.TPUEmbedding(...).dynamic_tables[config]`).
      quantization: the encoding of the served rows (`tf_embed_ops.serving.quantization.MODES`).
      prune: a `tf_embed_ops.serving.Prune` (every criterion; the L2-norm ones read the rows once more).

    Returns:
      The `StreamedDynamicTable`; its `metadata` records the rows trained and kept.

    Raises:
      ValueError: a table kept in memory (use `freeze`), an unknown quantization mode or a `prune` that is not a
        `Prune` (naming the table).
      tf.errors.OpError: with L2-norm pruning, a row that cannot be read from the tier.
    """
    return StreamedDynamicTable(table, quantization, prune)
