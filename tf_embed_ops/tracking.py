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

import numpy as np
import tensorflow as tf

from tf_embed_ops import _loader

__all__ = ["Changes", "Cursor", "TableChanges", "Tracker", "find_engines"]


def _ops():
    return _loader.load_ops()


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
class TableChanges:
    """What changed in one table since a cursor.

    Attributes:
      kind: "static" or "dynamic".
      full: every row must be taken as changed (a restore, tracking started after the cursor, non-lazy Adam,
        a dropped eviction-log entry); `rows` then lists every row (static: all ids; dynamic: all live keys)
        and `evicted` is empty: a consumer replaces its whole copy.
      rows: int64, ascending: global row ids (static) or keys (dynamic) inserted or changed.
      evicted: int64 keys evicted since the cursor and not live now (dynamic only).  Apply order: remove
        `evicted`, then write `rows`.
      contents: dynamic tables only: the changed rows' content in key order (`keys`, `weights`, `slots` [n, W]
        side by side, `counts`, `last_steps`) and the whole admission table (`pending_keys`, `pending_counts`,
        `pending_last_steps`), read under the table's lock together with `rows`.
    """

    kind: str
    full: bool
    rows: np.ndarray
    evicted: np.ndarray
    contents: dict | None = None


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


def _backing(var: Any) -> Any:
    """The tf.Variable behind a keras.Variable (its `.value`), or the variable itself."""
    return var if isinstance(var, tf.Variable) else getattr(var, "value", var)


def _shards(var: Any) -> list:
    """The tf.Variable shards of a table or slot variable (one for an unsharded one)."""
    var = _backing(var)
    inner = getattr(var, "variables", None)
    if isinstance(inner, (list, tuple)) and inner and all(isinstance(v, tf.Variable) for v in inner):
        return list(inner)
    return [var]


