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

from tf_embed_ops.dynamic.frozen import FrozenDynamicTable, KeysToRows, freeze_arrays, string_keys, to_keys
from tf_embed_ops.dynamic.streamed_serving import StreamedDynamicTable, freeze_streamed
from tf_embed_ops.serving import prune as prune_lib
from tf_embed_ops.serving import quantization as quantization_lib

__all__ = [
    "FrozenDynamicTable",
    "KeysToRows",
    "StreamedDynamicTable",
    "freeze",
    "freeze_arrays",
    "freeze_streamed",
    "string_keys",
    "to_keys",
]


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
