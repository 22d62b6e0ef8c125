"""`TieredTable`: one tiered table (rows on disk behind a DRAM row cache) as a trackable TensorFlow resource.

The rows and their optimizer slots live in a C++ resource (`TfEmbed>TieredTableHandle`): a row file
`<directory>/<table>.rows` with one fixed-size record per row, and a cache of at most `cache_bytes` of records
(docs/tiered_tables.md). This object owns the resource's lifetime, the row file's creation and initialisation, the
table's rounding-step counter, its statistics and its checkpoint (`tf_embed_ops.tiered.checkpoint`: streamed in
chunks of rows, never the whole table in memory).

It follows `DynamicTable` (and TensorFlow's `MutableHashTable`): a `TrackableResource` whose `_create_resource`
makes the handle, so a `tf.function` captures it like any resource.

Initialisation: a new row file is filled from the table's initializer in chunks of rows (`Tiered.chunk_bytes`), the
slots from the optimizer's slot initializers. A table that fits in one chunk gets exactly the values of one
whole-table draw; a larger one draws chunk by chunk, so its values differ from a whole-tensor draw of the same
initializer (a seeded random initializer draws each chunk from the stateless generator keyed by (seed, first
row), so the values still depend only on the seed).

Example:
    >>> config = te.TableConfig(10**6, 16, name="user", optimizer=te.optimizers.Adagrad(0.1),
    ...                         storage=te.Tiered(cache_bytes=16 << 20, directory="/tmp/rows"))
    >>> table = TieredTable(config)
    >>> values, slots = table.read_rows(0, 4)
    >>> table.stats()["hit_rate"]
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops import _tf_compat, table_config
from tf_embed_ops import config as config_lib
from tf_embed_ops.backends.table_resource import TableResource
from tf_embed_ops.tiered import checkpoint
from tf_embed_ops.tiered import config as tiered_config
from tf_embed_ops.tiered import ops as tiered_ops

__all__ = ["STATS", "TieredTable"]

# What `stats()` returns: the op's counters, then the derived hit rate.
STATS = (*tiered_ops.STAT_NAMES, "hit_rate")
# Counters that are totals (a summary reports their change since the previous summary); the others are levels.
_CUMULATIVE = ("hits", "misses", "rows_read", "rows_written", "bytes_read", "bytes_written", "evictions")
_uid = itertools.count()


def _var_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in str(name)) or "table"
    return cleaned if cleaned[0].isalpha() else "t_" + cleaned


class TieredTable(TableResource):
    """One tiered table as a TensorFlow resource.

    Args:
      config: a `te.TableConfig` with `storage=te.Tiered(...)`.
      optimizer: the optimizer that trains the table when `config.optimizer` is None (it decides the slots);
        None and no `config.optimizer`: a lookup-only table without slots.
      name: the table's name (default `config.name`): the row file is `<directory>/<name>.rows`.

    Attributes:
      handle: the resource handle the ops take.
      step: int64 `tf.Variable`, the rounding step of 16-bit rows (the in-memory table's `rounding_step`);
        saved in the checkpoint.

    Raises:
      ValueError: `config` is not tiered or has no name; the row file exists and `mode` is "create", or is missing
        and `mode` is "open" (the message names the table and the path).
      tf.errors.OpError: the op refused the file (a header of another geometry, an unreadable file), naming the
        table and the path.
    """

    def __init__(self, config: Any, optimizer: Any = None, name: str | None = None):
        storage = tiered_config.storage_of(config)
        name = name or config.name
        if storage is None:
            raise ValueError(f"TieredTable {name!r}: the table config has no storage=te.Tiered(...)")
        if not name:
            raise ValueError("TieredTable: the table needs a name (it names the row file)")
        self._config = config
        self._storage = storage
        self._table_name = name
        self._path = storage.path(name)
        self._optimizer = config.optimizer if config.optimizer is not None else optimizer
        opt = self._optimizer
        self._slot_names = _tf_compat.slot_names(opt) if opt is not None else []
        shapes = config_lib.slot_shapes(opt, 1, config.dim) if opt is not None else {}
        self._slot_widths = [int(shapes[s][1]) for s in self._slot_names]
        self._slot_initializers = _tf_compat.slot_initializers(opt) if opt is not None else []
        self._dtypes = [table_config.storage_dtype(config)] + [table_config.slot_storage_dtype(config)] * len(
            self._slot_names
        )
        floats_per_row = config.dim + sum(self._slot_widths)
        self._chunk_rows = max(1, min(config.vocabulary_size, storage.chunk_bytes // (4 * floats_per_row)))
        self._shared_name = f"{_var_name(name)}_tiered_table_{next(_uid)}"
        self._mode = self._prepare_file()
        super().__init__()
        with tf.init_scope():
            self._step = tf.Variable(tf.constant(0, tf.int64), trainable=False, name=f"{_var_name(name)}_step")
            # The counters at the previous `write_summaries` (per-step deltas); not checkpointed.
            self._summarized = new_summarized_stats(f"{_var_name(name)}_summarized")
            _ = self.resource_handle  # creates (or opens) the row file now, not inside a later tf.function
            if self._mode == "create" and self._storage.mode != "restore":
                self.initialize_rows()

    def _prepare_file(self) -> str:
        """Checks the row file against `mode` before the op runs; returns the op's mode ("create" or "open")."""
        mode, path, where = self._storage.mode, self._path, f"TieredTable {self._table_name!r}"
        exists = os.path.exists(path)
        if mode == "create" and exists:
            raise ValueError(
                f"{where}: the row file {path} already exists (it may hold another run's rows); use "
                "te.Tiered(mode='open') to train on it, mode='overwrite' to replace it (mode='restore' when a "
                "checkpoint restore follows), or another directory"
            )
        if mode == "open" and not exists:
            raise ValueError(f"{where}: te.Tiered(mode='open') but the row file {path} does not exist")
        if mode in ("overwrite", "restore") and exists:
            os.remove(path)
        if mode != "open":
            os.makedirs(self._storage.directory, exist_ok=True)
        return "open" if mode == "open" else "create"

    # ------------------------------------------------------------------------------------------ the resource
    def _create_resource(self) -> tf.Tensor:
        return tiered_ops.tiered_table_handle(
            table_name=self._table_name,
            path=self._path,
            num_rows=self._config.vocabulary_size,
            dim=self._config.dim,
            cache_bytes=self._storage.cache_bytes,
            mode=self._mode,
            slot_widths=self._slot_widths,
            storage_types=[d.name for d in self._dtypes],
            shared_name=self._shared_name,
        )

    # --------------------------------------------------------------------------------------- public surface
    # A checkpoint streams the table (its registered saver, `tiered.checkpoint`): its rows are never whole in memory.
    streams_checkpoint = True

    @property
    def path(self) -> str:
        """The row file."""
        return self._path

    @property
    def num_rows(self) -> int:
        return int(self._config.vocabulary_size)

    @property
    def dim(self) -> int:
        return int(self._config.dim)

    @property
    def slot_names(self) -> list[str]:
        """The optimizer's slots, Load/Retrieve order (the in-memory table's slot variable names)."""
        return list(self._slot_names)

    @property
    def slot_widths(self) -> list[int]:
        """Floats per row of each slot: dim, or 1 for a per-row slot."""
        return list(self._slot_widths)

    @property
    def dtypes(self) -> list[tf.DType]:
        """The storage dtype of each buffer: the table's, then each slot's."""
        return list(self._dtypes)

    @property
    def chunk_rows(self) -> int:
        """Rows per chunk of initialisation, checkpoint and restore."""
        return self._chunk_rows

    @property
    def step(self) -> tf.Variable:
        return self._step

    def chunks(self) -> list[tuple[int, int]]:
        """`[(first_row, num_rows)]`: the table in chunks of `chunk_rows`."""
        n, c = self.num_rows, self._chunk_rows
        return [(start, min(c, n - start)) for start in range(0, n, c)]

    def initialize_rows(self) -> None:
        """Writes every row from the table's initializer and every slot from its initializer, chunk by chunk
        (eagerly; see the module docstring for how a chunked draw relates to a whole-table one)."""
        for start, n in self.chunks():
            tiered_ops.tiered_table_write_rows(
                self.resource_handle, start, self._initial_rows(start, n), self._initial_slots(n)
            )

    def _initial_rows(self, start: int, n: int) -> tf.Tensor:
        init = self._config.initializer
        config = init.get_config() if callable(getattr(init, "get_config", None)) else {}
        value = config.get("value")
        if value is not None and np.ndim(value) == 2:  # a constant of the whole table: its rows
            value = np.asarray(value, np.float32)
            if value.shape != (self.num_rows, self.dim):
                raise ValueError(
                    f"TieredTable {self._table_name!r}: the constant initializer has shape {value.shape}, the table "
                    f"[{self.num_rows}, {self.dim}]"
                )
            return tf.constant(value[start : start + n])
        if n == self.num_rows or config.get("seed") is None:
            return tf.cast(init((n, self.dim), dtype=tf.float32), tf.float32)
        return self._seeded_chunk(type(init).__name__, config, start, n)

    def _seeded_chunk(self, kind: str, config: dict, start: int, n: int) -> tf.Tensor:
        seed = tf.constant([int(config["seed"]), start], tf.int64)
        shape = (n, self.dim)
        if kind == "TruncatedNormal":
            return tf.random.stateless_truncated_normal(shape, seed, config["mean"], config["stddev"])
        if kind == "RandomNormal":
            return tf.random.stateless_normal(shape, seed, config["mean"], config["stddev"])
        if kind == "RandomUniform":
            return tf.random.stateless_uniform(shape, seed, config["minval"], config["maxval"])
        raise ValueError(
            f"TieredTable {self._table_name!r}: a seeded {kind} initializer cannot be drawn chunk by chunk (the table "
            f"has {self.num_rows} rows, {self._chunk_rows} per chunk): use an unseeded initializer, a TruncatedNormal, "
            "RandomNormal or RandomUniform, or a larger te.Tiered(chunk_bytes=...)"
        )

    def _initial_slots(self, n: int) -> list[tf.Tensor]:
        return [
            tf.cast(init((n, width), dtype=tf.float32), tf.float32)
            for init, width in zip(self._slot_initializers, self._slot_widths, strict=True)
        ]

    def write_rows(self, first_row: Any, values: Any, slots: Any = None) -> Any:
        """Overwrites rows `[first_row, first_row + n)` and their slots (rounded to nearest into 16-bit storage).

        Args:
          first_row: the first row (int64 scalar >= 0).
          values: float32 [n, dim].
          slots: None (each slot at its initializer's value), or `{slot name: [n, width]}` with every slot, or a
            list in `slot_names` order.

        Returns:
          The op (eagerly: None).

        Raises:
          ValueError: a slot missing or unknown, or values of another dim (naming the table); the op refuses rows
            past the table's end, changing nothing.
        """
        values = tf.convert_to_tensor(values, tf.float32)
        where = f"TieredTable {self._table_name!r}: write_rows"
        if values.shape.rank is not None and (values.shape.rank != 2 or values.shape[1] not in (None, self.dim)):
            raise ValueError(f"{where}: values must be [n, {self.dim}], got shape {values.shape}")
        if slots is None:  # slot initializers are constants (TensorFlow's optimizers): one row, broadcast
            n = tf.shape(values)[0]
            slot_values = [
                tf.broadcast_to(tf.cast(init((1, width), dtype=tf.float32), tf.float32), tf.stack([n, width]))
                for init, width in zip(self._slot_initializers, self._slot_widths, strict=True)
            ]
        elif isinstance(slots, dict):
            unknown = sorted(set(slots) - set(self._slot_names))
            missing = [s for s in self._slot_names if s not in slots]
            if unknown or missing:
                raise ValueError(f"{where}: slots {sorted(slots)}; the table's are {self._slot_names}")
            slot_values = [slots[s] for s in self._slot_names]
        else:
            slot_values = list(slots)
            if len(slot_values) != len(self._slot_names):
                raise ValueError(f"{where}: {len(slot_values)} slots given; the table's are {self._slot_names}")
        return tiered_ops.tiered_table_write_rows(
            self.resource_handle, first_row, values, slot_values, table_name=self._table_name
        )

    def mark_all_touched(self) -> Any:
        """Marks every row changed for the table's touched-row trackers (docs/tracking.md): what a completed
        restore calls after its last chunk (`write_rows` marks only the rows it writes). No row changes.

        Returns:
          The op (eagerly: None).
        """
        return tiered_ops.tiered_table_mark_all_touched(self.resource_handle)

    def read_rows(self, first_row: Any, num_rows: Any) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """Rows `[first_row, first_row + num_rows)` and their slots as float32 (the cache's dirty rows included;
        the cache is not filled).

        Returns:
          (values [n, dim], {slot name: [n, width]}).
        """
        values, slots = tiered_ops.tiered_table_read_rows(
            self.resource_handle, first_row, num_rows, num_slots=len(self._slot_names), table_name=self._table_name
        )
        return values, dict(zip(self._slot_names, slots, strict=True))

    def gather_rows(self, rows: Any) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """The given rows (any order) and their slots as float32, read like `read_rows` (the cache is not filled).

        Returns:
          (values [n, dim], {slot name: [n, width]}).

        Raises:
          tf.errors.InvalidArgumentError: a row outside [0, num_rows).
        """
        values, slots = tiered_ops.tiered_table_gather_rows(
            self.resource_handle, rows, num_slots=len(self._slot_names), table_name=self._table_name
        )
        return values, dict(zip(self._slot_names, slots, strict=True))

    def read_all(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The whole table as numpy arrays (eagerly; for tests and small tables: it holds the table in memory)."""
        values, slots = self.read_rows(0, self.num_rows)
        return values.numpy(), {k: v.numpy() for k, v in slots.items()}

    def prefetch(self, ids: Any) -> Any:
        """Starts making the rows of `ids` resident (not pinned) on the cache's thread and returns, so the step
        that uses them hits the cache; run it with the current step (same `tf.function`) and the reads overlap the
        rest of the current step. The next lookup or update with rows to read waits for it; an I/O error of the
        prefetch is raised by the next prefetch.

        Returns:
          The op (eagerly: None).
        """
        return tiered_ops.tiered_table_prefetch(self.resource_handle, ids)

    def flush(self) -> Any:
        """Writes every dirty cached row back to the row file and syncs it (the row file alone then holds the
        table; checkpoints do not need this)."""
        return tiered_ops.tiered_table_flush(self.resource_handle)

    def stats(self) -> dict[str, tf.Tensor]:
        """The cache's counters as int64 scalars (totals since the table was created or opened: `hits`, `misses`,
        `rows_read`, `rows_written`, `bytes_read`, `bytes_written`, `evictions`; levels: `resident_rows`,
        `capacity_rows`, `pinned_rows`), and `hit_rate` (float32: hits / (hits + misses), 1 before any access)."""
        out = tiered_ops.tiered_table_stats(self.resource_handle)._asdict()
        out["hit_rate"] = _hit_rate(out["hits"], out["misses"])
        return out

    def write_summaries(self, step: Any = None) -> Any:
        """Writes the cache's statistics with `tf.summary.scalar` under `tiered_tables/<table>/...`: each total's
        change since the previous call (`hits`, `misses`, `bytes_read`, ... per step), the levels
        (`resident_rows`, `capacity_rows`, `pinned_rows`), and the hit rates of the interval (`hit_rate`) and since
        the start (`hit_rate_total`). Needs a default summary writer.

        Args:
          step: the summary step (default: the table's step counter).

        Returns:
          The update of the remembered counters (eagerly: None).
        """
        step = self._step if step is None else step
        current = tf.stack(list(tiered_ops.tiered_table_stats(self.resource_handle)))
        return write_cache_summaries(self._table_name, current, self._summarized, step)


def new_summarized_stats(name: str) -> tf.Variable:
    """The int64 [len(STAT_NAMES)] variable `write_cache_summaries` keeps a cache's previous counters in."""
    return tf.Variable(tf.zeros([len(tiered_ops.STAT_NAMES)], tf.int64), trainable=False, name=name)


def cache_stats_dict(current: tf.Tensor) -> dict[str, tf.Tensor]:
    """A cache's counters (int64 [len(STAT_NAMES)], `STAT_NAMES` order) by name, with `hit_rate`."""
    out = {name: current[i] for i, name in enumerate(tiered_ops.STAT_NAMES)}
    out["hit_rate"] = _hit_rate(out["hits"], out["misses"])
    return out


def write_cache_summaries(table_name: str, current: tf.Tensor, summarized: tf.Variable, step: Any) -> Any:
    """Writes a row cache's statistics under `tiered_tables/<table_name>/` (static and dynamic tiered tables):
    each total's change since the counters in `summarized`, the levels, the interval's and the total hit rate; then
    remembers `current` (int64 [len(STAT_NAMES)]).

    Returns:
      The update of `summarized` (eagerly: None).
    """
    delta = current - summarized.read_value()
    prefix = f"tiered_tables/{table_name}"
    for i, name in enumerate(tiered_ops.STAT_NAMES):
        tf.summary.scalar(f"{prefix}/{name}", delta[i] if name in _CUMULATIVE else current[i], step=step)
    hits, misses = tiered_ops.STAT_NAMES.index("hits"), tiered_ops.STAT_NAMES.index("misses")
    tf.summary.scalar(f"{prefix}/hit_rate", _hit_rate(delta[hits], delta[misses]), step=step)
    tf.summary.scalar(f"{prefix}/hit_rate_total", _hit_rate(current[hits], current[misses]), step=step)
    return summarized.assign(current)


def _hit_rate(hits: tf.Tensor, misses: tf.Tensor) -> tf.Tensor:
    hits, total = tf.cast(hits, tf.float64), tf.cast(hits + misses, tf.float64)
    return tf.cast(tf.where(total > 0, hits / tf.maximum(total, 1.0), 1.0), tf.float32)


# Checkpoints of every TieredTable go through the streaming saver.
checkpoint.register(TieredTable)
