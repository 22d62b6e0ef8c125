"""The streamed checkpoint of a tiered dynamic table: keys and metadata whole, rows and slots one chunk at a time.

A tiered dynamic table's rows can be larger than memory, so its checkpoint cannot be one tensor of its rows. As
for static tiered tables (`tf_embed_ops.tiered.checkpoint`), a registered TensorFlow checkpoint saver writes it:
TensorFlow calls `save_tables` for every tiered `DynamicTable` a checkpoint holds and merges the prefixes it
writes into the one checkpoint; `restore_tables` reads them back.

The tensors are **the in-memory dynamic table's checkpoint tensors** (`dynamic/table.py`), under the keys
TensorFlow gives an in-memory table at the same object path (`<name>/.ATTRIBUTES/<tensor>`), so either kind of
table restores either kind's checkpoint:

- `keys`, `counts`, `last_steps`, the pending admission counters, `step` and the lifecycle policies' tensors are
  written whole by one `SaveV2`: they live in DRAM anyway (about 24 bytes a key);
- `weights` [n, dim] and `slots` [n, W] (float32, as in memory: 16-bit rows widen exactly) are written as **row
  slices**, chunk k by its own `SaveV2` (rows `[k * c, k * c + n_k)`), the slices TensorFlow's checkpoint format
  keeps for partitioned variables. A reader of the whole tensor (TensorFlow restoring an in-memory table,
  `tf.train.load_checkpoint(path).get_tensor(...)`) gets it assembled from the slices;
- `<name>/.TIERED/manifest`, int64 [2]: the format version (1) and c, the rows per chunk, so that a tiered restore
  reads exactly the saved slices, one chunk at a time.

The rows are read through the table's cache (dirty rows included) without filling it
(`TfEmbed>DynamicTableTieredReadRows`), one chunk of keys at a time: the save holds the keys and one chunk
(`te.Tiered(chunk_bytes=...)`, float32 rows and slots), never the table's rows. A row that cannot be read (a
corrupted record) stops the save with the error naming the table, the row, its key and the row file, after the
chunks already written are removed: no checkpoint is written.

A restore checks everything before it changes the table: the metadata (`checkpoint_check.TableSpec.validate`,
the rows' shapes and dtypes from the checkpoint's index), the policies' tensors, the manifest, and every chunk
(read once, which checks its CRC32C), then imports the keys alone (`TfEmbed>DynamicTableTieredImportKeys`) and
writes the rows chunk by chunk (`TfEmbed>DynamicTableTieredWriteRows`). A checkpoint of the in-memory format (no
manifest: rows saved whole) is restored as an in-memory table's (`DynamicTable._restore_from_tensors`): it came
from a table that fit in memory. Saves and restores run eagerly.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops import _tf_compat
from tf_embed_ops.dynamic import checkpoint_check
from tf_embed_ops.dynamic import ops as _ops

__all__ = [
    "FORMAT_VERSION",
    "check_policy_state",
    "SAVER_NAME",
    "StreamedCheckpoint",
    "bloom_bytes",
    "check_restore",
    "check_streamed",
    "chunk_rows",
    "checkpoint_key",
    "manifest_key",
    "register",
    "restore_tables",
    "save_tables",
]

FORMAT_VERSION = 1
_PACKAGE, _NAME = "tf_embed_ops", "TieredDynamicTable"
SAVER_NAME = f"{_PACKAGE}.{_NAME}"
_ATTRIBUTES = "/.ATTRIBUTES/"
# The metadata tensors, in the order the export-keys op gives them (the in-memory checkpoint's names).
_KEY_TENSORS = ("keys", "counts", "last_steps", "pending_keys", "pending_counts", "pending_last_steps")
# Chunks verified by a te.TPUEmbedding's restore check ({(path, object name): files' signature}): the restore that
# follows does not read them a second time.
_VERIFIED: dict[tuple[str, str], tuple] = {}


def register(table_class: type) -> None:
    """Registers the streamed saver for every tiered instance of `table_class` (`DynamicTable`)."""
    _tf_compat.register_checkpoint_saver(
        package=_PACKAGE,
        name=_NAME,
        predicate=lambda obj: isinstance(obj, table_class) and obj.tiered is not None,
        save_fn=save_tables,
        restore_fn=restore_tables,
    )


def checkpoint_key(name: str, tensor: str) -> str:
    """The key of `tensor` of the table at object path `name`: the in-memory table's."""
    return f"{name}{_ATTRIBUTES}{tensor}"


