"""All-or-nothing restore of a `te.TPUEmbedding`: every table's checkpoint data is checked before any is written.

TensorFlow restores a checkpoint object by object, so a table that refuses its data (a dynamic table's rows over
`max_rows`, a step of another shape, a static table of another shape) would otherwise refuse after other tables
were already overwritten. TensorFlow calls `Trackable._checkpoint_adapter(path)` when a restore reaches an object,
before it restores any of the object's children; `TPUEmbedding` checks there, with `validate`, every child the
checkpoint holds for it, asking each table group for its tables' checks (`TableGroup.restore_checks`):

- static tables, slots and `rounding_step` (`engine.variable_restore`): the checkpoint's shape is the variable's
  (the table config's when not built yet); once built, also its dtype; a table the checkpoint holds as a tiered
  table (streamed) is checked as one, then restored here after every check passed;
- dynamic tables (`dynamic.restore_check`): everything their import checks, from tensors or streamed;
- tiered tables (once built, `tiered.checkpoint.RestoreCheck`): their streamed checkpoint's manifest, geometry and
  every chunk, or the in-memory table's variables they would restore from, without reading any row.

A check returns what must run once every table passed (a restore TensorFlow cannot do, a rewrite of the
checkpoint's node); those run in child order.

Children the checkpoint has and this object lacks, or the reverse, are left to TensorFlow (`assert_consumed`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from tf_embed_ops.dynamic import checkpoint_check

__all__ = ["Restore", "calling_position", "validate"]

calling_position = checkpoint_check.calling_position

_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


@dataclasses.dataclass
class Restore:
    """The checkpoint a restore reads, as a table's check (`check(name, node, restore)`) sees it.

    Attributes:
      embedding: the `te.TPUEmbedding` being restored.
      path: the checkpoint's path; reader: `tf.train.load_checkpoint(path)`; shapes, dtypes: its tensors'.
      position: TensorFlow's position of the embedding in the checkpoint (None: not called from a restore).
    """

    embedding: Any
    path: str
    reader: Any
    shapes: dict
    dtypes: dict
    position: Any

    def read(self, key: str, table: str) -> Any:
        """One tensor; a truncated or corrupt file is a DataLossError naming it and the table (TensorFlow's
        reader raises IndexError "Read less bytes than requested" or an OpError)."""
        return checkpoint_check.read_tensor(
            self.reader, self.path, key, f"TPUEmbedding table {table!r}", "no table was changed"
        )


def _expected(embedding: Any) -> dict[str, Any]:
    """`{child name: check}` of the children a restore writes, from every table group (a later group's check of a
    name wins: the in-memory group's claims every variable child)."""
    out: dict[str, Any] = {}
    for group in embedding.groups:
        out.update(group.restore_checks())
    return out


def _node_children(graph: Any, node: Any) -> dict[str, Any]:
    return {child.local_name: graph.nodes[child.node_id] for child in node.children}


def _find_node(graph: Any, expected: dict) -> Any:
    """The one node whose children include every expected name, or None (none, or ambiguous)."""
    names = set(expected)
    found = [node for node in graph.nodes if names <= {c.local_name for c in node.children}]
    return found[0] if len(found) == 1 else None


def validate(embedding: Any, path: str) -> None:
    """Checks every table's data in the checkpoint at `path` against `embedding`; raises before anything is written.

    Args:
      embedding: the `te.TPUEmbedding` being restored (called from its `_checkpoint_adapter`).
      path: the checkpoint's path.

    Raises:
      ValueError: naming the table, the tensor and the values; no table, slot or dynamic table was changed.
      tf.errors.DataLossError: a data file is truncated or corrupt (naming the file and the table); nothing was
        changed.
    """
    expected = _expected(embedding)
    if not expected:
        return
    position = calling_position(embedding)
    reader = tf.train.load_checkpoint(path)
    if position is not None:
        graph, node = position.checkpoint.object_graph_proto, position.object_proto
    else:
        from tensorflow.core.protobuf import trackable_object_graph_pb2  # pylint: disable=import-outside-toplevel

        if not reader.has_tensor(_OBJECT_GRAPH_KEY):
            return
        graph = trackable_object_graph_pb2.TrackableObjectGraph()
        graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
        node = _find_node(graph, expected)
        if node is None:
            return
    restore = Restore(
        embedding, path, reader, reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map(), position
    )
    checkpoint_check.check_data_files(
        path, reader, f"TPUEmbedding (tables {sorted(_table_names(expected))})", "no table was changed"
    )
    after = []
    for name, child in _node_children(graph, node).items():
        check = expected.get(name)
        done = check.check(name, child, restore) if check is not None else None
        if done is not None:
            after.append(done)
    # Every table checked: what each check left to do runs now.
    for done in after:
        done()


def _table_names(expected: dict) -> set[str]:
    """The tables among the children a restore writes (slots and the step named by their table)."""
    return {name.split("/")[0] for name in expected if name != "rounding_step"}
