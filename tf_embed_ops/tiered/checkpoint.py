"""The streaming checkpoint of tiered tables: a registered checkpoint saver, rows moved one chunk at a time.

A tiered table can be larger than memory, so it cannot hand TensorFlow one tensor of its rows. TensorFlow's
registered checkpoint savers (`tf.train.Checkpoint` calls them for the objects their predicate accepts) let it
write its own checkpoint shards: `save_tables` reads the table one chunk of rows at a time and writes each chunk
with its own `SaveV2` to its own prefix; TensorFlow merges those prefixes (`MergeV2Checkpoints`) into the one
checkpoint beside the other objects' tensors. `restore_tables` reads them back chunk by chunk with `RestoreV2`. The
memory either needs is one chunk (`te.Tiered(chunk_bytes=...)`), whatever the table's size.

Keys, for a table saved at object path `<name>` (e.g. `embedding/user`):

| key | dtype, shape | |
| --- | --- | --- |
| `<name>/manifest` | int64 [5 + S] | format version (1), num_rows, dim, chunk_rows, S, then each slot's width |
| `<name>/slot_names` | string [S] | the optimizer's slots, Load/Retrieve order |
| `<name>/step` | int64 [] | the rounding step of 16-bit rows |
| `<name>/part-<k>` | storage dtype [n_k, dim] | rows [k * chunk_rows, k * chunk_rows + n_k) |
| `<name>/<slot>/part-<k>` | slot storage dtype [n_k, width] | the same rows' slot |

Rows are saved in their storage dtype (exact; bfloat16 rows take half the bytes). The checkpoint's own format
checksums every tensor (CRC32C), and TensorFlow writes it to temporary names and renames it when complete.

A restore checks the whole checkpoint of every tiered table it restores (manifest, geometry, every chunk's key,
shape and dtype) before it writes any row: a refused restore changes no tiered table. It also restores from the
checkpoint of the same table kept in memory (`te.TPUEmbedding` without `storage`): TensorFlow then hands the
saver the in-memory table's checkpoint key, and its rows and slots (`<table>`, `<table>/<slot>`, and the
embedding's `rounding_step`) are read as row slices of those tensors, one chunk at a time.

Restores run eagerly (`tf.train.Checkpoint.restore` / `read` outside a `tf.function`). A completed restore marks
every row of the table changed for its touched-row trackers (`TfEmbed>TieredTableMarkAllTouched`): their consumers
read `full` (docs/tracking.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat
from tf_embed_ops.dynamic import checkpoint_check

__all__ = ["FORMAT_VERSION", "SAVER_NAME", "RestoreCheck", "check_restore", "register", "restore_tables", "save_tables"]

FORMAT_VERSION = 1
# The registered saver's name, recorded in a checkpoint's object graph for every tiered table it holds.
_PACKAGE, _NAME = "tf_embed_ops", "TieredTable"
SAVER_NAME = f"{_PACKAGE}.{_NAME}"
_VARIABLE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
_ROW_DTYPES = (tf.float32, tf.bfloat16, tf.float16)


def register(table_class: type) -> None:
    """Registers the streaming saver for every instance of `table_class` (the `TieredTable` class)."""
    _tf_compat.register_checkpoint_saver(
        package=_PACKAGE,
        name=_NAME,
        predicate=lambda obj: isinstance(obj, table_class),
        save_fn=save_tables,
        restore_fn=restore_tables,
    )


def _part(name: str, k: int, slot: str | None = None) -> str:
    return f"{name}/part-{k}" if slot is None else f"{name}/{slot}/part-{k}"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def save_tables(trackables: dict, file_prefix: Any) -> list[tf.Tensor]:
    """The registered save function: writes every table in chunks; returns the prefixes written (one per chunk
    and one for each table's manifest), for TensorFlow to merge."""
    prefixes: list[tf.Tensor] = []
    for index, (name, table) in enumerate(sorted(trackables.items())):
        prefixes += _save_table(table, name, file_prefix, f"{index}_{_safe(name)}")
    return prefixes


def _save_table(table: Any, name: str, file_prefix: Any, tag: str) -> list[tf.Tensor]:
    manifest = tf.constant(
        [FORMAT_VERSION, table.num_rows, table.dim, table.chunk_rows, len(table.slot_names), *table.slot_widths],
        tf.int64,
    )
    names = tf.constant(table.slot_names, tf.string, shape=[len(table.slot_names)])
    prefix = tf.strings.join([file_prefix, f"_tiered_{tag}_manifest"])
    done = tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=[f"{name}/manifest", f"{name}/slot_names", f"{name}/step"],
        shape_and_slices=[""] * 3,
        tensors=[manifest, names, table.step.read_value()],
    )
    out = [_after(done, prefix)]
    for k, (start, n) in enumerate(table.chunks()):
        # Chained: in a graph the chunks are read and written one after the other, never all held at once.
        with tf.control_dependencies([done] if done is not None else []):
            values, slots = table.read_rows(start, n)
            tensors = [tf.cast(values, table.dtypes[0])]
            tensors += [tf.cast(slots[s], d) for s, d in zip(table.slot_names, table.dtypes[1:], strict=True)]
            keys = [_part(name, k)] + [_part(name, k, s) for s in table.slot_names]
            prefix = tf.strings.join([file_prefix, f"_tiered_{tag}_part{k}"])
            done = tf.raw_ops.SaveV2(
                prefix=prefix, tensor_names=keys, shape_and_slices=[""] * len(keys), tensors=tensors
            )
        out.append(_after(done, prefix))
    return out


