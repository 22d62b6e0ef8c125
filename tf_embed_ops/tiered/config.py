"""`te.Tiered`: the storage option of a table whose rows live on disk behind a DRAM row cache.

`te.TableConfig(..., storage=te.Tiered(cache_bytes=..., directory=...))` keeps the table's rows and their
optimizer slots (packed together, one fixed-size record per row) in a row file `<directory>/<table>.rows`, and
at most `cache_bytes` of them in memory; the fused update runs on the cached rows (docs/tiered_tables.md).
`storage=None` (the default) is the in-memory table.

This module only declares and checks the option (it stands on the ground floor, beside `table_config`, so every
table configuration can take it); `tf_embed_ops.tiered.table` makes the table.

Example:
    >>> storage = Tiered(cache_bytes=64 << 20, directory="/mnt/ssd/embeddings")
    >>> table = te.TableConfig(10**8, 64, name="user", storage=storage)
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["DEFAULT_CHUNK_BYTES", "MODES", "Tiered", "check_storage", "is_tiered", "storage_of"]

# How a table's row file is opened when the table is built: "create" makes a new file and refuses an existing
# one (it may hold another run's rows), "open" trains on an existing file (its header must match the table),
# "overwrite" removes an existing file first, "restore" does too and then writes no row: for a job that restores
# its checkpoint next, which writes every row (a static table's initialisation would write them all once more).
MODES = ("create", "open", "overwrite", "restore")
# Initialisation, checkpoints and restores move rows in chunks of about this many bytes (rows and slots in
# float32): the memory they need beside the cache.
DEFAULT_CHUNK_BYTES = 64 << 20


def _positive_int(owner: str, argument: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: `{argument}` must be an int >= 1; got {value!r}.")
    return value


class Tiered:
    """A table stored on disk with a DRAM cache of its hot rows (docs/tiered_tables.md).

    Args:
      cache_bytes: the DRAM budget of the row cache, in bytes: it holds `cache_bytes // record_bytes` rows
        (a record is the row and its optimizer slots in their storage dtypes, plus a 4-byte checksum). One
        training step's distinct rows must fit in it.
      directory: where the row file `<table>.rows` is kept (created if missing when the table is built).
      mode: "create" (default: a new row file; an existing one is refused), "open" (train on the rows of an
        existing file, whose header must match the table), "overwrite" (remove an existing file, then create) or
        "restore" (as "overwrite", but the new file's rows are not written from the initializer: a checkpoint
        restore writes them next; until it has, reading a row, a lookup included, is an error naming the table
        and the row). A dynamic table writes no row at creation, so for it "restore" is "overwrite".
      chunk_bytes: initialisation, checkpoints and restores move rows in chunks of about this many bytes.

    Raises:
      ValueError: naming the argument and the value, for a non-positive size, an empty directory or an unknown
        mode.
    """

    def __init__(
        self,
        cache_bytes: int,
        directory: str | os.PathLike,
        mode: str = "create",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ):
        self.cache_bytes = _positive_int("Tiered", "cache_bytes", cache_bytes)
        try:
            directory = os.fspath(directory)
        except TypeError:
            raise ValueError(f"Tiered: `directory` must be a path; got {directory!r}.") from None
        if not isinstance(directory, str) or not directory:
            raise ValueError(f"Tiered: `directory` must be a non-empty path; got {directory!r}.")
        self.directory = directory
        if mode not in MODES:
            raise ValueError(f"Tiered: `mode` must be one of {MODES}; got {mode!r}.")
        self.mode = mode
        self.chunk_bytes = _positive_int("Tiered", "chunk_bytes", chunk_bytes)

    def path(self, table_name: str) -> str:
        """The row file of the table named `table_name`."""
        return os.path.join(self.directory, f"{table_name}.rows")

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments (JSON-able): `Tiered(**config)` is an equal object."""
        return {
            "cache_bytes": self.cache_bytes,
            "directory": self.directory,
            "mode": self.mode,
            "chunk_bytes": self.chunk_bytes,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Tiered:
        """Inverse of `get_config`."""
        return cls(**config)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tiered) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.get_config().items())))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"Tiered({args})"


def check_storage(owner: str, storage: Any) -> Tiered | None:
    """`storage` checked: None (in memory) or a `Tiered`; else a ValueError naming `owner` and the value."""
    if storage is not None and not isinstance(storage, Tiered):
        raise ValueError(f"{owner}: `storage` must be None (in memory) or te.Tiered(...); got {storage!r}.")
    return storage


def storage_of(table: Any) -> Tiered | None:
    """The table's `Tiered` storage, or None for an in-memory table (any table config)."""
    storage = getattr(table, "storage", None)
    return storage if isinstance(storage, Tiered) else None


def is_tiered(table: Any) -> bool:
    """Whether `table` (any table config) is stored on disk behind a row cache."""
    return storage_of(table) is not None
