"""A Keras layer's tiered tables in `model.save` / `keras.models.load_model` (the weights store), chunk by chunk.

Keras saves a layer's `keras.Variable`s by index; a tiered table is a resource larger than memory, so its rows and
slots are stored beside them, one chunk of rows per entry (`te.Tiered(chunk_bytes=...)`), in float32 (exact for
16-bit storage, which widens without rounding):

| key (`<t>`: the table's name, "/" written "|") | value |
| --- | --- |
| `tiered.<t>.manifest` | int64 [5 + S]: format version (1), rows, dim, rows per chunk, S, each slot's width |
| `tiered.<t>.step` | int64 []: the rounding step of 16-bit rows |
| `tiered.<t>.<k>.values` | float32 [n_k, dim]: rows `[k * chunk, k * chunk + n_k)` |
| `tiered.<t>.<k>.slot<j>` | float32 [n_k, width_j]: slot j (Load/Retrieve order) of the same rows |

Loading checks every entry of every tiered table (manifest, keys, shapes) before it writes a row, so a refused
load changes no tiered table (the Keras layer runs every group's `check_keras_weights` before any write).
Memory: one chunk, on top of what the Keras format itself holds (a zipped `.keras` file is assembled in memory by
Keras; `model.save(..., zipped=False)` writes the weights file directly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["PREFIX", "check", "save"]

PREFIX = "tiered."
_FORMAT = 1


def _prefix(table_name: str) -> str:
    return f"{PREFIX}{table_name.replace('/', '|')}."


def _manifest(table: Any, chunk_rows: int) -> list[int]:
    return [_FORMAT, table.num_rows, table.dim, chunk_rows, len(table.slot_names), *table.slot_widths]


def save(store: Any, tables: dict) -> None:
    """Writes `tables` ({TableConfig: TieredTable}) into the Keras weights `store`, chunk by chunk."""
    for config, table in tables.items():
        prefix = _prefix(config.name)
        store[prefix + "manifest"] = np.asarray(_manifest(table, table.chunk_rows), np.int64)
        store[prefix + "step"] = np.asarray(int(table.step.numpy()), np.int64)
        for k, (start, n) in enumerate(table.chunks()):
            values, slots = table.read_rows(start, n)
            store[f"{prefix}{k}.values"] = values.numpy()
            for j, name in enumerate(table.slot_names):
                store[f"{prefix}{k}.slot{j}"] = slots[name].numpy()


def _chunks(num_rows: int, chunk_rows: int) -> list[tuple[int, int]]:
    return [(start, min(chunk_rows, num_rows - start)) for start in range(0, num_rows, chunk_rows)]


def _check(store: Any, keys: set, config: Any, table: Any) -> tuple[list, int]:
    """The saved chunks of `table` and its step, after checking every entry; raises ValueError otherwise."""
    prefix, where = _prefix(config.name), f"load_model: tiered table {config.name!r}"
    if prefix + "manifest" not in keys:
        raise ValueError(f"{where}: the saved weights have no {prefix}manifest (no tiered table of that name)")
    manifest = [int(v) for v in np.asarray(store[prefix + "manifest"]).reshape(-1)]
    if len(manifest) < 5 or manifest[0] != _FORMAT or manifest[3] < 1:
        raise ValueError(f"{where}: {prefix}manifest is {manifest}, not a version-{_FORMAT} tiered table manifest")
    if manifest[:3] + manifest[4:] != _manifest(table, 0)[:3] + _manifest(table, 0)[4:]:
        raise ValueError(
            f"{where}: the saved table has {manifest[1]} rows of dim {manifest[2]} and slot widths {manifest[5:]}; "
            f"this one has {table.num_rows} rows of dim {table.dim} and slot widths {table.slot_widths}"
        )
    step = int(np.asarray(store[prefix + "step"])) if prefix + "step" in keys else 0
    if step < 0:
        raise ValueError(f"{where}: {prefix}step is {step}, it must be >= 0")
    chunks = _chunks(table.num_rows, manifest[3])
    widths = [table.dim, *table.slot_widths]
    for k, (_, n) in enumerate(chunks):
        names = [f"{prefix}{k}.values"] + [f"{prefix}{k}.slot{j}" for j in range(len(table.slot_names))]
        for name, width in zip(names, widths, strict=True):
            if name not in keys:
                raise ValueError(f"{where}: the saved weights have no {name}")
            shape = tuple(np.shape(store[name]))
            if shape != (n, width):
                raise ValueError(f"{where}: {name} has shape {list(shape)}, the table needs {[n, width]}")
    if f"{prefix}{len(chunks)}.values" in keys:
        raise ValueError(f"{where}: the saved weights have more chunks than the manifest says")
    return chunks, step


def check(store: Any, tables: dict) -> list[Callable[[], None]]:
    """Checks every entry of `tables` ({TableConfig: TieredTable}) in the Keras weights `store`, writing nothing;
    returns the writes to run, one per table (each restores its table chunk by chunk).

    Raises:
      ValueError: naming the table and the entry that does not match.
    """
    keys = {str(k) for k in store.keys()}
    checked = [(config, table, *_check(store, keys, config, table)) for config, table in tables.items()]
    return [_writer(store, *plan) for plan in checked]


def _writer(store: Any, config: Any, table: Any, chunks: list, step: int) -> Callable[[], None]:
    def write() -> None:
        prefix = _prefix(config.name)
        for k, (start, _) in enumerate(chunks):
            values = tf.constant(np.asarray(store[f"{prefix}{k}.values"], np.float32))
            slots = [
                tf.constant(np.asarray(store[f"{prefix}{k}.slot{j}"], np.float32)) for j in range(len(table.slot_names))
            ]
            table.write_rows(start, values, slots)
        table.step.assign(step)
        table.mark_all_touched()  # replaced whole: every touched-row tracker reads `full` (docs/tracking.md)

    return write
