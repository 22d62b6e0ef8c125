"""A Keras layer's dynamic tables in `model.save` / `keras.models.load_model` (the weights store).

A dynamic table is a resource, not a `keras.Variable`, so its content (its checkpoint's tensors, sorted by key) is
stored beside the layer's variables under `dynamic.<t>.<tensor>` (`<t>`: the table's name, "/" written "|"). An
in-memory table stores every tensor whole. A tiered table (`storage=te.Tiered`, rows on disk) stores its keys and
metadata whole (they are in DRAM) and its rows and slots chunk by chunk, never the whole table in memory:

| key | value |
| --- | --- |
| `dynamic.<t>.keys`, `counts`, `last_steps`, `pending_*`, `step`, the policies' tensors | as an in-memory table's |
| `dynamic.<t>.chunk_rows` | int64 []: c, the rows per chunk (`te.Tiered(chunk_bytes=...)`) |
| `dynamic.<t>.weights.<k>` / `dynamic.<t>.slots.<k>` | float32 [n_k, dim] / [n_k, W]: rows `[k * c, k * c + n_k)` |

Either kind loads either kind's entries: a tiered table loads chunked entries by importing the keys alone, then
writing the rows chunk by chunk (`TfEmbed>DynamicTableTieredImportKeys` / `WriteRows`, as its streamed checkpoint
restores), and whole entries as an in-memory table restores them; an in-memory table concatenates chunked entries.
Every entry of every dynamic table is checked (the checkpoint's checks, every chunk's shape) before any table is
written, so a refused load changes no dynamic table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops.dynamic import ops as _ops
from tf_embed_ops.dynamic import tiered_checkpoint

__all__ = ["PREFIX", "check", "save"]

PREFIX = "dynamic."
_KEY_TENSORS = ("keys", "counts", "last_steps", "pending_keys", "pending_counts", "pending_last_steps")


def _prefix(table_name: str) -> str:
    # An h5 dataset name: "/" would make a group.
    return f"{PREFIX}{table_name.replace('/', '|')}."


def save(store: Any, tables: dict) -> None:
    """Writes `tables` ({DynamicTableConfig: DynamicTable}) into the Keras weights `store` (see the module
    docstring: a tiered table's rows chunk by chunk)."""
    for config, table in tables.items():
        prefix = _prefix(config.name)
        if table.tiered is None:
            contents = dict(table.export())
        else:
            contents = dict(zip(_KEY_TENSORS, _ops.dynamic_table_tiered_export_keys(table.handle), strict=True))
        contents["step"] = table.step.read_value()
        contents.update(table.export_policy_state())  # Bloom counters, decayed counts (lifecycle policies)
        for name, value in contents.items():
            store[prefix + name] = value.numpy()
        if table.tiered is not None:
            _save_rows(store, prefix, table, contents["keys"])


def _save_rows(store: Any, prefix: str, table: Any, keys: tf.Tensor) -> None:
    rows = tiered_checkpoint.chunk_rows(table)
    store[prefix + "chunk_rows"] = np.asarray(rows, np.int64)
    n = int(keys.shape[0])
    for k, start in enumerate(range(0, n, rows)):
        chunk = keys[start : start + rows]
        weights, slots = _ops.dynamic_table_tiered_read_rows(table.handle, chunk, num_slots=table.num_slots)
        store[f"{prefix}weights.{k}"] = weights.numpy()
        width = sum(table.slot_widths)
        store[f"{prefix}slots.{k}"] = tf.concat(slots, 1).numpy() if width else np.zeros([len(chunk), 0], np.float32)


def _chunked(entries: dict, prefix: str, table: Any, where: str) -> tuple[list, int]:
    """The chunks [(start, count)] of a chunked save, each entry's shape checked (not read)."""
    n = int(np.shape(entries["keys"])[0])
    rows = int(np.asarray(entries["chunk_rows"][...]))
    if rows < 1:
        raise ValueError(f"{where}: {prefix}chunk_rows is {rows}, it must be >= 1; nothing was changed")
    chunks = [(start, min(rows, n - start)) for start in range(0, n, rows)]
    width = sum(table.slot_widths)
    for k, (_, count) in enumerate(chunks):
        for name, columns in ((f"weights.{k}", table.dim), (f"slots.{k}", width)):
            if name not in entries:
                raise ValueError(f"{where}: the saved weights have no {prefix}{name}; nothing was changed")
            shape = tuple(np.shape(entries[name]))
            if shape != (count, columns):
                raise ValueError(
                    f"{where}: {prefix}{name} has shape {list(shape)}, the table needs {[count, columns]}; nothing "
                    "was changed"
                )
    if f"weights.{len(chunks)}" in entries:
        raise ValueError(f"{where}: the saved weights have more chunks than {n} keys make; nothing was changed")
    return chunks, rows


def _check_table(store_entries: dict, config: Any, table: Any) -> Callable[[], None] | None:
    prefix, where = _prefix(config.name), f"load_model: DynamicTable {config.name!r}"
    entries = {k[len(prefix) :]: v for k, v in store_entries.items() if k.startswith(prefix)}
    if not entries:
        return None  # saved before the table existed: it stays empty
    if "chunk_rows" not in entries:  # every tensor whole (an in-memory table's save)
        contents = {k: tf.convert_to_tensor(v[...]) for k, v in entries.items()}
        step = contents.pop("step")
        table.check_contents(contents, "load_model")
        table.check_fits(contents)

        def write_whole() -> None:
            table.import_contents(contents)
            table.import_policy_state(contents)
            table.step.assign(tf.cast(step, tf.int64))

        return write_whole
    chunks, _ = _chunked(entries, prefix, table, where)
    names = (*_KEY_TENSORS, "step", *table.policy_tensor_names)
    missing = [name for name in names if name not in entries]
    if missing:
        raise ValueError(f"{where}: the saved weights have no {missing}; nothing was changed")
    tensors = {name: np.asarray(entries[name][...]) for name in names}
    n, width = int(tensors["keys"].shape[0]), sum(table.slot_widths)
    # The rows by shape only (arrays of no memory): the spec checks those; each chunk's shape was checked above.
    tensors["weights"] = np.broadcast_to(np.zeros((), np.float32), (n, table.dim))
    tensors["slots"] = np.broadcast_to(np.zeros((), np.float32), (n, width))
    table.spec.validate(tensors, "load_model")
    tensors["step"] = np.asarray(tensors["step"], np.int64)

    def rows(k: int) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(entries[f"weights.{k}"][...], np.float32), np.asarray(entries[f"slots.{k}"][...], np.float32)

    if table.tiered is None:  # a tiered table's save into a table kept in memory: it fits, by construction

        def write_concatenated() -> None:
            parts = [rows(k) for k in range(len(chunks))]
            contents = {k: tf.constant(tensors[k]) for k in (*_KEY_TENSORS, *table.policy_tensor_names)}
            contents["weights"] = tf.constant(np.concatenate([p[0] for p in parts] or [tensors["weights"]]))
            contents["slots"] = tf.constant(np.concatenate([p[1] for p in parts] or [tensors["slots"]]))
            table.import_contents(contents)
            table.import_policy_state(contents)
            table.step.assign(int(tensors["step"]))

        return write_concatenated

    def write_streamed() -> None:
        _ops.dynamic_table_tiered_import_keys(table.handle, *(tensors[k] for k in _KEY_TENSORS))
        keys = tensors["keys"]
        for k, (start, count) in enumerate(chunks):
            weights, slots = rows(k)
            parts = tf.split(slots, table.slot_widths, axis=1) if table.num_slots else []
            _ops.dynamic_table_tiered_write_rows(table.handle, keys[start : start + count], weights, parts)
        table.import_policy_state({k: tensors[k] for k in table.policy_tensor_names})
        table.step.assign(int(tensors["step"]))

    return write_streamed


def check(store: Any, tables: dict) -> list[Callable[[], None]]:
    """Checks the entries of every table of `tables` ({DynamicTableConfig: DynamicTable}) in the Keras weights
    `store`, writing nothing; returns the writes to run (one per table with entries).

    Raises:
      ValueError: naming the table and the entry that does not match.
    """
    entries = {str(k): store[k] for k in store.keys() if str(k).startswith(PREFIX)}
    plans = [_check_table(entries, config, table) for config, table in tables.items()]
    return [plan for plan in plans if plan is not None]
