"""Touched-row tracking: which rows of each table changed since a version (docs/tracking.md).

Every fused update marks the rows it wrote (one store per de-duplicated row, in C++); a dynamic table also marks
the rows its training lookups found or inserted and logs the keys it evicts.  A consumer (a serving publisher,
an incremental checkpoint) keeps a `Cursor` and asks `Tracker.changed_since(cursor)`; consumers never reset
each other, because the state is per table and each consumer holds only its own cursor.

Example:
    >>> emb = te.TPUEmbedding(feature_config, optimizer); emb.build()
    >>> tracker = te.tracking.Tracker(emb)
    >>> cursor = tracker.cursor()
    >>> ...  # training steps
    >>> changes = tracker.changed_since(cursor)
    >>> changes.tables["user"].rows         # global row ids (static) or keys (dynamic), ascending
    >>> cursor = changes.cursor             # for next time
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tf_embed_ops.backends.touched_rows import TableChanges

__all__ = ["Changes", "Cursor", "TableChanges", "Tracker", "find_engines"]


@dataclasses.dataclass(frozen=True)
class Cursor:
    """A consumer's position: per table, per shard, the (tracker id, version) it has seen.

    Plain data: `to_json` / `from_json` keep it beside a consumer's own files.
    """

    versions: dict  # table name -> tuple of (tracker id, version) per shard

    def to_json(self) -> str:
        return json.dumps({k: [list(p) for p in v] for k, v in sorted(self.versions.items())})

    @classmethod
    def from_json(cls, text: str) -> Cursor:
        raw = json.loads(text)
        return cls({k: tuple((int(i), int(v)) for i, v in parts) for k, parts in raw.items()})


@dataclasses.dataclass
class Changes:
    """`changed_since`'s answer: `tables` by name, and the `cursor` to ask from next time."""

    tables: dict
    cursor: Cursor


def find_engines(obj: Any) -> list:
    """The embedding engines (`te.TPUEmbedding` objects) inside `obj`.

    Args:
      obj: a `te.TPUEmbedding` (or its sharded subclass), a `te.TPUEmbeddingV2`, a `te.keras.TPUEmbedding` or
        sharded Keras layer, a `keras.Model` holding such layers, or a list of any of these.

    Raises:
      ValueError: if `obj` holds no embedding engine.
    """
    from tf_embed_ops import tpu_embedding as mid_level

    found: list = []

    def visit(o: Any) -> None:
        if isinstance(o, mid_level.TPUEmbedding):
            if all(o is not e for e in found):
                found.append(o)
            return
        if isinstance(o, (list, tuple)):
            for x in o:
                visit(x)
            return
        for attr in ("_tpu_embedding", "_engine"):
            inner = getattr(o, attr, None)
            if isinstance(inner, mid_level.TPUEmbedding):
                visit(inner)
                return
        flatten = getattr(o, "_flatten_layers", None)
        if callable(flatten):
            for layer in flatten(include_self=False, recursive=True):
                visit(layer)

    visit(obj)
    if not found:
        raise ValueError(f"{type(obj).__name__}: holds no tf_embed_ops embedding (te.TPUEmbedding or its layers)")
    return found


class Tracker:
    """Touched-row tracking over every table of an embedding object (static and dynamic, sharded or not).

    Creating a Tracker enables tracking on its tables (idempotent: the per-table state is shared with any other
    Tracker of the same tables, and each consumer keeps its own `Cursor`).  Rows changed before tracking was
    enabled are not known: the first `changed_since` from a cursor older than tracking reads `full`.

    Args:
      obj: what `find_engines` accepts; it must be built (its variables exist).

    Raises:
      ValueError: `obj` holds no embedding engine, or two tables share a name.
    """

    def __init__(self, obj: Any):
        self._tables: dict = {}
        self._sources: dict = {}
        engines = find_engines(obj)
        for engine in engines:
            engine.ensure_built()
            # Each table group (`backends.protocol.TableGroup`) hands its tables and the view that reads a table's
            # changes (`tracking_view`).
            for group in engine.groups:
                for config, table in group.tables.items():
                    self._add(config.name, group.tracking_view(config, table))
                    self._sources[config.name] = (group, config)

    def _add(self, name: str, table: Any) -> None:
        if name in self._tables:
            raise ValueError(f"two tables are named {name!r}: tracking needs unique table names")
        self._tables[name] = table

    @property
    def table_names(self) -> list[str]:
        """The tracked tables' names."""
        return list(self._tables)

    def kind(self, name: str) -> str:
        """ "static" (in memory or tiered) or "dynamic"."""
        return self._table(name).kind

    def table(self, name: str) -> Any:
        """The view of table `name` that reads its changes: `kind` ("static" / "dynamic"), `tiered` (rows behind a
        cache), `versions()`, `changed_since(since)`, `read(rows)`, `mark_all()`; a static one in memory also its
        `parameters` and `slots` shard variables and `offsets`, a tiered or dynamic one its `table`."""
        return self._table(name)

    def source(self, name: str) -> tuple:
        """`(group, TableConfig)` of table `name`: the table group (`backends.protocol.TableGroup`) that holds it,
        which a lifecycle module asks for the table's kind's parts (`group.chain_state(config, table(name))`)."""
        self._table(name)
        return self._sources[name]

    def _table(self, name: str) -> Any:
        if name not in self._tables:
            raise ValueError(f"no tracked table named {name!r}; tables: {sorted(self._tables)}")
        return self._tables[name]

    def cursor(self) -> Cursor:
        """The current version of every table: what a consumer that has just read everything records."""
        return Cursor({name: t.versions() for name, t in self._tables.items()})

    def changed_since(self, cursor: Cursor | None = None, tables: list[str] | None = None) -> Changes:
        """What changed after `cursor` (None: everything, `full`), and the cursor to use next.

        The new cursor is taken with the rows, so a step running concurrently can only repeat rows in the next
        answer, never lose them.

        Args:
          cursor: a Cursor from `cursor()` or a previous `changed_since`, or None.
          tables: restrict to these table names (default: all).

        Returns:
          A `Changes`.
        """
        versions = cursor.versions if cursor is not None else {}
        out, now = {}, dict(versions)
        for name in tables if tables is not None else list(self._tables):
            changes, now[name] = self._table(name).changed_since(versions.get(name))
            out[name] = changes
        return Changes(out, Cursor(now))

    def read_rows(self, name: str, rows: Any) -> dict:
        """A static table's rows (global ids): {"parameters": [n, dim], <slot>: [n, width]} in storage dtype; or a
        tiered dynamic table's rows by key: {"weights": [n, dim], "slots": [n, W]} float32, as `contents` holds
        them.

        A tiered table's rows are read from the tier (the cache's dirty rows included; the cache is not filled):
        read a tiered dynamic table's `full` answer (whose contents carry no values) a chunk of keys at a time.

        Raises:
          ValueError: an in-memory dynamic table (its contents come with `changed_since`), or rows out of range.
          tf.errors.InvalidArgumentError: a key without a row in a tiered dynamic table (naming it).
        """
        return self._table(name).read(rows)

    def mark_all(self) -> None:
        """Every consumer's next `changed_since` reads `full` for every table (call after restoring tables by
        other means than `te.checkpoint`, e.g. `tf.train.Checkpoint.restore`)."""
        for table in self._tables.values():
            table.mark_all()
