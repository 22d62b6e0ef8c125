"""All-or-nothing restore of a `te.TPUEmbedding`: every table's checkpoint data is checked before any is written.

TensorFlow restores a checkpoint object by object, so a table that refuses its data (a dynamic table's rows over
`max_rows`, a step of another shape, a static table of another shape) would otherwise refuse after other tables
were already overwritten. TensorFlow calls `Trackable._checkpoint_adapter(path)` when a restore reaches an object,
before it restores any of the object's children; `TPUEmbedding` checks there, with `validate`, every child the
checkpoint holds for it:

- static tables, slots and `rounding_step`: the checkpoint's shape is the variable's (the table config's when
  not built yet); once built, also its dtype (restoring before `build` converts dtypes, docs/low_precision.md);
- dynamic tables: everything their import checks (`dynamic.checkpoint_check.TableSpec.validate`);
- tiered tables (once built): their streamed checkpoint's manifest, geometry and every chunk, or the in-memory
  table's variables they would restore from (`tiered.checkpoint.check_restore`), without reading any row;
- in-memory tables the checkpoint holds as tiered tables (streamed): checked the same way, then restored here,
  after every check passed (`engine.tiered_restore`), since TensorFlow cannot restore them;
- dynamic tables the checkpoint holds as tiered tables (streamed, `dynamic.tiered_checkpoint`): the metadata and
  every chunk (read once, one at a time); for an in-memory dynamic table the checkpoint's node then lists the
  tensors (the in-memory format's) in place of the registered saver, and TensorFlow restores them.

Children the checkpoint has and this object lacks, or the reverse, are left to TensorFlow (`assert_consumed`).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat, table_config
from tf_embed_ops import config as config_lib
from tf_embed_ops.dynamic import checkpoint_check
from tf_embed_ops.dynamic import config as dynamic_config
from tf_embed_ops.dynamic import table as dynamic_table
from tf_embed_ops.dynamic import tiered_checkpoint as dynamic_tiered_checkpoint
from tf_embed_ops.engine import tiered_restore
from tf_embed_ops.tiered import checkpoint as tiered_checkpoint
from tf_embed_ops.tiered import config as tiered_config
from tf_embed_ops.tiered import table as tiered_table

__all__ = ["calling_position", "validate"]

calling_position = checkpoint_check.calling_position

_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_VALUE = ".ATTRIBUTES/VARIABLE_VALUE"


class _Variable:
    """A static child: the shape a checkpoint must have, and the dtype (None: converted at creation)."""

    def __init__(self, shape: Any, dtype: Any):
        self.shape = tf.TensorShape(shape)
        self.dtype = None if dtype is None else tf.as_dtype(dtype)


def _expected(embedding: Any) -> dict[str, Any]:
    """`{child name: _Variable | TableSpec}` of the children a restore writes."""
    out: dict[str, Any] = {}
    if embedding.built:
        for name, child in embedding.checkpoint_children().items():
            spec = getattr(child, "spec", None)
            if isinstance(spec, checkpoint_check.TableSpec):
                out[name] = spec
            elif isinstance(child, tiered_table.TieredTable):
                out[name] = child
            elif hasattr(child, "shape") and hasattr(child, "dtype"):
                out[name] = _Variable(child.shape, child.dtype)
        return out
    for table in embedding.table_configs:
        shape = (table.vocabulary_size, table.dim)
        out[table.name] = _Variable(shape, None)
        if table.optimizer is not None:
            shapes = config_lib.slot_shapes(table.optimizer, table.vocabulary_size, table.dim)
            for slot in _tf_compat.slot_names(table.optimizer):
                out[f"{table.name}/{slot}"] = _Variable(shapes.get(slot, shape), None)
    if table_config.needs_rounding_step(embedding.table_configs):
        out["rounding_step"] = _Variable((), None)
    group = embedding.dynamic_group
    if group is not None:
        for config in group.table_configs:
            attrs = dynamic_config.handle_attrs(config)
            out[config.name] = checkpoint_check.TableSpec.of(attrs, group.num_shards, tuple(range(group.num_shards)))
    return out


def _node_children(graph: Any, node: Any) -> dict[str, Any]:
    return {child.local_name: graph.nodes[child.node_id] for child in node.children}


def _find_node(graph: Any, expected: dict) -> Any:
    """The one node whose children include every expected name, or None (none, or ambiguous)."""
    names = set(expected)
    found = [node for node in graph.nodes if names <= {c.local_name for c in node.children}]
    return found[0] if len(found) == 1 else None


def _read(reader: Any, path: str, key: str, table: str) -> Any:
    """One tensor; a truncated or corrupt file is a DataLossError naming it and the table (TensorFlow's reader
    raises IndexError "Read less bytes than requested" or an OpError)."""
    return checkpoint_check.read_tensor(reader, path, key, f"TPUEmbedding table {table!r}", "no table was changed")


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
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    checkpoint_check.check_data_files(
        path, reader, f"TPUEmbedding (tables {sorted(_table_names(expected))})", "no table was changed"
    )
    from_tiered = []  # (checkpoint node, checked restore) of in-memory tables saved tiered
    to_memory = []  # (checkpoint node, tensor names) of in-memory dynamic tables saved tiered (streamed)
    configs = _dynamic_configs(embedding)
    checked = []  # the dynamic tables whose tensors were validated here (their own check need not read them again)
    objects = embedding.checkpoint_children() if embedding.built else {}
    for name, child in _node_children(graph, node).items():
        want = expected.get(name)
        keys = {a.name: a.checkpoint_key for a in child.attributes}
        if isinstance(want, _Variable) and child.registered_saver.name == tiered_checkpoint.SAVER_NAME:
            from_tiered.append((child, _check_from_tiered(embedding, name, child, path, reader, position)))
        elif (
            isinstance(want, checkpoint_check.TableSpec)
            and child.registered_saver.name == dynamic_tiered_checkpoint.SAVER_NAME
        ):
            names = _check_streamed_dynamic(want, configs.get(name), child, path, reader, position)
            if names:
                to_memory.append((child, names))
        elif isinstance(want, checkpoint_check.TableSpec):
            tensors = {k: _read(reader, path, key, name) for k, key in keys.items() if key in shapes}
            want.validate(tensors, "restore")
            if name in objects:
                checked.append(objects[name])
        elif isinstance(want, tiered_table.TieredTable):
            # Streamed (its saver's object name) or the in-memory table's checkpoint (its variable's key).
            key = child.registered_saver.object_name or keys.get("VARIABLE_VALUE")
            if key:
                tiered_checkpoint.check_restore(want, key, path, reader)
        elif isinstance(want, _Variable) and "VARIABLE_VALUE" in keys and keys["VARIABLE_VALUE"] in shapes:
            key = keys["VARIABLE_VALUE"]
            got_shape, got_dtype = tf.TensorShape(shapes[key]), tf.as_dtype(dtypes[key])
            if not want.shape.is_compatible_with(got_shape):
                raise ValueError(
                    f"TPUEmbedding restore: the checkpoint's {name!r} has shape {got_shape.as_list()}, this "
                    f"object's is {want.shape.as_list()}; no table was changed"
                )
            if name == "rounding_step" and got_shape.rank == 0 and int(_read(reader, path, key, name)) < 0:
                raise ValueError(
                    f"TPUEmbedding restore: the checkpoint's 'rounding_step' is {int(_read(reader, path, key, name))}, "
                    f"it must be >= 0; no table was changed"
                )
            if want.dtype is not None and got_dtype != want.dtype:
                raise ValueError(
                    f"TPUEmbedding restore: the checkpoint's {name!r} is {got_dtype.name}, this object's variable "
                    f"is {want.dtype.name} (restore before the first build to convert); no table was changed"
                )
    for table in checked:
        checkpoint_check.mark_checked(table, path)
    # Every table checked: the in-memory tables saved tiered are written now, and TensorFlow is told their
    # checkpoint objects hold nothing more (it would refuse an object of a registered saver it does not match).
    for child, plan in from_tiered:
        plan.write()
        child.ClearField("registered_saver")
    # A streamed dynamic table's tensors are the in-memory format's: TensorFlow restores them into the in-memory
    # table once the node lists them as its tensors instead of naming the registered saver.
    for child, names in to_memory:
        object_name = child.registered_saver.object_name
        child.ClearField("registered_saver")
        for tensor in names:
            attribute = child.attributes.add()
            attribute.name = tensor
            attribute.checkpoint_key = dynamic_tiered_checkpoint.checkpoint_key(object_name, tensor)


def _table_names(expected: dict) -> set[str]:
    """The tables among the children a restore writes (slots and the step named by their table)."""
    return {name.split("/")[0] for name in expected if name != "rounding_step"}


def _dynamic_configs(embedding: Any) -> dict[str, Any]:
    """`{child name: DynamicTableConfig}` of the embedding's dynamic tables."""
    if embedding.built:
        return {
            name: child.config
            for name, child in embedding.checkpoint_children().items()
            if isinstance(getattr(child, "spec", None), checkpoint_check.TableSpec)
        }
    group = embedding.dynamic_group
    return {} if group is None else {config.name: config for config in group.table_configs}