def manifest_key(name: str) -> str:
    return f"{name}/.TIERED/manifest"


def chunk_rows(table: Any) -> int:
    """Rows per chunk of `table`'s save and restore: `chunk_bytes` of float32 rows and slots."""
    floats = table.dim + sum(table.slot_widths)
    return max(1, int(table.tiered.chunk_bytes) // (4 * floats))


bloom_bytes = checkpoint_check.bloom_bytes


def check_policy_state(tensors: dict, policy_names: tuple, filter_bytes: int, where: str) -> None:
    """The policies' tensors as the table's import of them will take them (checked before the keys are imported,
    since that import comes after the rows): `checkpoint_check.TableSpec`'s own check of them."""
    spec = checkpoint_check.TableSpec("", 1, 0, 0, 0, 1, (0,), filter_bytes, "decayed_keys" in policy_names)
    spec.check_policies(tensors, "check", where, "; nothing was changed")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else value.numpy().decode()


# ------------------------------------------------------------------------------------------------------ save
def save_tables(trackables: dict, file_prefix: Any) -> list[tf.Tensor]:
    """The registered save function: writes every table (keys whole, rows in chunks); returns the prefixes
    written, for TensorFlow to merge into the checkpoint.

    Raises:
      NotImplementedError: inside a `tf.function` (save eagerly).
      tf.errors.OpError: a row that cannot be read, naming the table, the row, its key and the row file; the
        prefixes written are removed, and TensorFlow writes no checkpoint.
    """
    if not tf.executing_eagerly():
        names = ", ".join(repr(t.table_name) for t in trackables.values())
        raise NotImplementedError(
            f"Tiered dynamic tables {names}: their checkpoint is written eagerly only (tf.train.Checkpoint.write or "
            "save outside a tf.function: the rows are streamed chunk by chunk)."
        )
    written: list[tf.Tensor] = []
    for index, (name, table) in enumerate(sorted(trackables.items())):
        try:
            _save_table(table, name, file_prefix, f"tiered_dynamic_{index}_{_safe(name)}", written)
        except tf.errors.OpError as e:
            _remove(written)
            raise type(e)(
                e.node_def,
                e.op,
                f"DynamicTable {table.table_name!r}: checkpoint {_text(file_prefix)}: {e.message}; no checkpoint "
                "was written",
            ) from None
        except BaseException:
            _remove(written)
            raise
    return written


def _remove(prefixes: list[tf.Tensor]) -> None:
    for prefix in prefixes:
        for path in glob.glob(glob.escape(_text(prefix)) + ".*"):
            try:
                os.remove(path)
            except OSError:
                pass


def _save_table(table: Any, name: str, file_prefix: Any, tag: str, written: list) -> None:
    metadata = dict(zip(_KEY_TENSORS, _ops.dynamic_table_tiered_export_keys(table.handle), strict=True))
    n, dim, width = int(metadata["keys"].shape[0]), table.dim, sum(table.slot_widths)
    rows = chunk_rows(table)
    tensors = {**metadata, "step": table.step.read_value(), **table.export_policy_state()}
    # Nothing to slice: an empty table's rows, a table without slots' slots.
    if n == 0:
        tensors["weights"] = tf.zeros([0, dim], tf.float32)
    if n == 0 or width == 0:
        tensors["slots"] = tf.zeros([n, width], tf.float32)
    names = [checkpoint_key(name, k) for k in tensors] + [manifest_key(name)]
    values = [*tensors.values(), tf.constant([FORMAT_VERSION, rows], tf.int64)]
    prefix = tf.strings.join([file_prefix, f"_{tag}_keys"])
    written.append(prefix)  # before the write: a write that fails may leave part of its files
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=values)
    keys = metadata["keys"]
    for k, start in enumerate(range(0, n, rows)):
        count = min(rows, n - start)
        weights, slots = _ops.dynamic_table_tiered_read_rows(
            table.handle, keys[start : start + count], num_slots=table.num_slots
        )
        names, slices, values = [checkpoint_key(name, "weights")], [f"{n} {dim} {start},{count}:-"], [weights]
        if width:
            names.append(checkpoint_key(name, "slots"))
            slices.append(f"{n} {width} {start},{count}:-")
            values.append(tf.concat(slots, 1))
        prefix = tf.strings.join([file_prefix, f"_{tag}_part{k}"])
        written.append(prefix)
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=slices, tensors=values)


