"""Restores of a `TPUEmbeddingV2` with tiered tables, and across the tiered and in-memory kinds of a table.

A tiered table is never stacked (its rows live in its own row file, `sparse_core.layout.compute_stacking(apart=)`),
so a `TPUEmbeddingV2` checkpoint holds it as `te.TPUEmbedding`'s does: under its table name, through the tiered
tables' registered saver (`tiered.checkpoint`: rows and slots streamed chunk by chunk), beside the stacked entries
of the in-memory tables and their layouts (the `_sparse_core_table_layouts` proto lists the in-memory tables only).

`TPUEmbeddingV2._checkpoint_adapter` calls `plan_restore` before TensorFlow restores any child; it checks every
case below, then `RestorePlan.write()` writes what TensorFlow cannot restore itself:

- a tiered table held streamed: checked here (manifest, geometry, every chunk's key, shape and dtype), restored by
  TensorFlow through the registered saver afterwards;
- a tiered table held in the stacked layout (a checkpoint of the same `TPUEmbeddingV2` with the table in memory,
  where it was alone in its stack): its stacked entries are checked here, then unstacked with the checkpoint's
  layout and written chunk by chunk (its rounding step from the checkpoint's `rounding_step`, when it has one),
  and TensorFlow is told the entries hold nothing more;
- a tiered table held per table (a `te.TPUEmbedding` checkpoint of the table in memory): checked here, restored by
  the saver from the variable's key (`tiered.checkpoint`, variable format);
- an in-memory table held streamed (a checkpoint of a tiered table): the table must be alone in its stack here; it
  is checked and written (`engine.tiered_restore.VariablesTarget` over the engine's per-table variables), and
  TensorFlow is told the entry holds nothing more.

A tiered table the checkpoint stacks with other tables, or an in-memory table held streamed that shares its stack
here, is refused with a `ValueError` naming the table and the stack: the other tables of that stack are laid out
differently on the two sides. Every refusal comes before the first write, so a refused restore changes no table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops.engine import tiered_restore
from tf_embed_ops.sparse_core import checkpoint as checkpoint_lib
from tf_embed_ops.sparse_core import layout as layout_lib
from tf_embed_ops.tiered import checkpoint as tiered_checkpoint

__all__ = ["RestorePlan", "holds_streamed", "plan_restore"]

_ROW_DTYPES = (tf.float32, tf.bfloat16, tf.float16)


@dataclasses.dataclass
class RestorePlan:
    """What `plan_restore` decided: the layouts to split the in-memory stacks with (None: a per-table checkpoint)
    and the writes to run once every table was checked."""

    layouts: dict | None
    writes: list[Callable[[], None]]

    def write(self) -> None:
        for write in self.writes:
            write()


def _children(position: Any) -> dict[str, Any]:
    """`{local name: object proto}` of the embedding's node in the checkpoint being restored ({} when unknown)."""
    if position is None:
        return {}
    graph, node = position.checkpoint.object_graph_proto, position.object_proto
    return {child.local_name: graph.nodes[child.node_id] for child in node.children}


def holds_streamed(position: Any) -> bool:
    """Whether the embedding's node in the checkpoint being restored has a child saved as a tiered table
    (False when the position is unknown)."""
    return any(node.registered_saver.name == tiered_checkpoint.SAVER_NAME for node in _children(position).values())


def _variable_key(node: Any) -> str | None:
    return next((a.checkpoint_key for a in node.attributes if a.name == "VARIABLE_VALUE"), None)


def _stack_members(layouts: dict, stack: str) -> list[str]:
    return sorted(name for name, layout in layouts.items() if layout.stacked_table_name == stack)


def _refuse(path: str, what: str) -> ValueError:
    return ValueError(f"TPUEmbeddingV2 restore from {path}: {what}; no table was changed")


def _rounding_step(children: dict, path: str, reader: Any) -> int | None:
    """The checkpoint's `rounding_step` (its in-memory 16-bit tables' step), None when it has none."""
    node = children.get("rounding_step")
    key = None if node is None else _variable_key(node)
    if key is None or key not in reader.get_variable_to_shape_map():
        return None
    value = reader.get_tensor(key)
    if np.shape(value) != () or int(value) < 0:
        raise _refuse(path, f"the checkpoint's 'rounding_step' is {value!r}; it must be a scalar >= 0")
    return int(value)


