"""What a table held by a C++ resource shares (`DynamicTable`, `TieredTable`): a `TrackableResource`, as TensorFlow's
`MutableHashTable` is, so a SavedModel or a `tf.function` captures its handle like any resource's."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class TableResource(tf.saved_model.experimental.TrackableResource):
    """The resource's lifecycle and the table's common surface. A subclass sets `_config` and `_table_name` before
    `super().__init__()` and writes `_create_resource` (the handle op, which creates the table on its first run)."""

    _config: Any
    _table_name: str

    def _initialize(self) -> None:
        # The handle op creates (or opens) the table on its first run; nothing else to do.
        return None

    def _destroy_resource(self) -> None:
        tf.raw_ops.DestroyResourceOp(resource=self.resource_handle, ignore_lookup_error=True)

    @property
    def handle(self) -> tf.Tensor:
        """The resource handle the ops take."""
        return self.resource_handle

    @property
    def config(self) -> Any:
        """The table's configuration."""
        return self._config

    @property
    def table_name(self) -> str:
        """The table's name (as the configuration proto and checkpoints name it)."""
        return self._table_name
