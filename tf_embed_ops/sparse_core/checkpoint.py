"""Checkpoint objects for `TPUEmbeddingV2`'s stacked SparseCore layout, backed by per-table variables.

A `TPUEmbeddingV2` checkpoint holds one entry per stacked table and slot (`<stack>`, `<stack>/<slot>`) and the
`SparseCoreTableLayouts` proto under `_sparse_core_table_layouts` (tiered tables, never stacked, are held by their
own saver: `engine.stacked_tiered_restore`). `StackedSlot` writes the stacked value from the
per-table variables and splits a restored value back (with the layouts `layouts_for_restore` chose);
`layouts_for_restore` reads a checkpoint's layouts before anything is restored.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tf_embed_ops._tf_compat import sparse_core_layout_pb2, trackable_base
from tf_embed_ops._tf_compat import tpu_embedding_v3_utils as _v3_utils

__all__ = [
    "LAYOUTS_KEY",
    "StackedSlot",
    "check_same_stacks",
    "layouts_trackable",
    "layouts_for_restore",
    "read_layouts",
]

LAYOUTS_KEY = _v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY


class StackedSlot(trackable_base.Trackable):
    """One stacked entry (a stack's parameters or one slot): `read()` gives its value, `write(value)` splits it."""

    def __init__(self, read: Callable[[], tf.Tensor], write: Callable[[tf.Tensor], list]):
        self._read, self._write = read, write

    def _serialize_to_tensors(self) -> dict:
        return {trackable_base.VARIABLE_VALUE_KEY: self._read()}

    def _restore_from_tensors(self, restored_tensors: dict):
        return tf.group(self._write(restored_tensors[trackable_base.VARIABLE_VALUE_KEY]))


def layouts_trackable(layouts: dict) -> trackable_base.Trackable:
    """TensorFlow's own `_sparse_core_table_layouts` entry (written, never restored) for `{table: layout}`."""
    proto = sparse_core_layout_pb2.SparseCoreTableLayouts()
    proto.tables.extend(layouts[n] for n in sorted(layouts))
    with tf.device("/cpu:0"):
        return _v3_utils.SparseCoreLayoutsTrackable(tf.constant(proto.SerializeToString(), dtype=tf.string))


def _stacks(layouts: dict) -> dict:
    out = {}
    for lay in layouts.values():
        out.setdefault(lay.stacked_table_name, set()).add((lay.table_name, tuple(lay.unsharded_shape)))
    return out


def read_layouts(path: str) -> dict | None:
    """The checkpoint's `{table: SparseCoreTableLayout}`, or None for a checkpoint without them (per table)."""
    reader = tf.train.load_checkpoint(path)
    key = next((k for k in reader.get_variable_to_dtype_map() if LAYOUTS_KEY in k), None)
    if key is None:
        return None
    proto = sparse_core_layout_pb2.SparseCoreTableLayouts()
    proto.ParseFromString(reader.get_tensor(key))
    return {lay.table_name: lay for lay in proto.tables}


def check_same_stacks(path: str, theirs: dict, ours: dict) -> None:
    """Refuses a checkpoint whose stacks (tables and shapes in each stacked table) are not ours.

    Raises:
      ValueError: the checkpoint stacks its tables differently.
    """
    if _stacks(theirs) != _stacks(ours):

        def names(layouts):
            return {k: sorted(t for t, _ in v) for k, v in _stacks(layouts).items()}

        raise ValueError(
            f"The checkpoint at {path} stacks its tables differently (checkpoint: {names(theirs)}, this object: "
            f"{names(ours)}, or the table shapes differ); resharding between stackings is not implemented. Create "
            "this object with the tables and SparseCoreEmbeddingConfig the checkpoint was written with."
        )


def layouts_for_restore(path: str, ours: dict) -> dict | None:
    """The layouts to split a checkpoint's stacked values with, or None for a per-table checkpoint.

    Same layouts as ours, or another topology with the same stacks (same tables and shapes in each stacked
    table): the checkpoint's own layouts. Another stacking raises before anything is restored (TensorFlow's TPU
    class reshards that case; not implemented here).

    Raises:
      ValueError: the checkpoint stacks its tables differently.
    """
    theirs = read_layouts(path)
    if theirs is not None:
        check_same_stacks(path, theirs, ours)
    return theirs
