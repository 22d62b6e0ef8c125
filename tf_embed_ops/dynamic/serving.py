"""Serving a dynamic table without the plugin: its rows frozen into plain TensorFlow state.

A dynamic table lives in a custom resource, which a serving binary without `tf_embed_ops` cannot load. `freeze`
copies its content (sorted by key) into state that stock TensorFlow holds and checkpoints:

- `keys`: an int64 `tf.Variable` [n], the table's keys;
- `index`: a `tf.lookup.StaticHashTable` key -> row, filled from `keys` when it is initialised (after a SavedModel
  has restored its variables), with default `n`: a key without a row maps to the extra row;
- `values`: a float32 `tf.Variable` [n + 1, dim], the rows in key order plus one default row of zeros (what the
  training side reads for a key without a row). With a `quantization` mode the rows are stored encoded
  (`tf_embed_ops.serving.quantization`: uint8 fused rows for int8/int4, float16/bfloat16) and decoded after the
  gather; the default row encodes zeros exactly in every mode.

A tiered table (`storage=te.Tiered`, rows on disk, possibly larger than memory) is not frozen: `freeze` refuses it,
and `freeze_streamed` (`streamed_serving.py`) makes the same servable with the rows written into the SavedModel's
checkpoint chunk by chunk by `te.serving.save_streamed`.

`freeze(table, quantization=..., prune=...)` may also drop rows (`tf_embed_ops.serving.Prune`: by update count,
age, L2 norm, a per-shard cap) from the frozen copy; a dropped key then reads the default row, as an unknown key
does. The training table is not changed.

The keys live in a variable rather than in the hash table's initializer because an initializer's tensors are
written into the SavedModel's graph as constants, and a graph over 2 GB cannot be serialised.

String ids are reduced to keys with `string_keys` (`_ops.string_keys_to_int64`): TensorFlow's farmhash
Fingerprint64 read as a little-endian int64, which the ops compute inside the kernel and stock TensorFlow computes
with `tf.fingerprint`.

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
from tf_embed_ops.serving import prune as prune_lib
from tf_embed_ops.serving import quantization as quantization_lib
from tf_embed_ops.serving.tables import MetadataMixin, module_name, table_metadata

# (`StreamedDynamicTable` and `freeze_streamed` too, loaded on first use: see `__getattr__` below.)
__all__ = ["FrozenDynamicTable", "freeze", "freeze_arrays", "string_keys", "to_keys"]


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

    def gather_parts(self, rows: Any) -> tuple | None:
        """(codes, scale, bias) at positions `rows` for int8/int4 (`quantization.decode_parts`), else None."""
        if not quantization_lib.is_rowwise(self.mode):
            return None
        return quantization_lib.decode_parts(self._gather_values(rows), self.mode, self.dim)

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


def _shards(table: Any) -> tuple:
    return tuple(getattr(table, "shards", None) or (table,))


def freeze(table: Any, quantization: str | None = None, prune: Any = None) -> FrozenDynamicTable:
    """Freezes a `DynamicTable` (or a `ShardedDynamicTable`) as it is now, eagerly.

    Only the weights are kept: optimizer slots and admission state are training state. Later training does not
    change the frozen copy; freeze again to refresh it.

    Args:
      table: the dynamic table.
      quantization: the encoding of the frozen rows (`tf_embed_ops.serving.quantization.MODES`).
      prune: a `tf_embed_ops.serving.Prune`, applied to each shard's rows (so `max_rows` caps each shard), with
        the table's own update counts, last-update steps and step counter; None keeps every row.

    Returns:
      The `FrozenDynamicTable`; its `metadata` records the rows trained and kept.

    Raises:
      ValueError: an unknown quantization mode, a `prune` that is not a `Prune`, rows the mode cannot encode
        (naming the table), or a tiered table (`storage=te.Tiered`: its rows may not fit in memory; export it with
        `freeze_streamed`).
    """
    name = table.table_name
    if any(getattr(shard, "tiered", None) is not None for shard in _shards(table)):
        raise ValueError(
            f"DynamicTable {name!r} is tiered (storage=te.Tiered): freeze would read all its rows into memory. "
            "Export it with te.dynamic.serving.freeze_streamed(table, quantization=..., prune=...), saved by "
            "te.serving.save_streamed(root, export_dir, signatures=...): its rows are streamed from the tier into "
            "the SavedModel chunk by chunk"
        )
    quantization_lib.check_mode(quantization, name)
    if prune is not None:
        prune_lib.check_applicable(prune, name, dynamic=True)
    # Eagerly, even when called while a serving function is traced: the export is read now and the frozen state
    # is created outside the function (as variables and tables must be).
    with tf.init_scope():
        keys, weights, trained = [], [], 0
        for shard in _shards(table):
            contents = {
                k: v.numpy() for k, v in shard.export().items() if k in ("keys", "weights", "counts", "last_steps")
            }
            trained += contents["keys"].shape[0]
            if prune is not None:
                kept = prune_lib.select(
                    prune,
                    name,
                    contents["weights"],
                    order_keys=contents["keys"],
                    counts=contents["counts"],
                    last_steps=contents["last_steps"],
                    step=int(shard.step.numpy()),
                )
                contents = {k: v[kept] for k, v in contents.items()}
            keys.append(contents["keys"])
            weights.append(contents["weights"])
        dim = table.dim
        frozen = freeze_arrays(
            np.concatenate(keys) if keys else np.zeros([0], np.int64),
            np.concatenate(weights) if weights else np.zeros([0, dim], np.float32),
            table.key_dtype,
            name,
            quantization,
        )
    metadata = frozen.metadata
    metadata.update(rows_trained=trained, rows_pruned=trained - frozen.size, bytes_float32=trained * dim * 4)
    metadata["prune"] = prune.criteria() if prune is not None else None
    frozen.set_metadata(metadata)
    return frozen


def __getattr__(name: str) -> Any:
    # A tiered table's streamed serving form (tf_embed_ops/dynamic/streamed_serving.py), which builds on this module.
    if name in ("StreamedDynamicTable", "freeze_streamed"):
        import importlib  # pylint: disable=import-outside-toplevel

        return getattr(importlib.import_module("tf_embed_ops.dynamic.streamed_serving"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
