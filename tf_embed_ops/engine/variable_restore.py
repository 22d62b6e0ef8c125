"""The restore check of the in-memory kind's variables (tables, slots, `rounding_step`) for `engine.checkpoint`.

A variable's part of a checkpoint must have its shape (the table config's before `build`) and, once built, its dtype
(restoring before `build` converts dtypes, docs/low_precision.md); `rounding_step` must be >= 0. A table the
checkpoint holds as a tiered table (streamed, `tiered.checkpoint`) is checked the same way as a tiered table and,
after every table of the embedding passed, written here (`engine.tiered_restore`): TensorFlow cannot restore it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat, table_config
from tf_embed_ops import config as config_lib
from tf_embed_ops.engine import tiered_restore
from tf_embed_ops.tiered import checkpoint as tiered_checkpoint

__all__ = ["VariableCheck", "variable_checks"]


class VariableCheck:
    """A variable child: the shape a checkpoint must have, and the dtype (None: converted at creation)."""

    def __init__(self, shape: Any, dtype: Any):
        self.shape = tf.TensorShape(shape)
        self.dtype = None if dtype is None else tf.as_dtype(dtype)

    def check(self, name: str, node: Any, restore: Any) -> Callable[[], None] | None:
        """Checks child `name`'s checkpoint node (`restore`: the restore's checkpoint, `engine.checkpoint`);
        returns what restores it once every table passed (None: TensorFlow does)."""
        if node.registered_saver.name == tiered_checkpoint.SAVER_NAME:
            return _check_from_tiered(name, node, restore)
        keys = {a.name: a.checkpoint_key for a in node.attributes}
        key = keys.get("VARIABLE_VALUE")
        if key is None or key not in restore.shapes:
            return None
        got_shape, got_dtype = tf.TensorShape(restore.shapes[key]), tf.as_dtype(restore.dtypes[key])
        if not self.shape.is_compatible_with(got_shape):
            raise ValueError(
                f"TPUEmbedding restore: the checkpoint's {name!r} has shape {got_shape.as_list()}, this "
                f"object's is {self.shape.as_list()}; no table was changed"
            )
        if name == "rounding_step" and got_shape.rank == 0 and int(restore.read(key, name)) < 0:
            raise ValueError(
                f"TPUEmbedding restore: the checkpoint's 'rounding_step' is {int(restore.read(key, name))}, "
                f"it must be >= 0; no table was changed"
            )
        if self.dtype is not None and got_dtype != self.dtype:
            raise ValueError(
                f"TPUEmbedding restore: the checkpoint's {name!r} is {got_dtype.name}, this object's variable "
                f"is {self.dtype.name} (restore before the first build to convert); no table was changed"
            )
        return None


def variable_checks(embedding: Any) -> dict[str, VariableCheck]:
    """`{child name: VariableCheck}` of `embedding`'s in-memory tables, slots and `rounding_step`."""
    if embedding.built:
        return {
            name: VariableCheck(child.shape, child.dtype)
            for name, child in embedding.checkpoint_children().items()
            if hasattr(child, "shape") and hasattr(child, "dtype")
        }
    out = {}
    for table in embedding.table_configs:
        shape = (table.vocabulary_size, table.dim)
        out[table.name] = VariableCheck(shape, None)
        if table.optimizer is not None:
            shapes = config_lib.slot_shapes(table.optimizer, table.vocabulary_size, table.dim)
            for slot in _tf_compat.slot_names(table.optimizer):
                out[f"{table.name}/{slot}"] = VariableCheck(shapes.get(slot, shape), None)
    if table_config.needs_rounding_step(embedding.table_configs):
        out["rounding_step"] = VariableCheck((), None)
    return out


def _check_from_tiered(name: str, node: Any, restore: Any) -> Callable[[], None]:
    """Checks the streamed checkpoint of in-memory table `name` (saved tiered); returns its restore."""
    embedding = restore.embedding
    if not embedding.built or restore.position is None:
        raise ValueError(
            f"TPUEmbedding restore: the checkpoint at {restore.path} holds table {name!r} as a tiered table "
            "(streamed); restoring it into the in-memory table needs the embedding built first (call build()) and "
            "tf.train.Checkpoint's restore or read; no table was changed"
        )
    target = tiered_restore.VariablesTarget(embedding, name)
    plan = tiered_checkpoint.check_restore(target, node.registered_saver.object_name, restore.path, restore.reader)

    def write() -> None:
        plan.write()
        # TensorFlow is told the object holds nothing more (it refuses an object of a registered saver it does not
        # match).
        node.ClearField("registered_saver")

    return write
