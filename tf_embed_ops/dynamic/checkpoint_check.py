"""What a dynamic table's checkpoint must hold, checked in numpy before any row is imported.

`TableSpec.validate` takes a checkpoint's nine tensors (`keys`, `weights`, `slots`, `counts`, `last_steps`,
`pending_keys`, `pending_counts`, `pending_last_steps`, `step`; docs/dynamic_tables.md, "Checkpoints") and raises
`ValueError` naming the table, the tensor and the value on the first thing the import would refuse or that
would leave the table unusable: missing tensors, dtypes, shapes, a step that is not a scalar >= 0, counts and
steps out of range, duplicate keys, rows or admission counters beyond what a shard may hold, admission counters
for a table that does not count, and the lifecycle policies' tensors: a checkpoint of another admission or
eviction policy (a Bloom filter's counters restored into a `FrequencyAdmission` table, or the reverse), a filter of
another size, decayed counts that are not finite and >= 0. It runs both from a table's own restore and from
`te.TPUEmbedding`'s, which checks every table before it lets TensorFlow write any
(tf_embed_ops/engine/checkpoint.py).

`check_restore` is a table's own all-or-nothing check, run from its `_checkpoint_adapter` (TensorFlow calls it when
a restore reaches the object, before it reads any tensor): it reads the table's tensors from the checkpoint files
and validates them. A data file that cannot be read (truncated, corrupt) is `tf.errors.DataLossError` naming the
file and the table (`read_tensor`, `check_data_files`); nothing was changed then either.
"""

from __future__ import annotations

import glob
import inspect
import os
import weakref
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tf_embed_ops import _tf_compat
from tf_embed_ops.dynamic.sharding import shard_of_keys

__all__ = [
    "MAX_COUNT",
    "POLICY_TENSORS",
    "TENSORS",
    "TableSpec",
    "bloom_bytes",
    "calling_position",
    "check_data_files",
    "check_restore",
    "data_files",
    "mark_checked",
    "read_tensor",
    "signature",
]

# Per-row counts saturate at the core's uint32 (cc/lib/dynamic_table.h kMaxCount).
MAX_COUNT = 0xFFFFFFFF
_INT = ("keys", "counts", "last_steps", "pending_keys", "pending_counts", "pending_last_steps", "step")
_FLOAT = ("weights", "slots")
TENSORS = ("keys", "weights", "slots", "counts", "last_steps", "pending_keys", "pending_counts", "pending_last_steps")
# The lifecycle policies' tensors: a Bloom admission's filters, decayed LFU's counts.
POLICY_TENSORS = ("bloom_counters", "decayed_keys", "decayed_counts")