def _after(op: Any, prefix: tf.Tensor) -> tf.Tensor:
    if op is None:  # eager: already written
        return prefix
    with tf.control_dependencies([op]):
        return tf.identity(prefix)


class _Checked:
    """One table's restore, checked: `write()` moves the rows."""

    def __init__(self, table: Any, chunks: list[tuple[int, int]], read_chunk: Callable, step: Any):
        self.table, self.chunks, self.read_chunk, self.step = table, chunks, read_chunk, step

    def write(self) -> None:
        for k, (start, n) in enumerate(self.chunks):
            values, slots = self.read_chunk(k, start, n)
            self.table.write_rows(start, values, slots)
        self.table.step.assign(self.step)
        # Each chunk's write marked its own rows; the table was replaced whole, so every tracker reads `full`, as
        # after an in-memory table's restore through the tracker. (An in-memory target, `engine.tiered_restore`,
        # has no such call: its variables are restored like any variable, see docs/tracking.md.)
        mark_all = getattr(self.table, "mark_all_touched", None)
        if mark_all is not None:
            mark_all()


def restore_tables(trackables: dict, merged_prefix: Any) -> None:
    """The registered restore function: checks every table's part of the checkpoint, then writes them chunk by
    chunk (see the module docstring).

    Raises:
      ValueError: naming the table, the checkpoint and what does not match; no tiered table was changed.
      NotImplementedError: inside a `tf.function` (restore eagerly), which is also where `tf.saved_model.save`
        traces it: a SavedModel of a tiered table is refused.
    """
    if not tf.executing_eagerly():
        names = ", ".join(repr(t.table_name) for t in trackables.values())
        raise NotImplementedError(
            f"Tiered tables {names}: their checkpoint is restored eagerly only (tf.train.Checkpoint.restore or read "
            "outside a tf.function: the restore streams the rows chunk by chunk from Python), and a SavedModel "
            "cannot hold them yet (read their rows with TieredTable.read_rows to export them)."
        )
    path = merged_prefix if isinstance(merged_prefix, str) else merged_prefix.numpy().decode()
    reader = tf.train.load_checkpoint(path)
    checked = [check_restore(table, key, path, reader) for key, table in sorted(trackables.items())]
    for plan in checked:
        plan.write()


