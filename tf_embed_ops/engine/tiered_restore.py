"""A tiered table's streamed checkpoint restored into the same table kept in memory.

A checkpoint of a `te.TPUEmbedding` with a tiered table holds that table through its registered saver (keys
`<table>/part-<k>`, `<table>/<slot>/part-<k>`, the manifest and the step: `tiered.checkpoint`), where the
in-memory table's variables would be. TensorFlow cannot restore those keys into a variable (it refuses an object
saved by a registered saver that the restoring object does not match), so the embedding's restore hook
(`engine.checkpoint.validate`) does it: it checks the tiered table's part of the checkpoint completely (manifest,
geometry against the in-memory table and its slots, every chunk's key, shape and dtype) with every other table's,
then writes the variables chunk by chunk (row slices; 16-bit variables take the rows rounded to nearest, exact
when the tiered table had the same storage dtype) and the embedding's rounding step from the tiered table's.
TensorFlow is then told the object has nothing more to restore.

Example:
    >>> tf.train.Checkpoint(embedding=tiered_embedding).write(path)
    >>> tf.train.Checkpoint(embedding=in_memory_embedding).read(path).expect_partial()
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat

__all__ = ["VariablesTarget"]


def _backing(var: Any, name: str) -> tf.Variable:
    """The tf.Variable behind a keras.Variable (its `.value`), or the variable itself; a sharded table's variable
    (one per shard) is refused, naming the table."""
    backing = var if isinstance(var, tf.Variable) else getattr(var, "value", None)
    if not isinstance(backing, tf.Variable) or isinstance(backing, _tf_compat.ShardedVariable):
        raise ValueError(
            f"TPUEmbedding restore: table {name!r} is saved tiered; restoring it into a table of "
            f"{type(var).__name__} (a sharded table) is not supported yet; no table was changed"
        )
    return backing


class _Step:
    """The embedding's `rounding_step` variable (None: a float32 table keeps none), as a table's `step`."""

    def __init__(self, variable: Any):
        self._variable = variable

    def assign(self, value: int) -> None:
        if self._variable is not None:
            self._variable.assign(tf.cast(value, self._variable.dtype))


class VariablesTarget:
    """An in-memory table's variables, shaped as a `TieredTable` for `tiered.checkpoint.check_restore`.

    Args:
      embedding: the built `te.TPUEmbedding`.
      name: the table's name.

    Raises:
      KeyError: `embedding` has no in-memory table `name`.
    """

    def __init__(self, embedding: Any, name: str):
        config = next(t for t in embedding.table_configs if t.name == name)
        variables = embedding.variables[name]
        self.table_name = name
        self.restore_label = f"TPUEmbedding table {name!r} (in memory, saved tiered)"
        self.slot_names = _tf_compat.slot_names(config.optimizer) if config.optimizer is not None else []
        self._variables = [_backing(variables[v], name) for v in ["parameters", *self.slot_names]]
        self.num_rows, self.dim = (int(d) for d in self._variables[0].shape)
        self.slot_widths = [int(v.shape[1]) for v in self._variables[1:]]
        self.step = _Step(embedding.rounding_step_variable)

    def write_rows(self, first_row: int, values: tf.Tensor, slots: list) -> None:
        """Rows `[first_row, first_row + n)` of the table and its slots (float32 in, cast to each variable's
        dtype)."""
        n = int(values.shape[0])
        for variable, value in zip(self._variables, [values, *slots], strict=True):
            variable[first_row : first_row + n].assign(tf.cast(value, variable.dtype))