# --------------------------------------------------------------------------------------------------- restore
def restore_tables(trackables: dict, merged_prefix: Any) -> None:
    """The registered restore function: checks every table's part of the checkpoint, then writes them.

    TensorFlow hands it the tiered tables of a checkpoint written by `save_tables` (keyed by object path) or of
    an in-memory table's checkpoint (keyed by the first tensor's key).

    Raises:
      ValueError: naming the table, the checkpoint and what does not match; no table was changed.
      tf.errors.DataLossError: a data file is truncated or corrupt (naming the file and the table); no table was
        changed.
      NotImplementedError: inside a `tf.function` (restore eagerly).
    """
    if not tf.executing_eagerly():
        names = ", ".join(repr(t.table_name) for t in trackables.values())
        raise NotImplementedError(
            f"Tiered dynamic tables {names}: their checkpoint is restored eagerly only (tf.train.Checkpoint.restore "
            "or read outside a tf.function: the rows are streamed chunk by chunk)."
        )
    path = _text(merged_prefix)
    reader = tf.train.load_checkpoint(path)
    plans = [check_restore(table, key, path, reader) for key, table in sorted(trackables.items())]
    for plan in plans:
        plan()


def _object_name(key: str) -> str:
    """The object path of a table's checkpoint: TensorFlow's key for a registered saver's object, or an in-memory
    table's first tensor key (`<name>/.ATTRIBUTES/<tensor>`)."""
    return key[: key.index(_ATTRIBUTES)] if _ATTRIBUTES in key else key


def check_restore(table: Any, key: str, path: str, reader: Any) -> Callable[[], None]:
    """Checks tiered `table`'s part of the checkpoint at `path`, writing nothing; returns the restore.

    Args:
      table: the tiered `DynamicTable`.
      key: its registered saver's object name, or the first tensor key of an in-memory table's checkpoint.
      path: the checkpoint.
      reader: `tf.train.load_checkpoint(path)`.

    Returns:
      A function that restores the table (streamed: the keys, then the rows chunk by chunk).

    Raises:
      ValueError: naming the table, the checkpoint and what does not match.
      tf.errors.DataLossError: a data file is truncated or corrupt (naming the file and the table).
    """
    name = _object_name(key)
    if manifest_key(name) not in reader.get_variable_to_shape_map():
        return _check_whole(table, name, path, reader)
    verified = _VERIFIED.pop((path, name), None) == _signature(path)
    checked = check_streamed(
        table.spec, table.policy_tensor_names, name, path, reader, verify=not verified, filter_bytes=table.bloom_bytes
    )
    return lambda: checked.write(table)


def _check_whole(table: Any, name: str, path: str, reader: Any) -> Callable[[], None]:
    """An in-memory table's checkpoint (rows saved whole): restored as the in-memory table restores it."""
    shapes = reader.get_variable_to_shape_map()
    wanted = (*_KEY_TENSORS, "weights", "slots", "step", *table.policy_tensor_names)
    missing = [t for t in wanted if checkpoint_key(name, t) not in shapes]
    if missing:
        raise ValueError(
            f"DynamicTable {table.table_name!r}: restore from {path}: the checkpoint has no {missing} for object "
            f"{name!r}; nothing was changed"
        )
    tensors = {t: tf.constant(_read(reader, checkpoint_key(name, t), table.table_name, path)) for t in wanted}
    table.spec.validate({k: v.numpy() for k, v in tensors.items()})
    return lambda: table.restore_tensors(tensors)


def _read(reader: Any, key: str, table_name: str, path: str) -> np.ndarray:
    """`checkpoint_check.read_tensor`: a truncated or corrupt file is a DataLossError naming it and the table."""
    return checkpoint_check.read_tensor(reader, path, key, f"DynamicTable {table_name!r}")


_signature = checkpoint_check.signature


