"""A table as a servable holds it: encoded rows (`quantization`), optionally pruned (`prune`), in stock TensorFlow
state, and the per-table metadata an export records.

`ServedTable` serves a static table: `rows` holds the encoded rows; when the table is pruned, the kept rows are
compacted, one default row of zeros is appended and `remap` ([vocabulary_size] int32, or int64 beyond 2**31 rows)
maps each id to its row (a pruned id to the default row). A remap costs 4 bytes per id, so pruning a static table
saves memory only when it drops more than that per row on average.

Example:
    >>> served = ServedTable("user", weights, mode="int8", prune=Prune(max_rows=1000))
    >>> served.gather_rows(tf.constant([3, 7], tf.int64))   # float32 [2, dim]
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops.serving import prune as prune_lib
from tf_embed_ops.serving import quantization

__all__ = ["MetadataMixin", "ServedTable", "module_name", "table_metadata"]


def table_metadata(
    kind: str, dim: int, rows_trained: int, rows_exported: int, mode: Any, prune: Any, nbytes: int, trained_dtype: str
) -> dict:
    """What an export records about one table (read back by ``python -m tf_embed_ops inspect-export``)."""
    return {
        "kind": kind,
        "dim": int(dim),
        "rows_trained": int(rows_trained),
        "rows_exported": int(rows_exported),
        "rows_pruned": int(rows_trained - rows_exported),
        "quantization": mode or "none",
        "trained_dtype": trained_dtype,
        "bytes": int(nbytes),
        "bytes_float32": int(rows_trained) * int(dim) * 4,
        "prune": prune.criteria() if prune is not None else None,
    }


class MetadataMixin:
    """`metadata` as a plain dict on a `tf.Module` (whose attributes would otherwise wrap a dict for tracking and
    save it), kept as a JSON string."""

    @property
    def metadata(self) -> dict:
        return json.loads(self._metadata_json)

    def set_metadata(self, value: dict) -> None:
        # Not a property setter: tf.Module's __setattr__ would wrap the dict before a setter saw it.
        self._metadata_json = json.dumps(value)


def module_name(name: str) -> str:
    """A `tf.Module` name for a serving form of the table `name` (letters, digits, "_"; a letter first)."""
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in str(name)) or "table"
    return cleaned if cleaned[0].isalpha() else "t_" + cleaned


class ServedTable(MetadataMixin, tf.Module):
    """A static table's serving form: encoded (and possibly pruned) rows with a plain-TensorFlow lookup.

    Attributes:
      rows: variable of encoded rows (`quantization.storage_dtype(mode)`), [kept (+1 default row if pruned), width].
      remap: int variable [vocabulary_size] id -> row, or None when no row is pruned.
      metadata: `table_metadata` of this table.
    """

    def __init__(
        self, name: str, weights: np.ndarray, mode: str | None = None, prune: Any = None, trained_dtype: str = "float32"
    ):
        super().__init__(name=module_name(name))
        weights = np.asarray(weights, np.float32)
        vocabulary_size, dim = weights.shape
        self.table_name, self.mode, self.dim = name, mode, int(dim)
        remap = None
        if prune is not None:
            kept = prune_lib.select(prune, name, weights)
            weights = np.concatenate([weights[kept], np.zeros([1, dim], np.float32)])
            remap = np.full([vocabulary_size], kept.shape[0], np.int32 if vocabulary_size < 2**31 else np.int64)
            remap[kept] = np.arange(kept.shape[0])
        data = quantization.encode(weights, mode, name)
        self.rows = tf.Variable(data, trainable=False, name="rows")
        self.remap = None if remap is None else tf.Variable(remap, trainable=False, name="remap")
        exported = vocabulary_size if remap is None else int(kept.shape[0])
        nbytes = data.nbytes + (0 if remap is None else remap.nbytes)
        self.set_metadata(table_metadata("static", dim, vocabulary_size, exported, mode, prune, nbytes, trained_dtype))

    def _gather(self, ids: Any) -> tf.Tensor:
        if self.remap is not None:
            ids = tf.gather(self.remap, ids)
        return tf.gather(self.rows, ids)

    def gather_rows(self, ids: Any) -> tf.Tensor:
        """Float32 rows of `ids` (int64 [n]) -> [n, dim]; a pruned id reads zeros."""
        return quantization.decode(self._gather(ids), self.mode, self.dim)