def _check_streamed_dynamic(
    spec: checkpoint_check.TableSpec, config: Any, child: Any, path: str, reader: Any, position: Any
) -> tuple[str, ...]:
    """Checks the streamed checkpoint of dynamic table `spec.name` (saved tiered: keys whole, rows in chunks),
    every chunk included; returns the tensor names an in-memory table restores from it, or () for a tiered table
    (its registered saver restores it)."""
    policy = dynamic_table.policy_tensor_names(config) if config is not None else ()
    tiered = config is not None and tiered_config.storage_of(config) is not None
    object_name = child.registered_saver.object_name
    filter_bytes = dynamic_tiered_checkpoint.bloom_bytes(dynamic_config.handle_attrs(config)) if config else 0
    dynamic_tiered_checkpoint.check_streamed(
        spec, policy, object_name, path, reader, remember=tiered, filter_bytes=filter_bytes
    )
    if tiered:
        return ()
    if position is None:
        raise ValueError(
            f"TPUEmbedding restore: the checkpoint at {path} holds dynamic table {spec.name!r} as a tiered table "
            "(streamed); restoring it into the in-memory table needs tf.train.Checkpoint's restore or read; no "
            "table was changed"
        )
    return (*dynamic_table.CHECKPOINT_TENSORS, *policy)


def _check_from_tiered(embedding: Any, name: str, child: Any, path: str, reader: Any, position: Any) -> Any:
    """Checks the streamed checkpoint of in-memory table `name` (saved tiered); returns its restore plan."""
    if not embedding.built or position is None:
        raise ValueError(
            f"TPUEmbedding restore: the checkpoint at {path} holds table {name!r} as a tiered table (streamed); "
            "restoring it into the in-memory table needs the embedding built first (call build()) and "
            "tf.train.Checkpoint's restore or read; no table was changed"
        )
    target = tiered_restore.VariablesTarget(embedding, name)
    return tiered_checkpoint.check_restore(target, child.registered_saver.object_name, path, reader)