class StreamedCheckpoint:
    """One table's streamed checkpoint, checked: its metadata (read) and its chunks (verified, not held).

    Attributes:
      tensors: the metadata tensors (numpy) by name: keys, counts, last_steps, pending counters, step, policies.
      chunks: [(first_row, rows)].
    """

    def __init__(self, name: str, path: str, tensors: dict, chunks: list, dim: int, width: int, label: str):
        self.name, self.path, self.tensors, self.chunks = name, path, tensors, chunks
        self.dim, self.width, self.label = dim, width, label

    def read_chunk(self, start: int, count: int) -> tuple[tf.Tensor, tf.Tensor]:
        """Rows `[start, start + count)`: weights [count, dim] and slots [count, W], float32 (the CRC checked)."""
        n = int(self.tensors["keys"].shape[0])
        names = [checkpoint_key(self.name, "weights")]
        slices = [f"{n} {self.dim} {start},{count}:-"]
        if self.width:
            names.append(checkpoint_key(self.name, "slots"))
            slices.append(f"{n} {self.width} {start},{count}:-")
        try:
            out = tf.raw_ops.RestoreV2(
                prefix=self.path, tensor_names=names, shape_and_slices=slices, dtypes=[tf.float32] * len(names)
            )
        except tf.errors.OpError as e:
            raise tf.errors.DataLossError(
                None,
                None,
                f"{self.label}: restore: the checkpoint file {checkpoint_check.data_files(self.path)} is truncated "
                f"or corrupt: cannot read rows [{start}, {start + count}) of {self.name!r} ({type(e).__name__}: "
                f"{e.message}); nothing was changed",
            ) from None
        slots = out[1] if self.width else tf.zeros([count, 0], tf.float32)
        return out[0], slots

    def verify(self, remember: bool = False) -> None:
        """Reads every chunk once (TensorFlow's reader checks its CRC32C), holding one at a time; `remember`: the
        restore of the same checkpoint that follows does not read them again."""
        for start, count in self.chunks:
            self.read_chunk(start, count)
        if remember:
            _VERIFIED[(self.path, self.name)] = _signature(self.path)

    def write(self, table: Any) -> None:
        """Restores `table`: the keys and metadata, then the rows chunk by chunk, the policies, the step."""
        t = self.tensors
        _ops.dynamic_table_tiered_import_keys(table.handle, *(t[k] for k in _KEY_TENSORS))
        keys = t["keys"]
        for start, count in self.chunks:
            weights, slots = self.read_chunk(start, count)
            parts = tf.split(slots, table.slot_widths, axis=1) if table.num_slots else []
            _ops.dynamic_table_tiered_write_rows(table.handle, keys[start : start + count], weights, parts)
        table.import_policy_state({k: t[k] for k in table.policy_tensor_names})
        table.step.assign(int(t["step"]))


def check_streamed(
    spec: Any,
    policy_names: tuple,
    name: str,
    path: str,
    reader: Any,
    verify: bool = True,
    remember: bool = False,
    filter_bytes: int = 0,
) -> StreamedCheckpoint:
    """Checks a streamed checkpoint of object `name` against a table (`spec`: its `checkpoint_check.TableSpec`;
    `policy_names`: the policies' tensors it restores; `filter_bytes`: its Bloom filter's size, `bloom_bytes`),
    reading the metadata whole and, with `verify`, every chunk once (`remember`: for the table's restore that
    follows); writes nothing.

    Raises:
      ValueError: naming the table, the checkpoint and what does not match.
      tf.errors.DataLossError: a data file is truncated or corrupt (naming the file and the table).
    """
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    label = f"DynamicTable {spec.name!r}"
    where = f"{label}: restore from {path}:"
    manifest = [int(v) for v in _read(reader, manifest_key(name), spec.name, path).reshape(-1)]
    if len(manifest) != 2 or manifest[0] != FORMAT_VERSION or manifest[1] < 1:
        raise ValueError(
            f"{where} {manifest_key(name)!r} is {manifest}: not a version-{FORMAT_VERSION} streamed dynamic table "
            "checkpoint; nothing was changed"
        )
    rows = manifest[1]
    wanted = (*_KEY_TENSORS, "step", *policy_names)
    missing = [t for t in (*wanted, "weights", "slots") if checkpoint_key(name, t) not in shapes]
    if missing:
        raise ValueError(f"{where} the checkpoint has no {missing} for object {name!r}; nothing was changed")
    tensors = {t: _read(reader, checkpoint_key(name, t), spec.name, path) for t in wanted}
    # The rows as their shape and dtype only (an array of no memory): validate checks those.
    for t in ("weights", "slots"):
        key = checkpoint_key(name, t)
        tensors[t] = np.broadcast_to(np.zeros((), tf.as_dtype(dtypes[key]).as_numpy_dtype), shapes[key])
    spec.validate(tensors)
    check_policy_state(tensors, policy_names, filter_bytes, where)
    n = int(tensors["keys"].shape[0])
    chunks = [(start, min(rows, n - start)) for start in range(0, n, rows)]
    checked = StreamedCheckpoint(name, path, tensors, chunks, spec.dim, spec.slot_width, label)
    if verify:
        checked.verify(remember)
    return checked