class _StaticTable:
    """A static table in memory (all its shards): one tracker per shard variable, which its fused update marks."""

    kind = "static"
    tiered = False

    def __init__(self, name: str, variables: dict, slot_names: list):
        self.name = name
        self.parameters = _shards(variables["parameters"])
        self.slots = {s: _shards(variables[s]) for s in slot_names}
        sizes = [int(v.shape[0]) for v in self.parameters]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.num_rows = int(self.offsets[-1])
        self.devices = [v.device for v in self.parameters]
        self.trackers = []
        for v in self.parameters:
            with tf.init_scope(), tf.device(v.device):
                self.trackers.append(_ops().tf_embed_touched_rows_track(v.handle))

    def versions(self) -> tuple:
        out = []
        for tracker, device in zip(self.trackers, self.devices, strict=True):
            with tf.device(device):
                tid, version, _, _ = _ops().tf_embed_touched_rows_since(tracker, tf.constant(-1, tf.int64), -1)
            out.append((int(tid), int(version)))
        return tuple(out)

    def changed_since(self, since: tuple | None) -> tuple[TableChanges, tuple]:
        since = since or ((-1, -1),) * len(self.trackers)
        if len(since) != len(self.trackers):
            since = ((-1, -1),) * len(self.trackers)  # another shard count: everything
        full = False
        parts, now = [], []
        for p, (tracker, device) in enumerate(zip(self.trackers, self.devices, strict=True)):
            with tf.device(device):
                tid, version, shard_full, rows = _ops().tf_embed_touched_rows_since(
                    tracker, tf.constant(since[p][0], tf.int64), tf.constant(since[p][1], tf.int64)
                )
            now.append((int(tid), int(version)))
            full = full or bool(shard_full)
            parts.append(rows.numpy() + self.offsets[p])
        if full:
            rows = np.arange(self.num_rows, dtype=np.int64)
        else:
            rows = np.concatenate(parts).astype(np.int64) if parts else np.zeros([0], np.int64)
        return TableChanges("static", full, rows, np.zeros([0], np.int64)), tuple(now)

    def read(self, rows: np.ndarray) -> dict:
        rows = np.asarray(rows, np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise ValueError(
                f"table {self.name!r}: rows must be in [0, {self.num_rows}), got {rows.min()}..{rows.max()}"
            )
        out = {"parameters": self._gather(self.parameters, rows)}
        for slot, shards in self.slots.items():
            out[slot] = self._gather(shards, rows)
        return out

    def _gather(self, shards: list, rows: np.ndarray) -> np.ndarray:
        if len(shards) == 1:
            with tf.device(shards[0].device):
                return tf.gather(shards[0], rows).numpy()
        shard = np.searchsorted(self.offsets, rows, side="right") - 1
        width = int(shards[0].shape[1])
        out = np.zeros([rows.size, width], shards[0].dtype.as_numpy_dtype)
        for p, v in enumerate(shards):
            mine = np.nonzero(shard == p)[0]
            if mine.size:
                with tf.device(v.device):
                    out[mine] = tf.gather(v, rows[mine] - self.offsets[p]).numpy()
        return out

    def mark_all(self) -> None:
        for tracker, device in zip(self.trackers, self.devices, strict=True):
            with tf.device(device):
                _ops().tf_embed_touched_rows_mark_all(tracker)


class _TieredTable(_StaticTable):
    """A static tiered table (`storage=te.Tiered`): one tracker on its TieredTableResource, which its fused
    update (TieredSendTPUEmbeddingGradients) and its row writes (initialisation, restore) mark; rows are read
    from the tier through the cache's dirty rows, without filling the cache."""

    tiered = True

    def __init__(self, name: str, table: Any):  # pylint: disable=super-init-not-called
        self.name = name
        self.table = table
        self.devices = [table.handle.device]  # one "shard"
        self.offsets = np.array([0, table.num_rows], np.int64)
        self.num_rows = int(table.num_rows)
        with tf.init_scope(), tf.device(table.handle.device):
            self.trackers = [_ops().tf_embed_touched_rows_track(table.handle)]

    def read(self, rows: np.ndarray) -> dict:
        rows = np.asarray(rows, np.int64).reshape([-1])
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise ValueError(
                f"table {self.name!r}: rows must be in [0, {self.num_rows}), got {rows.min()}..{rows.max()}"
            )
        with tf.device(self.table.handle.device):
            values, slots = self.table.gather_rows(rows)
        # The storage dtype, as the in-memory table's variables give it (float32 -> 16-bit is exact here).
        dtypes = self.table.dtypes
        out = {"parameters": tf.cast(values, dtypes[0]).numpy()}
        for k, slot in enumerate(self.table.slot_names):
            out[slot] = tf.cast(slots[slot], dtypes[1 + k]).numpy()
        return out


_CONTENT = ("keys", "weights", "slots", "counts", "last_steps", "pending_keys", "pending_counts", "pending_last_steps")


class _DynamicTable:
    """A dynamic table (all its shards), in memory or tiered: its resource's own change log and eviction log."""

    kind = "dynamic"

    def __init__(self, name: str, table: Any):
        self.name = name
        self.table = table
        self.shards = list(getattr(table, "shards", None) or [table])
        # A tiered dynamic table (unsharded): changed rows' values are read through its cache by the query op; a
        # full answer carries keys and metadata only (`read` gives the values by key).
        self.tiered = getattr(table, "tiered", None) is not None

    def _query(self, shard: Any, since: tuple, mark_all: bool = False, version_only: bool = False) -> tuple:
        with tf.device(shard.resource_handle.device):
            out = _ops().tf_embed_dynamic_table_changed_since(
                shard.resource_handle,
                tf.constant(since[0], tf.int64),
                tf.constant(since[1], tf.int64),
                num_slots=shard.num_slots,
                mark_all=mark_all,
                version_only=version_only,
            )
        return out

    def versions(self) -> tuple:
        out = []
        for shard in self.shards:
            r = self._query(shard, (-1, -1), version_only=True)
            out.append((int(r.id), int(r.version)))
        return tuple(out)

    def changed_since(self, since: tuple | None) -> tuple[TableChanges, tuple]:
        since = since or ((-1, -1),) * len(self.shards)
        if len(since) != len(self.shards):
            since = ((-1, -1),) * len(self.shards)
        full, now, evicted, parts = False, [], [], []
        for p, shard in enumerate(self.shards):
            r = self._query(shard, since[p])
            now.append((int(r.id), int(r.version)))
            full = full or bool(r.full)
            evicted.append(r.evicted_keys.numpy())
            n = int(r.keys.shape[0])
            part = {k: getattr(r, k).numpy() for k in _CONTENT if k != "slots"}
            part["slots"] = np.concatenate([s.numpy() for s in r.slots], 1) if r.slots else np.zeros([n, 0], np.float32)
            if self.tiered and bool(r.full):  # keys and metadata only: the values are read by key (`read`)
                part["weights"] = part["slots"] = None
            parts.append(part)
        if full and len(self.shards) > 1:
            # One shard's full answer means a restore or a non-lazy update: take every shard whole.
            parts = []
            for p, shard in enumerate(self.shards):
                c = {k: v.numpy() for k, v in shard.export().items()}
                parts.append(c)
                evicted[p] = np.zeros([0], np.int64)
        contents = _union(parts)
        ev = np.unique(np.concatenate(evicted)).astype(np.int64) if evicted else np.zeros([0], np.int64)
        if full:
            ev = np.zeros([0], np.int64)
        return TableChanges("dynamic", full, contents["keys"], ev, contents), tuple(now)

    def mark_all(self) -> None:
        for shard in self.shards:
            self._query(shard, (-1, -1), mark_all=True, version_only=True)

    def read(self, keys: Any) -> dict:
        if not self.tiered:
            raise ValueError(
                f"table {self.name!r} is dynamic: its rows come with changed_since(...).tables[name].contents"
            )
        from tf_embed_ops.dynamic import ops as dynamic_ops  # pylint: disable=import-outside-toplevel

        keys = np.asarray(keys, np.int64).reshape([-1])
        shard = self.shards[0]
        with tf.device(shard.resource_handle.device):
            weights, slots = dynamic_ops.dynamic_table_tiered_read_rows(
                shard.resource_handle, keys, num_slots=shard.num_slots
            )
        n = int(keys.size)
        out_slots = np.concatenate([x.numpy() for x in slots], 1) if slots else np.zeros([n, 0], np.float32)
        return {"weights": weights.numpy(), "slots": out_slots}


def _union(parts: list) -> dict:
    """Shard contents (disjoint keys) joined and sorted by key."""
    # None: not read (a tiered table's full answer carries no values).
    out = {k: None if any(p[k] is None for p in parts) else np.concatenate([p[k] for p in parts], 0) for k in _CONTENT}
    order = np.argsort(out["keys"], kind="stable")
    for k in ("keys", "weights", "slots", "counts", "last_steps"):
        out[k] = None if out[k] is None else out[k][order]
    porder = np.argsort(out["pending_keys"], kind="stable")
    for k in ("pending_keys", "pending_counts", "pending_last_steps"):
        out[k] = out[k][porder]
    return out


def _static_view(config: Any, table: Any, engine: Any) -> _StaticTable:
    del table  # the view reads the table's and its slots' variables
    from tf_embed_ops import _tf_compat  # pylint: disable=import-outside-toplevel

    names = _tf_compat.slot_names(config.optimizer) if config.optimizer is not None else []
    return _StaticTable(config.name, engine.variables[config.name], names)


# The view of each kind of table group's tables (`backends.protocol.TableGroup.kind`), made from (TableConfig, the
# group's table object, the engine). A new kind of table registers its view here.
_VIEWS = {
    "in-memory": _static_view,
    "tiered": lambda config, table, engine: _TieredTable(config.name, table),
    "dynamic": lambda config, table, engine: _DynamicTable(config.name, table),
}


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
            # Each table group (`backends.protocol.TableGroup`) hands its tables; the view that reads a table's
            # changes is the one its group's kind registers (`_VIEWS`).
            for group in engine.groups:
                for config, table in group.tables.items():
                    self._add(config.name, _VIEWS[group.kind](config, table, engine))
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