def bloom_bytes(attrs: Mapping[str, Any]) -> int:
    """Bytes of one Bloom admission filter of a table with these handle attributes (0 without one)."""
    counters = int(attrs.get("bloom_num_counters", 0))
    return -(-counters * int(attrs.get("bloom_counter_bits", 8)) // 8) if counters else 0


def _admission_text(attrs: Mapping[str, Any]) -> str:
    if int(attrs.get("bloom_num_counters", 0)):
        return (
            f"te.dynamic.BloomAdmission(num_counters={int(attrs['bloom_num_counters'])}, "
            f"counter_bits={int(attrs.get('bloom_counter_bits', 8))})"
        )
    return f"te.dynamic.FrequencyAdmission(min_count={int(attrs.get('admission_min_count', 1))})"


class TableSpec(NamedTuple):
    """The table a checkpoint is restored into: its name, row layout, limits and which shards of it are here."""

    name: str
    dim: int
    slot_width: int
    max_rows: int
    max_pending_keys: int
    num_shards: int
    shard_indices: tuple[int, ...]
    bloom_bytes: int = 0  # one Bloom filter's bytes (0: no Bloom admission)
    decays: bool = False  # the eviction is DecayedLFU (its counts are checkpointed)
    admission: str = ""  # the admission policy, for messages

    @classmethod
    def of(cls, attrs: Mapping[str, Any], num_shards: int = 1, shard_indices: tuple[int, ...] = (0,)) -> TableSpec:
        """From the table's handle attributes (`dynamic.config.handle_attrs`)."""
        widths = list(attrs.get("slot_widths", ())) or [int(attrs["dim"])] * len(attrs.get("slot_initial_values", ()))
        return cls(
            name=str(attrs["table_name"]),
            dim=int(attrs["dim"]),
            slot_width=int(sum(widths)),
            max_rows=int(attrs["max_rows"]),
            max_pending_keys=int(attrs.get("max_pending_keys", 0)),
            num_shards=int(num_shards),
            shard_indices=tuple(shard_indices),
            bloom_bytes=bloom_bytes(attrs),
            decays=attrs.get("eviction") == "decayed_lfu",
            admission=_admission_text(attrs),
        )

    @property
    def policy_names(self) -> tuple[str, ...]:
        """The policy tensors a checkpoint of this table holds (`POLICY_TENSORS`)."""
        return (("bloom_counters",) if self.bloom_bytes else ()) + (
            ("decayed_keys", "decayed_counts") if self.decays else ()
        )

    def validate(self, tensors: Mapping[str, Any], what: str = "restore") -> None:
        """Raises ValueError on the first problem of a checkpoint's tensors (numpy arrays or eager tensors).

        Args:
          tensors: the checkpoint's tensors by name (`TENSORS` and `step`, and any policy tensors: checked when
            given; for a "restore", the policy tensors given must be the table's, `policy_names`).
          what: the operation, for the message.

        Raises:
          ValueError: naming the table, the tensor and the value; the caller has changed nothing yet.
        """
        where = f"DynamicTable {self.name!r}: {what}:"
        source = "the checkpoint" if what == "restore" else "the content"
        end = "; nothing was changed"
        missing = [k for k in (*TENSORS, "step") if k not in tensors]
        if missing:
            raise ValueError(f"{where} {source} lacks {missing}{end}")
        self.check_policies(tensors, what, where, end)  # first: a checkpoint of another policy says so
        t = {k: np.asarray(tensors[k]) for k in (*TENSORS, "step")}
        for k in _INT:
            if t[k].dtype != np.int64:
                raise ValueError(f"{where} {k} must be int64, got {t[k].dtype}{end}")
        for k in _FLOAT:
            if t[k].dtype != np.float32:
                raise ValueError(f"{where} {k} must be float32, got {t[k].dtype}{end}")
        if t["step"].shape != ():
            raise ValueError(f"{where} the step must be a scalar (shape []), got shape {list(t['step'].shape)}{end}")
        if int(t["step"]) < 0:
            raise ValueError(f"{where} the step must be >= 0, got {int(t['step'])}{end}")
        n = t["keys"].shape[0] if t["keys"].ndim == 1 else None
        want = {
            "keys": (n,),
            "weights": (n, self.dim),
            "slots": (n, self.slot_width),
            "counts": (n,),
            "last_steps": (n,),
        }
        p = t["pending_keys"].shape[0] if t["pending_keys"].ndim == 1 else None
        want.update({k: (p,) for k in ("pending_keys", "pending_counts", "pending_last_steps")})
        for k, shape in want.items():
            if n is None or p is None or t[k].shape != shape:
                raise ValueError(
                    f"{where} {k} has shape {list(t[k].shape)}, expected {list(shape)} (n = {n} rows, "
                    f"p = {p} admission counters, dim {self.dim}, {self.slot_width} slot values per row){end}"
                )
        self._check_range(t, "counts", 0, "keys", where, end)
        self._check_range(t, "pending_counts", 1, "pending_keys", where, end)
        for k, key in (("last_steps", "keys"), ("pending_last_steps", "pending_keys")):
            bad = np.flatnonzero(t[k] < 0)
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"{where} {k}[{i}] (key {int(t[key][i])}) is {int(t[k][i])}, must be >= 0{end}")
        for k in ("keys", "pending_keys"):
            values, counts = np.unique(t[k], return_counts=True)
            if np.any(counts > 1):
                raise ValueError(f"{where} key {int(values[counts > 1][0])} appears more than once in {k}{end}")
        both = np.intersect1d(t["keys"], t["pending_keys"])
        if both.size:
            raise ValueError(f"{where} key {int(both[0])} is both a row and a pending admission counter{end}")
        if p and self.max_pending_keys == 0:
            raise ValueError(
                f"{where} {source} holds {p} pending admission counters but the table counts none (no "
                f"te.dynamic.FrequencyAdmission with min_count > 1); restore into a table with the checkpoint's "
                f"admission{end}"
            )
        rows = self._per_shard(t["keys"])
        pending = self._per_shard(t["pending_keys"])
        for index in self.shard_indices:
            shard = f" for shard {index} of {self.num_shards}" if self.num_shards > 1 else ""
            if rows[index] > self.max_rows:
                raise ValueError(
                    f"{where} {source} holds {rows[index]} rows{shard}, more than max_rows={self.max_rows}; "
                    f"raise max_rows or restore into more shards. Nothing was changed"
                )
            if pending[index] > self.max_pending_keys:
                raise ValueError(
                    f"{where} {source} holds {pending[index]} pending admission counters{shard}, more than "
                    f"max_pending_keys={self.max_pending_keys}; raise max_pending_keys or restore into more "
                    f"shards. Nothing was changed"
                )

    def check_policies(self, tensors: Mapping[str, Any], what: str, where: str, end: str) -> None:
        """The policies' tensors, as the import of them after the rows will take them: checked first, so a
        refused policy state leaves the rows as they were."""
        given = tuple(k for k in POLICY_TENSORS if k in tensors)
        if what == "restore" and set(given) != set(self.policy_names):
            saved = (
                "te.dynamic.BloomAdmission (it holds a Bloom filter)"
                if "bloom_counters" in given
                else ("te.dynamic.FrequencyAdmission or no admission (it holds no Bloom filter)")
            )
            if ("bloom_counters" in given) == bool(self.bloom_bytes):
                saved_decay = "DecayedLFU" if "decayed_keys" in given else "another eviction than DecayedLFU"
                mine = "DecayedLFU" if self.decays else "another eviction than DecayedLFU"
                raise ValueError(
                    f"{where} the checkpoint was saved by a table with {saved_decay} eviction, this table has "
                    f"{mine}: restore into a table with the checkpoint's eviction policy{end}"
                )
            raise ValueError(
                f"{where} the checkpoint was saved by a table with {saved}, this table's admission is "
                f"{self.admission}: restore into a table with the checkpoint's admission policy{end}"
            )
        if "bloom_counters" in given:
            bloom = np.asarray(tensors["bloom_counters"])
            if bloom.dtype != np.uint8 or bloom.ndim != 2 or bloom.shape[0] < 1 or bloom.shape[1] != self.bloom_bytes:
                raise ValueError(
                    f"{where} bloom_counters is {bloom.dtype} {list(bloom.shape)}, the table's filter takes uint8 "
                    f"[parts, {self.bloom_bytes}] ({self.admission}: num_counters and counter_bits must match){end}"
                )
        if "decayed_keys" in given or "decayed_counts" in given:
            keys = np.asarray(tensors.get("decayed_keys", np.zeros([0], np.int64)))
            counts = np.asarray(tensors.get("decayed_counts", np.zeros([0], np.float32)))
            if keys.dtype != np.int64 or counts.dtype != np.float32 or keys.ndim != 1 or keys.shape != counts.shape:
                raise ValueError(
                    f"{where} decayed_keys is {keys.dtype} {list(keys.shape)} and decayed_counts {counts.dtype} "
                    f"{list(counts.shape)}; they must be int64 [n] and float32 [n]{end}"
                )
            bad = np.flatnonzero(~(np.isfinite(counts) & (counts >= 0)))
            if bad.size:
                i = int(bad[0])
                raise ValueError(
                    f"{where} decayed_counts[{i}] (key {int(keys[i])}) is {float(counts[i])}, must be finite and "
                    f">= 0{end}"
                )

    @staticmethod
    def _check_range(t: dict, k: str, low: int, key: str, where: str, end: str) -> None:
        bad = np.flatnonzero((t[k] < low) | (t[k] > MAX_COUNT))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"{where} {k}[{i}] (key {int(t[key][i])}) is {int(t[k][i])}, must be in [{low}, {MAX_COUNT}]{end}"
            )

    def _per_shard(self, keys: np.ndarray) -> np.ndarray:
        if self.num_shards == 1:
            return np.array([keys.shape[0]])
        which = shard_of_keys(tf.constant(keys, tf.int64), self.num_shards).numpy()
        return np.bincount(which, minlength=self.num_shards)


