"""How one serving trace serves a model's tables: the `ExportContext` an export hands to the layers it traces.

An export (`te.keras.export_for_serving`, `te.serving.Publisher`) traces the model into a serving function of stock
TensorFlow ops. What it changes about the tables (a static table read from its encoded or pruned serving form, how
each dynamic table is frozen: quantization mode and pruning, or the publisher's updatable copies) is held by one
`ExportContext` object that the export creates and owns. The export attaches it to the graph it traces
(`ExportContext.tracing`), and each `tf_embed_ops.keras.TPUEmbedding` call traced into that graph reads it there
(`current`): no state outside the export's own objects, so two exports in one process (one after the other,
interleaved, or on two threads) never see each other's tables or modes, and a training step traced meanwhile on
another thread is not served.

`serving_mode()` (`te.keras.serving_mode`) makes a context for calls outside an export (eager calls, the user's
own `tf.function`s) on the current thread only (a `contextvars.ContextVar`); exports never read it.

In a serving context each of the layer's table groups is looked up through its serving form
(`TableGroup.serving_group(context)`: `tf_embed_ops._xla.lookup`, the one plain-TensorFlow lookup, bitwise the op's).

Example:
    >>> context = ExportContext(dynamic={"user": ("int8", None)})
    >>> @tf.function
    ... def serve(x):
    ...     with context.tracing():
    ...         return model(x, training=False)
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any

import tensorflow as tf

__all__ = ["ExportContext", "current", "serving_mode"]

# The context of `serving_mode()` on this thread (each thread starts without one); exports do not use it.
_THREAD_CONTEXT: contextvars.ContextVar = contextvars.ContextVar("tf_embed_ops_serving_mode", default=None)
# The attribute of a traced graph that holds its export's context while the export traces it.
_GRAPH_ATTRIBUTE = "tf_embed_ops_export_context"


class ExportContext:
    """What one export serves in place of the tables, and the dynamic tables it froze while tracing.

    Args:
      served: {id(static table variable): (variable, serving form)}: tables read from a serving form (an object
        with `gather_rows(ids)`: export_for_serving's quantized or pruned tables, a tiered table's streamed form).
      dynamic: {dynamic table name: (quantization mode, Prune or None)}: how dynamic tables are frozen.
      freeze: optional callable DynamicTable -> an object with `rows(ids)`, `gather_rows(rows)` and `dim` (as
        `tf_embed_ops.dynamic.serving.FrozenDynamicTable`), called eagerly once per table, in place of
        `tf_embed_ops.dynamic.serving.freeze` (the publisher's updatable copies).
    """

    def __init__(self, served: dict | None = None, dynamic: dict | None = None, freeze: Any = None):
        self.served = dict(served or {})
        self.dynamic = dict(dynamic or {})
        self.freeze = freeze
        self._frozen: dict = {}  # {id(dynamic table): (the table, its frozen copy)}; the table keeps its id unique

    def served_form(self, table: Any) -> Any:
        """The serving form of `table` when this context replaces it, else `table`."""
        entry = self.served.get(id(table))
        return entry[1] if entry is not None and entry[0] is table else table

    def frozen(self, table: Any) -> Any:
        """The frozen copy of the dynamic `table`, made on first use (eagerly) and kept for this context."""
        entry = self._frozen.get(id(table))
        if entry is None:
            if self.freeze is not None:
                copy = self.freeze(table)
            else:
                copy = _freeze(table, *self.dynamic.get(table.table_name, (None, None)))
            entry = (table, copy)
            self._frozen[id(table)] = entry
        return entry[1]

    def frozen_tables(self) -> list:
        """The frozen copies made so far, in the order they were made."""
        return [copy for _, copy in self._frozen.values()]

    @contextlib.contextmanager
    def tracing(self):
        """Inside a function being traced: the layers traced into its graph (and graphs inside it) serve with this
        context. Outside a trace (eagerly) it raises ValueError: use `serving_mode`."""
        graph = tf.compat.v1.get_default_graph()
        if tf.executing_eagerly() or not hasattr(graph, "outer_graph"):
            raise ValueError("ExportContext.tracing() must be entered while a tf.function is traced")
        if getattr(graph, _GRAPH_ATTRIBUTE, None) not in (None, self):
            raise ValueError("ExportContext.tracing(): this graph is traced for another export already")
        setattr(graph, _GRAPH_ATTRIBUTE, self)
        try:
            yield self
        finally:
            delattr(graph, _GRAPH_ATTRIBUTE)


def _freeze(table: Any, mode: Any, prune: Any) -> Any:
    # A tiered table's rows are not read here: its serving form's rows are streamed into the SavedModel after it is
    # saved (`tf_embed_ops.serving.streamed.write_rows` finds it among the frozen tables).
    from tf_embed_ops.dynamic import serving as dynamic_serving  # pylint: disable=import-outside-toplevel

    tiered = getattr(table, "tiered", None) is not None
    return (dynamic_serving.freeze_streamed if tiered else dynamic_serving.freeze)(table, mode, prune)


def current() -> ExportContext | None:
    """The context the layer being called serves with: its export's (attached to the graph being traced, or a graph
    around it), else `serving_mode`'s on this thread, else None (not serving)."""
    if not tf.executing_eagerly():
        graph = tf.compat.v1.get_default_graph()
        while graph is not None:
            context = getattr(graph, _GRAPH_ATTRIBUTE, None)
            if context is not None:
                return context
            graph = getattr(graph, "outer_graph", None)
    return _THREAD_CONTEXT.get()


@contextlib.contextmanager
def serving_mode(served: dict | None = None, dynamic: dict | None = None, freeze: Any = None):
    """Inside this context, on this thread, `tf_embed_ops.keras.TPUEmbedding` layers look up with plain TensorFlow
    (no custom op), eagerly or in the user's own traces; dynamic tables are frozen on first use, once per context.

    Args:
      served, dynamic, freeze: as `ExportContext`.

    Yields:
      The `ExportContext` (its `frozen_tables()` are the dynamic tables frozen so far).
    """
    token = _THREAD_CONTEXT.set(ExportContext(served, dynamic, freeze))
    try:
        yield _THREAD_CONTEXT.get()
    finally:
        _THREAD_CONTEXT.reset(token)
