"""The restore check of a dynamic table (in memory or tiered, sharded or not) for `engine.checkpoint`: everything
its import checks, before any table of the embedding is written.

A checkpoint holds the table as tensors (the in-memory format) or streamed (a tiered table's registered saver: keys
whole, rows in chunks, `dynamic.tiered_checkpoint`); either restores into either kind. The streamed format's
metadata and every chunk are checked (read once, one at a time); for an in-memory table, the checkpoint's node then
lists the tensors (the in-memory format's) in place of the registered saver, and TensorFlow restores them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tf_embed_ops.dynamic import checkpoint_check, table_state, tiered_checkpoint
from tf_embed_ops.dynamic import config as dynamic_config
from tf_embed_ops.tiered import config as tiered_config

__all__ = ["DynamicCheck"]


class DynamicCheck:
    """One dynamic table's restore check.

    Args:
      spec: the table's `checkpoint_check.TableSpec`.
      config: its `DynamicTableConfig`.
      table: the table object once built (its own restore then need not read its tensors again), else None.
    """

    def __init__(self, spec: checkpoint_check.TableSpec, config: Any, table: Any = None):
        self.spec, self.config, self.table = spec, config, table

    @classmethod
    def of(cls, configs: list, num_shards: int, tables: list) -> dict[str, DynamicCheck]:
        """`{table name: DynamicCheck}` of a group's tables (`configs`; `tables`: their objects, [] before build)."""
        if tables:
            return {config.name: cls(table.spec, config, table) for config, table in zip(configs, tables, strict=True)}
        return {
            config.name: cls(
                checkpoint_check.TableSpec.of(
                    dynamic_config.handle_attrs(config), num_shards, tuple(range(num_shards))
                ),
                config,
            )
            for config in configs
        }

    def check(self, name: str, node: Any, restore: Any) -> Callable[[], None] | None:
        """Checks the table's checkpoint node (`restore`: the restore's checkpoint, `engine.checkpoint`); returns
        what runs once every table passed."""
        if node.registered_saver.name == tiered_checkpoint.SAVER_NAME:
            names = self._check_streamed(node, restore)
            return (lambda: _list_tensors(node, names)) if names else None
        keys = {a.name: a.checkpoint_key for a in node.attributes}
        tensors = {k: restore.read(key, name) for k, key in keys.items() if key in restore.shapes}
        self.spec.validate(tensors, "restore")
        table, path = self.table, restore.path
        return (lambda: checkpoint_check.mark_checked(table, path)) if table is not None else None

    def _check_streamed(self, node: Any, restore: Any) -> tuple[str, ...]:
        """Checks the streamed checkpoint (saved tiered: keys whole, rows in chunks), every chunk included; returns
        the tensor names an in-memory table restores from it, or () for a tiered table (its registered saver
        restores it)."""
        config, spec = self.config, self.spec
        policy = table_state.policy_tensor_names(config)
        tiered = tiered_config.storage_of(config) is not None
        filter_bytes = tiered_checkpoint.bloom_bytes(dynamic_config.handle_attrs(config))
        object_name = node.registered_saver.object_name
        tiered_checkpoint.check_streamed(
            spec, policy, object_name, restore.path, restore.reader, remember=tiered, filter_bytes=filter_bytes
        )
        if tiered:
            return ()
        if restore.position is None:
            raise ValueError(
                f"TPUEmbedding restore: the checkpoint at {restore.path} holds dynamic table {spec.name!r} as a "
                "tiered table (streamed); restoring it into the in-memory table needs tf.train.Checkpoint's restore "
                "or read; no table was changed"
            )
        return (*table_state.CHECKPOINT_TENSORS, *policy)


def _list_tensors(node: Any, names: tuple[str, ...]) -> None:
    """A streamed table's tensors are the in-memory format's: TensorFlow restores them into the in-memory table
    once the node lists them as its tensors instead of naming the registered saver."""
    object_name = node.registered_saver.object_name
    node.ClearField("registered_saver")
    for tensor in names:
        attribute = node.attributes.add()
        attribute.name = tensor
        attribute.checkpoint_key = tiered_checkpoint.checkpoint_key(object_name, tensor)
