"""`IncrementalCheckpointManager`: a full checkpoint, then deltas of the rows changed since the previous save.

See docs/checkpoints.md for the format, the guarantees and the failure cases.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops import tracking
from tf_embed_ops.checkpoint import _format, _tiered_dynamic
from tf_embed_ops.checkpoint._format import CheckpointError
from tf_embed_ops.tiered.table import TieredTable

__all__ = ["CheckpointError", "IncrementalCheckpointManager"]

_log = logging.getLogger(__name__)


def _as_tf_variable(obj: Any) -> tf.Variable | None:
    if isinstance(obj, tf.Variable):
        return obj
    inner = getattr(obj, "value", None)
    return inner if isinstance(inner, tf.Variable) else None


def _storage(array: np.ndarray) -> tuple[np.ndarray, str]:
    """numpy cannot store bfloat16 in .npz portably: 16-bit floats are written as their uint16 bits."""
    dtype = tf.as_dtype(array.dtype)
    if dtype in (tf.bfloat16, tf.float16):
        return array.view(np.uint16), dtype.name
    return array, dtype.name


def _from_storage(array: np.ndarray, dtype_name: str) -> np.ndarray:
    if dtype_name in ("bfloat16", "float16"):
        return array.view(tf.as_dtype(dtype_name).as_numpy_dtype)
    return array


def _policy_state(table: Any) -> dict:
    """A dynamic table's lifecycle-policy state (Bloom counters, decayed counts), saved whole in each delta:
    the policies change it on every lookup, not per row.  Read through the table's checkpoint tensors, so only
    tables with such a policy pay for it."""
    from tf_embed_ops.dynamic import table as table_lib

    names = table_lib.policy_tensor_names(table.config)
    if not names:
        return {}
    if getattr(table, "tiered", None) is not None:  # its checkpoint tensors would hold every row: the policies' only
        return {k: v.numpy() for k, v in table.export_policy_state().items()}
    tensors = table._serialize_to_tensors()  # noqa: SLF001 - the table's own checkpoint tensors
    return {k: tensors[k].numpy() for k in names}


def _is_tiered_dynamic(obj: Any) -> bool:
    from tf_embed_ops.dynamic import table as table_lib  # pylint: disable=import-outside-toplevel

    return isinstance(obj, table_lib.DynamicTable) and obj.tiered is not None


class _StaticState:
    """One static table (all its shards): its parameters and slots as global-row arrays."""

    def __init__(self, name: str, table: Any):
        self.name = name
        self.table = table  # tracking._StaticTable

    def describe(self) -> dict:
        t = self.table
        variables = {"parameters": t.parameters, **t.slots}
        return {
            "kind": "static",
            "rows": t.num_rows,
            "variables": {k: [int(v[0].shape[1]), v[0].dtype.name] for k, v in variables.items()},
        }

    def restore_rows(self, rows: np.ndarray, values: dict) -> None:
        t = self.table
        for var_name, shards in {"parameters": t.parameters, **t.slots}.items():
            value = values[var_name]
            shard = np.searchsorted(t.offsets, rows, side="right") - 1
            for p, v in enumerate(shards):
                mine = np.nonzero(shard == p)[0]
                if mine.size:
                    with tf.device(v.device):
                        v.scatter_update(
                            tf.IndexedSlices(tf.constant(value[mine], v.dtype), tf.constant(rows[mine] - t.offsets[p]))
                        )


class _TieredState(_StaticState):
    """A static tiered table: described like the same table in memory (a chain moves between the two kinds through
    its full checkpoint), its delta rows written into the tier one run of consecutive rows at a time."""

    def describe(self) -> dict:
        table = self.table.table  # te.tiered.TieredTable
        widths = [table.dim, *table.slot_widths]
        names = ["parameters", *table.slot_names]
        return {
            "kind": "static",
            "rows": table.num_rows,
            "variables": {n: [int(w), d.name] for n, w, d in zip(names, widths, table.dtypes, strict=True)},
        }

    def restore_rows(self, rows: np.ndarray, values: dict) -> None:
        table = self.table.table
        order = np.argsort(rows, kind="stable")
        rows = rows[order]
        values = {k: np.asarray(v)[order].astype(np.float32) for k, v in values.items()}  # 16-bit: exact
        starts = np.concatenate([[0], np.nonzero(np.diff(rows) != 1)[0] + 1, [rows.size]])
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            table.write_rows(int(rows[a]), values["parameters"][a:b], [values[slot][a:b] for slot in table.slot_names])


class IncrementalCheckpointManager:
    """Saves a full checkpoint, then deltas holding only the embedding rows changed since the previous save.

    Everything `checkpoint` tracks is saved: embedding tables (static, 16-bit, sharded, dynamic with keys,
    counts, last steps and admission counters) and their optimizer slots as row deltas; every other variable
    (dense weights, optimizer state, step counters) whole at each save.  A chain is a full checkpoint (written
    by `checkpoint.write`, so it restores through the library's own full-checkpoint paths, into another shard
    count or dynamic capacity) followed by deltas; `manifest.json` lists it with a checksum per file.

    Args:
      checkpoint: a `tf.train.Checkpoint` tracking the model (te.TPUEmbedding objects, Keras models or layers
        holding them, optimizers...).
      directory: where the chain lives (created if needed).
      full_every: every `full_every`-th save is a full checkpoint (1: always full; 0 or None: only the first
        save and `compact()`/`save(full=True)`).
      max_chains: complete chains kept (older ones are deleted after a new full checkpoint is recorded).
      embeddings: the embedding objects to track (default: every one reachable from `checkpoint`).

    Tiered tables (`storage=te.Tiered`, docs/tiered_tables.md) are never whole in memory: a full checkpoint streams
    them (`checkpoint.write`), a delta holds the rows the tracker reports changed, read from the tier, and a tiered
    table changed whole makes the save a full checkpoint. A tiered dynamic table's deltas are applied at restore
    with its keys and metadata merged in memory and its rows written from the full checkpoint one chunk at a time
    and from the deltas (`_tiered_dynamic`).

    Raises:
      ValueError: `checkpoint` tracks no embedding object, reaches a tiered table (static or dynamic) that
        `embeddings` leaves out, or a bad `full_every` / `max_chains`.

    Example:
        >>> ckpt = tf.train.Checkpoint(model=model)
        >>> mgr = te.checkpoint.IncrementalCheckpointManager(ckpt, "/tmp/run", full_every=10)
        >>> mgr.save()        # full, then deltas
        >>> step = mgr.restore()
    """

    def __init__(
        self,
        checkpoint: tf.train.Checkpoint,
        directory: str,
        full_every: int | None = 10,
        max_chains: int = 2,
        embeddings: Any = None,
    ):
        if full_every is not None and int(full_every) < 0:
            raise ValueError(f"full_every must be >= 0 (or None), got {full_every}")
        if int(max_chains) < 1:
            raise ValueError(f"max_chains must be >= 1, got {max_chains}")
        self._checkpoint = checkpoint
        self._directory = os.fspath(directory)
        self._full_every = int(full_every or 0)
        self._max_chains = int(max_chains)
        descendants = tf.train.TrackableView(checkpoint).descendants()
        who = "te.checkpoint.IncrementalCheckpointManager"
        self._tracker = tracking.Tracker(embeddings if embeddings is not None else descendants)
        self._tables = {}
        embedding_vars = set()
        tiered: list = []
        for name in self._tracker.table_names:
            table = self._tracker._table(name)  # noqa: SLF001 - the tracker's own per-table view
            if isinstance(table, tracking._TieredTable):  # noqa: SLF001 - the tracker's own per-table view
                self._tables[name] = _TieredState(name, table)
                tiered.append(table.table)
            elif self._tracker.kind(name) == "static":
                self._tables[name] = _StaticState(name, table)
                for shards in [table.parameters, *table.slots.values()]:
                    embedding_vars.update(id(v) for v in shards)
            else:
                self._tables[name] = table
                if table.tiered:
                    tiered.append(table.table)
        self._embedding_vars = embedding_vars
        # A tiered table the checkpoint reaches but the tracker does not: a delta would lack its changes.
        tiered_objects = [d for d in descendants if isinstance(d, TieredTable) or _is_tiered_dynamic(d)]
        untracked = [d.table_name for d in tiered_objects if all(d is not t for t in tiered)]
        if untracked:
            raise ValueError(
                f"{who}: table(s) {', '.join(map(repr, untracked))} are tiered (storage=te.Tiered) and in the "
                "checkpoint but not in `embeddings`: a delta would lack their changes; track their embedding too"
            )
        os.makedirs(self._directory, exist_ok=True)
        self._model_id = self._fingerprint()
        self._dense = self._dense_variables()
        self._cursor = None
        self._manifest = _format.read_manifest(self._directory) or {"chain": [], "model_id": self._model_id}

    def _dense_variables(self) -> dict:
        """Every variable the checkpoint reaches other than the tables and slots, by object path (looked up at
        each save and restore: a Keras optimizer creates its variables on its first step), and each tiered table's
        rounding step."""
        descendants, paths = tf.train.TrackableView(self._checkpoint)._descendants_with_paths()  # noqa: SLF001
        dense = {}
        for obj in descendants:
            var = _as_tf_variable(obj)
            if var is None or id(var) in self._embedding_vars:
                continue
            dense.setdefault("/".join(ref.name for ref in paths[obj]), var)
        for name, state in self._tables.items():
            if isinstance(state, _TieredState):
                # A tiered table's rounding step is saved by its streamed saver, not as a checkpoint variable: each
                # delta carries it, as it carries an in-memory embedding's `rounding_step`.
                dense[f"tiered_table_step/{name}"] = state.table.table.step
        return dense

    # ------------------------------------------------------------------------------------------ properties
    @property
    def directory(self) -> str:
        return self._directory

    @property
    def chain(self) -> list[dict]:
        """The manifest's entries, oldest first: {"name", "kind" ("full"/"delta"), "step", "bytes", ...}."""
        return [dict(e) for e in self._manifest["chain"]]

    @property
    def latest_checkpoint(self) -> str | None:
        """`<directory>/ckpt-<step>` of the newest save (the name `te.distribute.fit` reads the epoch from)."""
        chain = self._manifest["chain"]
        return os.path.join(self._directory, chain[-1]["name"]) if chain else None

    # ------------------------------------------------------------------------------------------ save
    def save(self, checkpoint_number: int | None = None, full: bool | None = None) -> str:
        """Saves the model: a delta of the rows changed since the previous save, or a full checkpoint.

        A full checkpoint is written on the first save of this manager (it has no cursor into the chain yet,
        unless `restore` gave it one), every `full_every` saves, or when `full=True`.

        Args:
          checkpoint_number: the step recorded (default: the previous one + 1).
          full: force a full checkpoint (True) or leave the policy (None).

        Returns:
          The saved entry's path, `<directory>/ckpt-<number>`.
        """
        chain = self._manifest["chain"]
        number = int(checkpoint_number) if checkpoint_number is not None else (chain[-1]["step"] + 1 if chain else 1)
        deltas_since_full = 0
        for e in reversed(chain):
            if e["kind"] == "full":
                break
            deltas_since_full += 1
        want_full = (
            bool(full)
            or self._cursor is None
            or not chain
            or (self._full_every > 0 and deltas_since_full + 1 >= self._full_every)
        )
        name = f"ckpt-{number}"
        if any(e["name"] == name for e in chain):
            raise ValueError(f"checkpoint number {number} is already in the chain of {self._directory}")
        self._clean_orphans()
        changes = None
        if not want_full:
            changes = self._tracker.changed_since(self._cursor)
            # A tiered table changed whole (non-lazy optimizer, restore) or every row of it changed one by one: a
            # full checkpoint streams it from the tier, where a delta would hold every row in memory.
            want_full = any(self._is_tiered(n) and self._whole(n, ch) for n, ch in changes.tables.items())
        if want_full:
            entry = self._save_full(name, number)
        else:
            entry = self._save_delta(name, number, chain[-1]["name"], changes)
        chain = [*chain, entry]
        if want_full:
            chain = self._drop_old_chains(chain)
        self._manifest = {"chain": chain, "model_id": self._model_id}
        _format.write_manifest(self._directory, self._manifest)
        self._delete_unlisted()
        return os.path.join(self._directory, name)

    def _is_tiered(self, name: str) -> bool:
        state = self._tables[name]
        return isinstance(state, _TieredState) or bool(getattr(state, "tiered", False))

    def _whole(self, name: str, changes: Any) -> bool:
        """The table changed whole: `full` (a restore, non-lazy Adam, `mark_all`), or every row of a static table
        listed (training or row writes reached them all; a delta of them would be the table)."""
        state = self._tables[name]
        return bool(changes.full) or (isinstance(state, _StaticState) and changes.rows.size >= state.table.num_rows)

    def compact(self) -> str:
        """Folds the chain into a new full checkpoint of the current state (training may continue afterwards);
        chains older than `max_chains` are deleted.  Returns its path."""
        return self.save(full=True)

    def _save_full(self, name: str, number: int) -> dict:
        cursor = self._tracker.cursor()  # before reading: a concurrent step repeats rows, never loses them
        final = os.path.join(self._directory, f"{name}.full")
        tmp = f"{final}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        self._checkpoint.write(os.path.join(tmp, "ckpt"))
        files = _format.checksum_tree(tmp)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        self._cursor = cursor
        size = sum(os.path.getsize(os.path.join(final, f)) for f in files)
        return {"name": name, "kind": "full", "step": number, "files": files, "bytes": size}

    def _save_delta(self, name: str, number: int, parent: str, changes: Any) -> dict:
        arrays: dict = {}
        tables: dict = {}
        for table_name, ch in changes.tables.items():
            state = self._tables[table_name]
            if isinstance(state, _StaticState):
                values = self._tracker.read_rows(table_name, ch.rows)
                arrays[f"static/{table_name}/rows"] = ch.rows
                dtypes = {}
                for var_name, value in values.items():
                    arrays[f"static/{table_name}/{var_name}"], dtypes[var_name] = _storage(value)
                tables[table_name] = {
                    "kind": "static",
                    "full": bool(ch.full),
                    "dtypes": dtypes,
                    "rows": int(ch.rows.size),
                }
            else:
                for k, v in ch.contents.items():
                    arrays[f"dynamic/{table_name}/{k}"] = v
                arrays[f"dynamic/{table_name}/evicted"] = ch.evicted
                for k, v in _policy_state(state.table).items():
                    arrays[f"dynamic/{table_name}/policy/{k}"] = v
                arrays[f"dynamic/{table_name}/step"] = np.asarray([int(s.step.numpy()) for s in state.shards], np.int64)
                tables[table_name] = {"kind": "dynamic", "full": bool(ch.full), "rows": int(ch.rows.size)}
        dense_dtypes = {}
        self._dense = self._dense_variables()
        for path, var in self._dense.items():
            arrays[f"dense/{path}"], dense_dtypes[path] = _storage(np.asarray(var.numpy()))
        header = {
            "format": _format.FORMAT,
            "format_version": _format.FORMAT_VERSION,
            "model_id": self._model_id,
            "name": name,
            "parent": parent,
            "step": number,
            "tables": tables,
            "dense": dense_dtypes,
        }
        path = os.path.join(self._directory, f"{name}.delta")
        digest, size = _format.write_delta(path, header, arrays)
        self._cursor = changes.cursor
        return {"name": name, "kind": "delta", "step": number, "sha256": digest, "bytes": size, "parent": parent}

    def _drop_old_chains(self, chain: list) -> list:
        starts = [i for i, e in enumerate(chain) if e["kind"] == "full"]
        if len(starts) <= self._max_chains:
            return chain
        return chain[starts[-self._max_chains] :]

    def _entry_paths(self, entry: dict) -> str:
        suffix = ".full" if entry["kind"] == "full" else ".delta"
        return os.path.join(self._directory, entry["name"] + suffix)

    def _delete_unlisted(self) -> None:
        listed = {os.path.basename(self._entry_paths(e)) for e in self._manifest["chain"]}
        for name in os.listdir(self._directory):
            if (name.endswith(".full") or name.endswith(".delta")) and name not in listed:
                path = os.path.join(self._directory, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    def _clean_orphans(self) -> None:
        """Temporary files of a save that was killed (never listed by a manifest)."""
        for name in os.listdir(self._directory):
            if ".tmp-" in name:
                path = os.path.join(self._directory, name)
                shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)

    # ------------------------------------------------------------------------------------------ restore
    def restore_or_initialize(self) -> int | None:
        """Restores the newest chain if there is one (`restore()`), else does nothing; returns the step or None."""
        return self.restore() if self._manifest["chain"] else None

    def restore(self, allow_partial: bool = False) -> int:
        """Restores the newest full checkpoint and every delta after it; returns the step restored.

        Everything is read and validated (checksums, chain links, model layout, shapes) before any variable or
        table changes.  The result is bit-identical to a full save taken at the same step.

        Args:
          allow_partial: on a bad or missing delta, restore the longest valid prefix of the chain (logged, with
            the step) instead of raising.

        Returns:
          The step of the last entry restored.

        Raises:
          CheckpointError: no checkpoint, a missing / truncated / corrupted file, a broken chain, or a delta of
            another model (the message names the file); with `allow_partial`, only when not even the full
            checkpoint is valid.
        """
        manifest = _format.read_manifest(self._directory)
        if manifest is None or not manifest.get("chain"):
            raise CheckpointError(f"{self._directory}: no incremental checkpoint (no {_format.MANIFEST})")
        if manifest.get("model_id") != self._model_id:
            raise CheckpointError(
                f"{os.path.join(self._directory, _format.MANIFEST)}: written for another model (table layout "
                f"{manifest.get('model_id')!r}, this model's is {self._model_id!r})"
            )
        chain = manifest["chain"]
        self._dense = self._dense_variables()
        base = max(i for i, e in enumerate(chain) if e["kind"] == "full")
        full_entry = chain[base]
        full_dir = self._entry_paths(full_entry)
        _format.verify_tree(full_dir, full_entry["files"])
        deltas, restored = [], [full_entry]
        for entry in chain[base + 1 :]:
            try:
                header, arrays = _format.read_delta(self._entry_paths(entry), entry["sha256"])
                self._check_delta(self._entry_paths(entry), header, arrays, restored[-1]["name"])
            except CheckpointError as e:
                if not allow_partial:
                    raise
                _log.warning(
                    "incremental checkpoint: %s; restoring the valid prefix up to step %d", e, restored[-1]["step"]
                )
                break
            deltas.append((header, arrays))
            restored.append(entry)
        tiered = self._tiered_dynamic_restores(os.path.join(full_dir, "ckpt"), deltas)
        # Validated: now change state.
        status = self._checkpoint.read(os.path.join(full_dir, "ckpt"))
        status.expect_partial()
        self._apply_deltas(deltas, tiered)
        self._tracker.mark_all()  # every consumer (publishers too) must take the restored tables whole
        self._cursor = self._tracker.cursor()
        self._manifest = {"chain": chain[: base + len(restored)], "model_id": self._model_id}
        if len(self._manifest["chain"]) != len(chain):
            _format.write_manifest(self._directory, self._manifest)  # later saves continue the valid prefix
        return int(restored[-1]["step"])

    def _check_delta(self, path: str, header: dict, arrays: dict, parent: str) -> None:
        if header.get("model_id") != self._model_id:
            raise CheckpointError(
                f"{path}: a delta of another model (table layout {header.get('model_id')!r}, expected "
                f"{self._model_id!r})"
            )
        if header.get("parent") != parent:
            raise CheckpointError(f"{path}: follows {header.get('parent')!r}, but the chain has {parent!r} before it")
        for name, info in header["tables"].items():
            state = self._tables.get(name)
            if state is None or info["kind"] != ("static" if isinstance(state, _StaticState) else "dynamic"):
                raise CheckpointError(f"{path}: table {name!r} is not a table of this model")
            if isinstance(state, _StaticState):
                rows = arrays[f"static/{name}/rows"]
                if rows.size and (rows.min() < 0 or rows.max() >= state.table.num_rows):
                    raise CheckpointError(f"{path}: table {name!r} has rows outside [0, {state.table.num_rows})")
                desc = state.describe()["variables"]
                for var_name, (width, _) in desc.items():
                    value = arrays.get(f"static/{name}/{var_name}")
                    if value is None or value.shape != (rows.size, width):
                        raise CheckpointError(f"{path}: table {name!r} variable {var_name!r} has the wrong shape")
        for path_name, var in self._dense.items():
            value = arrays.get(f"dense/{path_name}")
            if value is not None and tuple(value.shape) != tuple(var.shape):
                raise CheckpointError(
                    f"{path}: dense variable {path_name!r} has shape {value.shape}, the model's is {tuple(var.shape)}"
                )

    def _tiered_dynamic_restores(self, prefix: str, deltas: list) -> dict:
        """{table name: `_tiered_dynamic.TieredDynamicRestore`} of the tiered dynamic tables whose full checkpoint
        is streamed (one saved from the table in memory is merged as in memory: it fit), checked; {} without
        deltas."""
        names = [n for n, s in self._tables.items() if not isinstance(s, _StaticState) and s.tiered]
        if not deltas or not names:
            return {}
        descendants, paths = tf.train.TrackableView(self._checkpoint)._descendants_with_paths()  # noqa: SLF001
        reader = tf.train.load_checkpoint(prefix)
        out = {}
        for name in names:
            table = self._tables[name].table
            found = [d for d in descendants if d is table]
            object_name = "/".join(ref.name for ref in paths[found[0]]) if found else None
            if object_name is not None and _tiered_dynamic.is_streamed(reader, object_name):
                out[name] = _tiered_dynamic.TieredDynamicRestore(name, table, object_name, prefix, reader, deltas)
        return out

    def _apply_deltas(self, deltas: list, tiered: dict | None = None) -> None:
        if not deltas:
            return
        tiered = tiered or {}
        for name, state in self._tables.items():
            if isinstance(state, _StaticState):
                rows, values = None, {}
                for header, arrays in deltas:  # later deltas win: keep the last value of each row
                    info = header["tables"][name]
                    r = arrays[f"static/{name}/rows"]
                    v = {k: _from_storage(arrays[f"static/{name}/{k}"], d) for k, d in info["dtypes"].items()}
                    if rows is None:
                        rows, values = r, v
                    else:
                        keep = ~np.isin(rows, r)
                        rows = np.concatenate([rows[keep], r])
                        values = {k: np.concatenate([values[k][keep], v[k]]) for k in values}
                if rows is not None and rows.size:
                    state.restore_rows(rows, values)
            elif name in tiered:
                tiered[name].apply()  # a tiered dynamic table: its rows a chunk at a time
            else:
                self._apply_dynamic(name, state, deltas)
        header, arrays = deltas[-1]
        for path, var in self._dense.items():
            if path in header["dense"]:
                var.assign(_from_storage(arrays[f"dense/{path}"], header["dense"][path]))
        missing = sorted(set(header["dense"]) - set(self._dense))
        if missing:
            # Not created yet (e.g. a Keras optimizer before its first step): they keep the full checkpoint's
            # values, restored when created.  Build them before restoring to get the delta's.
            _log.warning(
                "incremental checkpoint: %d variables of %s do not exist yet and keep the full checkpoint's values: %s",
                len(missing),
                header["name"],
                ", ".join(missing[:5]),
            )

    def _apply_dynamic(self, name: str, state: Any, deltas: list) -> None:
        table = state.table
        content = {k: v.numpy() for k, v in table.export().items()}
        keys = ("keys", "weights", "slots", "counts", "last_steps")
        pending = ("pending_keys", "pending_counts", "pending_last_steps")
        step = None
        for header, arrays in deltas:
            d = {k: arrays[f"dynamic/{name}/{k}"] for k in keys + pending}
            if header["tables"][name]["full"]:
                content = dict(d)
            else:
                drop = np.isin(content["keys"], np.concatenate([arrays[f"dynamic/{name}/evicted"], d["keys"]]))
                for k in keys:
                    content[k] = np.concatenate([content[k][~drop], d[k]])
                order = np.argsort(content["keys"], kind="stable")
                for k in keys:
                    content[k] = content[k][order]
                for k in pending:
                    content[k] = d[k]
            step = int(arrays[f"dynamic/{name}/step"].max())
        tensors = {k: tf.constant(v) for k, v in content.items()}
        tensors["step"] = tf.constant(step, tf.int64)
        prefix = f"dynamic/{name}/policy/"
        tensors.update({k[len(prefix) :]: tf.constant(v) for k, v in arrays.items() if k.startswith(prefix)})
        # The full-checkpoint restore path: resharding by key and capacity growth included.
        table._restore_from_tensors(tensors)  # noqa: SLF001

    # ------------------------------------------------------------------------------------------ identity
    def _fingerprint(self) -> str:
        """A digest of the table layout (names, kinds, sizes, widths, dtypes): deltas of another model are
        refused (the other variables are checked one by one, by path and shape)."""
        desc = {}
        for name, state in self._tables.items():
            if isinstance(state, _StaticState):
                desc[name] = state.describe()
            else:
                shard = state.shards[0]
                desc[name] = {"kind": "dynamic", "dim": shard.dim, "slot_widths": list(shard.slot_widths)}
        return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]