def _check_stacked(table: Any, layout: Any, children: dict, path: str, reader: Any) -> Callable[[], None]:
    """Checks tiered `table`'s stacked entries (its stack holds it alone); returns the write."""
    stack = layout.stacked_table_name
    if tuple(layout.unsharded_shape) != (table.num_rows, table.dim):
        raise _refuse(
            path,
            f"the checkpoint holds table {table.table_name!r} with shape {list(layout.unsharded_shape)}, the tiered "
            f"table has [{table.num_rows}, {table.dim}]",
        )
    names = [stack] + [f"{stack}/{slot}" for slot in table.slot_names]
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    keys = []
    for name, width in zip(names, [table.dim, *table.slot_widths], strict=True):
        node = children.get(name)
        key = None if node is None else _variable_key(node)
        if key is None or key not in shapes:
            raise _refuse(path, f"the checkpoint has no entry {name!r} for tiered table {table.table_name!r}")
        padded_rows, padded_cols = layout.unsharded_padded_shape
        rows_per_shard = layout.total_rows_per_sparse_core_shard
        want = [layout.num_sparse_cores * rows_per_shard, padded_cols]
        if list(shapes[key]) != want or width > padded_cols or tf.as_dtype(dtypes[key]) not in _ROW_DTYPES:
            raise _refuse(
                path,
                f"the checkpoint's {name!r} is {tf.as_dtype(dtypes[key]).name} {list(shapes[key])}; tiered table "
                f"{table.table_name!r} (width {width}) needs a float {want} of its layout",
            )
        keys.append((key, width, node))

    step = _rounding_step(children, path, reader)

    def write() -> None:
        parts = []
        for key, width, _ in keys:
            value = layout_lib.unstack_value(reader.get_tensor(key), layout)  # whole: it came from memory
            parts.append(tf.cast(value[:, :width], tf.float32))
        for start, n in table.chunks():
            table.write_rows(start, parts[0][start : start + n], [p[start : start + n] for p in parts[1:]])
        if step is not None:
            table.step.assign(step)
        table.mark_all_touched()
        for _, _, node in keys:  # TensorFlow would hand the stacked value to the tiered table's saver
            del node.attributes[:]

    return write


def plan_restore(
    path: str, position: Any, theirs: dict | None, memory_layouts: dict, tiered_tables: dict, engine: Any
) -> RestorePlan:
    """Checks the tiered tables' part of the checkpoint at `path` and the stacks, writing nothing.

    Args:
      path: the checkpoint.
      position: TensorFlow's position of the embedding in the checkpoint (`engine.checkpoint.calling_position`).
      theirs: the checkpoint's layouts (`sparse_core.checkpoint.read_layouts`), None for a per-table checkpoint.
      memory_layouts: the layouts of this embedding's in-memory tables (its stacked entries).
      tiered_tables: `{table name: TieredTable}` of this embedding.
      engine: the `te.TPUEmbedding` holding the in-memory tables' per-table variables.

    Returns:
      The plan: its `layouts` split the in-memory stacks TensorFlow restores; its `write()` restores the rest.

    Raises:
      ValueError: naming the table (and the stack) that cannot be restored; nothing was written.
    """
    reader = tf.train.load_checkpoint(path)
    children = _children(position)
    streamed = {n for n, node in children.items() if node.registered_saver.name == tiered_checkpoint.SAVER_NAME}
    theirs = None if theirs is None else dict(theirs)
    ours = dict(memory_layouts)
    writes: list[Callable[[], None]] = []
    for name, table in sorted(tiered_tables.items()):
        node = children.get(name)
        if name in streamed:
            # Restored by TensorFlow through the registered saver, after this check.
            tiered_checkpoint.check_restore(table, node.registered_saver.object_name, path, reader)
        elif theirs is not None and name in theirs:
            layout = theirs.pop(name)
            mates = _stack_members(theirs, layout.stacked_table_name)
            if mates:
                raise _refuse(
                    path,
                    f"the checkpoint stacks table {name!r} (tiered here) with {mates} in stacked table "
                    f"{layout.stacked_table_name!r}; a tiered table is never stacked, so those tables are laid out "
                    "differently here. Restore from a checkpoint where the table had a stack of its own (another "
                    "width or optimizer than the others, or SparseCoreEmbeddingConfig(disable_table_stacking=True))",
                )
            if position is None:
                raise _refuse(path, f"tiered table {name!r} is held stacked; restore it with tf.train.Checkpoint")
            writes.append(_check_stacked(table, layout, children, path, reader))
        elif theirs is None and node is not None and _variable_key(node) is not None:
            # A per-table checkpoint of the table in memory: the saver reads the variable's rows (checked here).
            tiered_checkpoint.check_restore(table, _variable_key(node), path, reader)
    for name in sorted(streamed - set(tiered_tables)):
        if name not in ours:
            continue  # not a table of ours: TensorFlow leaves it unmatched
        stack = ours[name].stacked_table_name
        mates = [t for t in _stack_members(ours, stack) if t != name]
        if mates:
            raise _refuse(
                path,
                f"the checkpoint holds table {name!r} as a tiered table (streamed); here it is in memory and stacked "
                f"with {mates} in stacked table {stack!r}, which the checkpoint lays out without it. Give it a stack "
                "of its own (another width or optimizer, or SparseCoreEmbeddingConfig(disable_table_stacking=True))",
            )
        target = tiered_restore.VariablesTarget(engine, name)
        target.restore_label = f"TPUEmbeddingV2 table {name!r} (in memory, saved tiered)"
        checked = tiered_checkpoint.check_restore(target, children[name].registered_saver.object_name, path, reader)
        ours.pop(name)

        def write(checked: Any = checked, node: Any = children[name]) -> None:
            checked.write()
            node.ClearField("registered_saver")  # TensorFlow would refuse a saver the variable does not match

        writes.append(write)
    if theirs is not None:
        checkpoint_lib.check_same_stacks(path, theirs, ours)
    return RestorePlan(theirs, writes)