class RestoreCheck:
    """A built `TieredTable`'s restore check for `engine.checkpoint`: its streamed checkpoint's manifest, geometry
    and every chunk, or the in-memory table's variables it would restore from (`check_restore`), without reading any
    row; its registered saver then restores it."""

    def __init__(self, table: Any):
        self.table = table

    def check(self, name: str, node: Any, restore: Any) -> None:
        """Checks child `name`'s checkpoint node (`restore`: the restore's checkpoint); nothing runs after."""
        del name  # the table names itself
        keys = {a.name: a.checkpoint_key for a in node.attributes}
        # Streamed (its saver's object name) or the in-memory table's checkpoint (its variable's key).
        key = node.registered_saver.object_name or keys.get("VARIABLE_VALUE")
        if key:
            check_restore(self.table, key, restore.path, restore.reader)


def check_restore(table: Any, key: str, path: str, reader: Any) -> _Checked:
    """Checks `table`'s part of the checkpoint at `path` (read with `reader`), writing nothing.

    Args:
      table: the `TieredTable`, or any object with its geometry (`table_name`, `num_rows`, `dim`, `slot_names`,
        `slot_widths`), `write_rows(first_row, values, slots)` and `step.assign` (an in-memory table's variables,
        `engine.tiered_restore`).
      key: its object name in a tiered checkpoint, or its `<table>` variable's key in an in-memory one.
      path: the checkpoint.
      reader: `tf.train.load_checkpoint(path)`.

    Returns:
      The checked restore (its `write()` restores the table).

    Raises:
      ValueError: naming the table, the checkpoint and what does not match.
      tf.errors.DataLossError: the data files are shorter than the tensors the index lists, or a tensor cannot be
        read (naming the file and the table). A truncated file is found before the first row is written; a chunk
        corrupt inside a file of the right size is found when the restore reads it.
    """
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    label = getattr(table, "restore_label", None) or f"TieredTable {table.table_name!r}"
    where = f"{label}: restore from {path}:"
    checkpoint_check.check_data_files(path, reader, label, "no tiered table was changed")
    if key.endswith(_VARIABLE_SUFFIX):
        return _check_variable_format(table, key, path, reader, shapes, dtypes, where)
    return _check_tiered_format(table, key, path, reader, shapes, dtypes, where)


def _restore(path: str, keys: list, slices: list, dtypes: list, label: str, what: str) -> list:
    """RestoreV2 of these slices; a file that cannot be read is a DataLossError naming it and the table."""
    try:
        return tf.raw_ops.RestoreV2(prefix=path, tensor_names=keys, shape_and_slices=slices, dtypes=dtypes)
    except tf.errors.OpError as e:
        raise tf.errors.DataLossError(
            None,
            None,
            f"{label}: restore: the checkpoint file {checkpoint_check.data_files(path)} is truncated or corrupt: "
            f"cannot read {what} ({type(e).__name__}: {e.message})",
        ) from None


def _need(key: str, shapes: dict, dtypes: dict, shape: list, where: str) -> tf.DType:
    """The dtype of `key`, after checking it is in the checkpoint with `shape` and a row dtype."""
    if key not in shapes:
        raise ValueError(f"{where} the checkpoint has no tensor {key!r}; no tiered table was changed")
    if list(shapes[key]) != list(shape):
        raise ValueError(
            f"{where} {key!r} has shape {list(shapes[key])}, the table needs {list(shape)}; no tiered table was changed"
        )
    dtype = tf.as_dtype(dtypes[key])
    if dtype not in _ROW_DTYPES:
        raise ValueError(f"{where} {key!r} has dtype {dtype.name}; no tiered table was changed")
    return dtype