# ------------------------------------------------------------------------------------ reading a checkpoint
def data_files(path: str) -> str:
    """The data files of the checkpoint at `path`, for messages."""
    files = sorted(glob.glob(glob.escape(path) + ".data-*-of-*"))
    return ", ".join(files) if files else f"{path}.data-*"


def read_tensor(reader: Any, path: str, key: str, label: str, end: str = "nothing was changed") -> np.ndarray:
    """One tensor of the checkpoint at `path`; a file that cannot be read is `tf.errors.DataLossError` naming the
    data file, `label` (the table) and the tensor (TensorFlow's reader raises IndexError "Read less bytes than
    requested" on a truncated file, or an OpError)."""
    try:
        return reader.get_tensor(key)
    except (IndexError, tf.errors.OpError) as e:
        raise tf.errors.DataLossError(
            None,
            None,
            f"{label}: restore: the checkpoint file {data_files(path)} is truncated or corrupt: cannot read "
            f"{key!r} ({type(e).__name__}: {getattr(e, 'message', e)}); {end}",
        ) from None


def check_data_files(path: str, reader: Any, label: str, end: str = "nothing was changed") -> None:
    """The data files must hold at least the bytes of every fixed-size tensor the index lists: a cheap test that
    catches a truncated file before any tensor is read.

    Raises:
      tf.errors.DataLossError: naming the data files and `label` (the table or tables).
    """
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    need = 0
    for key, shape in shapes.items():
        dtype = tf.as_dtype(dtypes[key])
        if dtype != tf.string:
            need += dtype.size * int(np.prod(shape, dtype=np.int64))
    have = sum(os.path.getsize(f) for f in glob.glob(glob.escape(path) + ".data-*-of-*"))
    if have < need:
        raise tf.errors.DataLossError(
            None,
            None,
            f"{label}: restore: the checkpoint file {data_files(path)} is truncated: it holds {have} bytes, the "
            f"checkpoint's index lists {need} bytes of tensors; {end}",
        )


