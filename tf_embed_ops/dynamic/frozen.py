"""A dynamic table's frozen serving state in stock TensorFlow: `FrozenDynamicTable` and how ids become its keys.

`FrozenDynamicTable` holds a dynamic table's rows as state that stock TensorFlow holds and checkpoints (`keys`, a
`tf.lookup.StaticHashTable` `index` key -> row initialised from them, `values` with a default row of zeros; see
`tf_embed_ops.dynamic.serving`, which freezes a table into it, and `streamed_serving`, whose tiered form shares its
state and lookups). `to_keys` turns ids into keys (string ids fingerprinted as the ops do).

Example:
    >>> frozen = freeze_arrays(np.array([3, 9], np.int64), np.ones([2, 4], np.float32))
    >>> frozen.lookup(tf.constant([9, 5], tf.int64)).numpy()[:, 0]
    array([1., 0.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops.dynamic.ops import string_keys_to_int64 as string_keys
from tf_embed_ops.serving import quantization as quantization_lib
from tf_embed_ops.serving.tables import MetadataMixin, module_name, table_metadata

__all__ = ["FrozenDynamicTable", "KeysToRows", "freeze_arrays", "string_keys", "to_keys"]


def to_keys(ids: Any, key_dtype: tf.DType = tf.int64) -> tf.Tensor:
    """The table keys of `ids`: int64 ids as they are, string ids fingerprinted (`string_keys`).

    Raises:
      ValueError: if the ids' dtype is not the table's key dtype (a string table is never fed integers, nor the
        reverse: the two would address different rows).
    """
    ids = tf.convert_to_tensor(ids)
    if ids.dtype != key_dtype:
        raise ValueError(f"ids: dtype {ids.dtype.name} does not match the table's key_dtype {key_dtype.name}")
    return string_keys(ids) if key_dtype == tf.string else ids


class KeysToRows(tf.lookup.KeyValueTensorInitializer):
    """Initialises a hash table with key -> position from a keys *variable*, read when the table is initialised.

    `KeyValueTensorInitializer` captures its tensors at construction, which a SavedModel then stores as graph
    constants; reading a variable instead keeps the keys in the checkpoint (no 2 GB graph limit). A loaded
    SavedModel restores variables before it initialises tables, so the variable holds the keys by then.
    """

    def __init__(self, keys: tf.Variable, empty: bool = False):
        self._keys_var = keys
        # TensorFlow refuses to initialise a hash table from empty tensors; a table without rows (everything
        # pruned, or nothing trained yet) maps one key to row 0, which is then the default row: every key reads it.
        self._empty = empty
        # The base class only needs the dtypes; the real tensors are read in `initialize`.
        super().__init__(tf.zeros([0], tf.int64), tf.zeros([0], tf.int64))

    def initialize(self, table: Any) -> Any:
        if self._empty:
            keys, rows = tf.zeros([1], tf.int64), tf.zeros([1], tf.int64)
        else:
            keys = self._keys_var.read_value()
            rows = tf.range(tf.size(keys, out_type=tf.int64), dtype=tf.int64)
        return tf.raw_ops.InitializeTableV2(table_handle=table.resource_handle, keys=keys, values=rows)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = dict(super()._trackable_children(save_type, **kwargs))
        children["keys"] = self._keys_var
        return children


class FrozenDynamicTable(MetadataMixin, tf.Module):
    """A dynamic table's rows as a `tf.lookup.StaticHashTable` + a dense variable with a default row of zeros.

    Attributes:
      keys: int64 variable [n], sorted.
      values: variable [n + 1, width]: the rows (encoded in `mode`; float32 [n + 1, dim] without quantization);
        row n is the default (zeros).
      index: the StaticHashTable key -> row (default n).
      key_dtype: tf.int64 or tf.string (the ids `lookup` accepts).
      mode: the quantization mode of `values` (None: float32).
      metadata: what an export records about the table (`tf_embed_ops.serving.tables.table_metadata`).
    """

    def __init__(
        self,
        keys: np.ndarray,
        weights: np.ndarray,
        key_dtype: tf.DType = tf.int64,
        name: str = "table",
        quantization: str | None = None,
    ):
        super().__init__(name=module_name(name))
        keys, weights = _checked(keys, weights, name)
        self.table_name = name
        self.key_dtype = tf.as_dtype(key_dtype)
        self.mode = quantization_lib.check_mode(quantization, name)
        self.dim = int(weights.shape[1])
        self.size = int(keys.shape[0])
        self.keys = tf.Variable(keys, trainable=False, name="keys")
        default_row = np.zeros([1, self.dim], np.float32)
        encoded = quantization_lib.encode(np.concatenate([weights, default_row]), self.mode, name)
        self.values = tf.Variable(encoded, trainable=False, name="values")
        self.index = tf.lookup.StaticHashTable(KeysToRows(self.keys, self.size == 0), default_value=np.int64(self.size))
        self.set_metadata(
            table_metadata(
                "dynamic", self.dim, self.size, self.size, self.mode, None, encoded.nbytes + keys.nbytes, "float32"
            )
        )

    def rows(self, ids: Any) -> tf.Tensor:
        """Row of each id in `values` (n for an id without a row), same shape as `ids`."""
        return self.index.lookup(to_keys(ids, self.key_dtype))

    def _gather_values(self, rows: Any) -> tf.Tensor:
        """The encoded rows at positions `rows`."""
        return tf.gather(self.values, rows)

    def gather_rows(self, rows: Any) -> tf.Tensor:
        """Float32 rows at positions `rows` (what `rows(ids)` returns) -> rows.shape + [dim]."""
        return quantization_lib.decode(self._gather_values(rows), self.mode, self.dim)

    def lookup(self, ids: Any) -> tf.Tensor:
        """Each id's row, shape ids.shape + [dim]; zeros for an id without a row (the training side's default)."""
        return self.gather_rows(self.rows(ids))


def _checked(keys: Any, weights: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    keys = np.asarray(keys, np.int64).reshape([-1])
    weights = np.asarray(weights, np.float32)
    if weights.ndim != 2 or weights.shape[0] != keys.shape[0]:
        raise ValueError(
            f"table {name!r}: weights must be [n, dim] with n = {keys.shape[0]} keys; got shape {weights.shape}"
        )
    if keys.shape[0] and np.unique(keys).shape[0] != keys.shape[0]:
        raise ValueError(f"table {name!r}: keys must be unique")
    return keys, weights


def freeze_arrays(
    keys: np.ndarray,
    weights: np.ndarray,
    key_dtype: tf.DType = tf.int64,
    name: str = "table",
    quantization: str | None = None,
) -> FrozenDynamicTable:
    """A `FrozenDynamicTable` from exported keys [n] and weights [n, dim] (encoded in `quantization`)."""
    keys, weights = _checked(keys, weights, name)
    order = np.argsort(keys, kind="stable")
    return FrozenDynamicTable(keys[order], weights[order], key_dtype, name, quantization)