def _check_tiered_format(table, name, path, reader, shapes, dtypes, where) -> _Checked:
    manifest_key = f"{name}/manifest"
    if manifest_key not in shapes:
        raise ValueError(f"{where} the checkpoint has no {manifest_key!r}; no tiered table was changed")
    label = getattr(table, "restore_label", None) or f"TieredTable {table.table_name!r}"
    end = "no tiered table was changed"
    manifest = [int(v) for v in checkpoint_check.read_tensor(reader, path, manifest_key, label, end).reshape(-1)]
    if len(manifest) < 5 or manifest[0] != FORMAT_VERSION:
        raise ValueError(
            f"{where} {manifest_key!r} is {manifest}: not a version-{FORMAT_VERSION} tiered table checkpoint; no "
            "tiered table was changed"
        )
    _, num_rows, dim, chunk_rows, num_slots = manifest[:5]
    widths = manifest[5:]
    saved_names = [
        s.decode() for s in checkpoint_check.read_tensor(reader, path, f"{name}/slot_names", label, end).reshape(-1)
    ]
    got = (num_rows, dim, saved_names, widths)
    want = (table.num_rows, table.dim, table.slot_names, table.slot_widths)
    if got != want or num_slots != len(widths) or chunk_rows < 1:
        raise ValueError(
            f"{where} the checkpoint holds a table of {num_rows} rows of dim {dim} with slots {saved_names} (widths "
            f"{widths}); this table has {table.num_rows} rows of dim {table.dim} with slots {table.slot_names} "
            f"(widths {table.slot_widths}); no tiered table was changed"
        )
    step = checkpoint_check.read_tensor(reader, path, f"{name}/step", label, end) if f"{name}/step" in shapes else 0
    chunks = [(start, min(chunk_rows, num_rows - start)) for start in range(0, num_rows, chunk_rows)]
    part_dtypes = []
    for k, (_, n) in enumerate(chunks):
        row = [_need(_part(name, k), shapes, dtypes, [n, dim], where)]
        row += [
            _need(_part(name, k, s), shapes, dtypes, [n, w], where) for s, w in zip(saved_names, widths, strict=True)
        ]
        part_dtypes.append(row)
    if f"{name}/part-{len(chunks)}" in shapes:
        raise ValueError(f"{where} the checkpoint has more chunks than its manifest says; no tiered table was changed")

    def read_chunk(k: int, start: int, n: int):
        keys = [_part(name, k)] + [_part(name, k, s) for s in saved_names]
        tensors = _restore(path, keys, [""] * len(keys), part_dtypes[k], label, f"rows [{start}, {start + n})")
        return tf.cast(tensors[0], tf.float32), [tf.cast(t, tf.float32) for t in tensors[1:]]

    return _Checked(table, chunks, read_chunk, int(step))


def _check_variable_format(table, key, path, reader, shapes, dtypes, where) -> _Checked:
    """A checkpoint of the in-memory table: `key` is its `<table>` variable's key."""
    prefix = key[: -len(_VARIABLE_SUFFIX)]
    keys = [key] + [prefix + _tf_compat.escape_local_name("/" + s) + _VARIABLE_SUFFIX for s in table.slot_names]
    widths = [table.dim, *table.slot_widths]
    key_dtypes = [_need(k, shapes, dtypes, [table.num_rows, w], where) for k, w in zip(keys, widths, strict=True)]
    parent = prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""
    step_key = parent + "rounding_step" + _VARIABLE_SUFFIX
    label = getattr(table, "restore_label", None) or f"TieredTable {table.table_name!r}"
    has_step = step_key in shapes and list(shapes[step_key]) == []
    step = (
        int(checkpoint_check.read_tensor(reader, path, step_key, label, "no tiered table was changed"))
        if has_step
        else 0
    )
    if step < 0:
        raise ValueError(f"{where} {step_key!r} is {step}, it must be >= 0; no tiered table was changed")

    def read_chunk(k: int, start: int, n: int):
        del k
        slices = [f"{table.num_rows} {w} {start},{n}:0,{w}" for w in widths]
        tensors = _restore(path, keys, slices, key_dtypes, label, f"rows [{start}, {start + n})")
        return tf.cast(tensors[0], tf.float32), [tf.cast(t, tf.float32) for t in tensors[1:]]

    return _Checked(table, table.chunks(), read_chunk, step)