def calling_position(trackable: Any) -> Any:
    """The `CheckpointPosition` TensorFlow is restoring `trackable` from: a local of the frame that called
    `_checkpoint_adapter` (`restore._maybe_get_adapter`, TF 2.16 - 2.21), which the hook is not given. None when
    not found. Call it from the hook, or from a function the hook calls (it looks up to four frames above its
    caller)."""
    frame = inspect.currentframe()  # this function's frame: its first `f_back` is the caller's
    frame = frame.f_back if frame is not None else None
    for _ in range(4):
        frame = frame.f_back if frame is not None else None
        if frame is None:
            return None
        position = frame.f_locals.get("checkpoint_position")
        if position is not None and getattr(position, "trackable", None) is trackable:
            return position
    return None


def signature(path: str) -> tuple:
    """The checkpoint's files as (name, size, mtime): what a check of them holds for."""
    files = sorted(glob.glob(glob.escape(path) + ".*"))
    return tuple((f, os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files)


# Tables whose part of a checkpoint a parent's check (`te.TPUEmbedding`'s, engine/checkpoint.py) has just read and
# validated whole: their own check of the same unchanged files is skipped (once).
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def mark_checked(table: Any, path: str) -> None:
    """Records that `table`'s part of the checkpoint at `path` passed `TableSpec.validate` (for its own
    `check_restore`, which then does not read it again)."""
    _CHECKED[table] = (path, signature(path))


def check_restore(table: Any, spec: TableSpec, path: str, check_layout: Any = None) -> None:
    """A dynamic table's all-or-nothing restore check, from its `_checkpoint_adapter`: reads the table's tensors
    from the checkpoint at `path` and validates them (`TableSpec.validate`) before TensorFlow restores anything.

    A checkpoint that holds the table streamed (a tiered table's registered saver) is left to that saver's own
    check, and a restore whose position cannot be found to the table's `_restore_from_tensors` checks.
    `check_layout(tensors)`, when given, runs first on tensors that hold weights and slots (the table's own
    message for another dim or slot layout).

    Raises:
      tf.errors.DataLossError: a data file is truncated or corrupt (naming the file and the table).
      ValueError: the tensors do not fit the table (`TableSpec.validate`).
    """
    if _CHECKED.pop(table, None) == (path, signature(path)):
        return
    position = calling_position(table)
    if position is None:
        return
    node = position.object_proto
    if node.HasField("registered_saver") and node.registered_saver.name:
        return
    keys = {a.name: a.checkpoint_key for a in node.attributes}
    if "keys" not in keys:
        return
    label = f"DynamicTable {spec.name!r}"
    try:
        reader = tf.train.load_checkpoint(path)
    except (tf.errors.OpError, ValueError) as e:
        raise tf.errors.DataLossError(
            None, None, f"{label}: restore: cannot open the checkpoint {path} ({e}); nothing was changed"
        ) from None
    check_data_files(path, reader, label)
    shapes = reader.get_variable_to_shape_map()
    tensors = {k: read_tensor(reader, path, key, label) for k, key in keys.items() if key in shapes}
    if check_layout is not None and "weights" in tensors and "slots" in tensors:
        check_layout(tensors)
    spec.validate(tensors, "restore")


def _table_names(root: Any) -> list[str]:
    """The package's tables under `root` (dynamic and tiered tables by `table_name`, a mid-level object's by its
    table configs)."""
    names: set[str] = set()
    for obj in tf.train.TrackableView(root).descendants():
        name = getattr(type(obj), "table_name", None)
        if isinstance(name, property):
            names.add(str(obj.table_name))
        configs = getattr(type(obj), "table_configs", None)
        if isinstance(configs, property):
            names.update(str(t.name) for t in obj.table_configs)
    return sorted(names)


def _unreadable(save_path: Any, root: Any, error: Exception) -> None:
    """TensorFlow's reader failed on the object graph (the last tensor of the data file: any truncation reaches it
    first), before any object was restored: a DataLossError naming the file and the package's tables, when the
    restored object holds some (other restores keep TensorFlow's error)."""
    try:
        names = _table_names(root)
    except Exception:  # naming the tables must never hide TensorFlow's own error: then it goes on
        return
    if not names:
        return
    path = save_path if isinstance(save_path, str) else save_path.numpy().decode()
    raise tf.errors.DataLossError(
        None,
        None,
        f"restore of tables {names}: the checkpoint file {data_files(path)} is truncated or corrupt: TensorFlow "
        f"cannot read its object graph ({type(error).__name__}: {error}); nothing was changed",
    ) from None


_tf_compat.on_unreadable_checkpoint(_unreadable)
