"""`IncrementalCheckpointManager`: a full checkpoint, then deltas of the rows changed since the previous save.

See docs/checkpoints.md for the format, the guarantees and the failure cases.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops import _tf_compat, tracking
from tf_embed_ops.checkpoint import _format
from tf_embed_ops.checkpoint._format import CheckpointError
from tf_embed_ops.embedding_ops import checked_int
from tf_embed_ops.formats import atomic_write, delta_arrays

__all__ = ["CheckpointError", "IncrementalCheckpointManager"]

_log = logging.getLogger(__name__)


def _as_tf_variable(obj: Any) -> tf.Variable | None:
    if isinstance(obj, tf.Variable):
        return obj
    inner = getattr(obj, "value", None)
    return inner if isinstance(inner, tf.Variable) else None


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
    and from the deltas.

    What a chain holds of each table, and how a delta of it is written, checked and restored, is the table's kind's
    (`backends.protocol.ChainState`, which each table's group makes: `TableGroup.chain_state`).

    Thread safety: `save`, `compact` and `restore` may be called from several threads (while others train): the
    calls on one manager run one at a time (a lock), each numbering its checkpoint after the previous one's. One
    manager per directory: two managers (or processes) writing one directory are not supported.

    Raises:
      ValueError: `checkpoint` tracks no embedding object, reaches a tiered table (static or dynamic) that
        `embeddings` leaves out, or a bad `full_every` / `max_chains` (not an integer, or out of range; named).

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
        who = "te.checkpoint.IncrementalCheckpointManager"
        full_every = 0 if full_every is None else checked_int(full_every, f"{who}: full_every", 0)
        max_chains = checked_int(max_chains, f"{who}: max_chains", 1)
        self._checkpoint = checkpoint
        self._directory = os.fspath(directory)
        self._full_every = full_every
        self._max_chains = max_chains
        self._lock = threading.RLock()  # save / restore: one at a time (see the class docstring)
        descendants = tf.train.TrackableView(checkpoint).descendants()
        self._tracker = tracking.Tracker(embeddings if embeddings is not None else descendants)
        self._tables = {}
        for name in self._tracker.table_names:
            group, config = self._tracker.source(name)
            self._tables[name] = group.chain_state(config, self._tracker.table(name))
        self._embedding_vars = {id(v) for state in self._tables.values() for v in state.variables()}
        # A tiered table the checkpoint reaches but the tracker does not: a delta would lack its changes.
        streamed = [state.table for state in self._tables.values() if state.streamed]
        untracked = [
            d.table_name
            for d in descendants
            if getattr(d, "streams_checkpoint", False) and all(d is not t for t in streamed)
        ]
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
        descendants, paths = _tf_compat.checkpoint_descendants(self._checkpoint)
        dense = {}
        for obj in descendants:
            var = _as_tf_variable(obj)
            if var is None or id(var) in self._embedding_vars:
                continue
            dense.setdefault("/".join(ref.name for ref in paths[obj]), var)
        for state in self._tables.values():
            dense.update(state.dense_variables())
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

        Safe to call from several threads: saves run one at a time, each after the previous one's number.

        Args:
          checkpoint_number: the step recorded, an integer >= 0 above the newest entry's (default: the newest
            entry's + 1).
          full: force a full checkpoint (True) or leave the policy (None or False).

        Returns:
          The saved entry's path, `<directory>/ckpt-<number>`.

        Raises:
          ValueError: a `checkpoint_number` that is not an integer, is negative or not above the newest entry's, or
            a `full` that is not a bool; nothing is written.
          tf.errors.ResourceExhaustedError: the disk is full (naming the file); OSError: another write failure
            (naming the file). Nothing is listed, no temporary is left, and the next save writes what this one
            would have.
        """
        if full is not None and not isinstance(full, (bool, np.bool_)):
            raise ValueError(f"save: full must be True, False or None, got {full!r}")
        with self._lock:
            return self._save(checkpoint_number, full)

    def _save(self, checkpoint_number: Any, full: bool | None) -> str:
        chain = self._manifest["chain"]
        newest = int(chain[-1]["step"]) if chain else None
        if checkpoint_number is None:
            number = newest + 1 if newest is not None else 1
        else:
            number = checked_int(checkpoint_number, "save: checkpoint_number", 0 if newest is None else newest + 1)
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
            raise ValueError(f"save: checkpoint_number {number} is already in the chain of {self._directory}")
        self._clean_orphans()
        changes = None
        if not want_full:
            changes = self._tracker.changed_since(self._cursor)
            # A tiered table changed whole (non-lazy optimizer, restore) or every row of it changed one by one: a
            # full checkpoint streams it from the tier, where a delta would hold every row in memory.
            want_full = any(self._tables[n].streamed and self._tables[n].whole(ch) for n, ch in changes.tables.items())
        if want_full:
            entry, cursor = self._save_full(name, number)
        else:
            entry, cursor = self._save_delta(name, number, chain[-1], changes)
        chain = [*chain, entry]
        if want_full:
            chain = self._drop_old_chains(chain)
        manifest = {"chain": chain, "model_id": self._model_id}
        _format.write_manifest(self._directory, manifest)
        # Listed: only now may the next delta start from this save (a failed write must not lose its rows).
        self._manifest, self._cursor = manifest, cursor
        self._delete_unlisted()
        return os.path.join(self._directory, name)

    def compact(self) -> str:
        """Folds the chain into a new full checkpoint of the current state (training may continue afterwards);
        chains older than `max_chains` are deleted.  Returns its path."""
        return self.save(full=True)

    def _save_full(self, name: str, number: int) -> tuple[dict, Any]:
        """Writes a full checkpoint; returns its manifest entry and the tracker cursor taken before it."""
        cursor = self._tracker.cursor()  # before reading: a concurrent step repeats rows, never loses them
        final = os.path.join(self._directory, f"{name}.full")

        def fill(tmp: str) -> dict:
            self._checkpoint.write(os.path.join(tmp, "ckpt"))
            return _format.checksum_tree(tmp)

        # An unlisted `<name>.full` (of a save killed after its rename) is replaced.
        files = atomic_write.write_directory(final, fill, replace=True)
        size = sum(os.path.getsize(os.path.join(final, f)) for f in files)
        return {"name": name, "kind": "full", "step": number, "files": files, "bytes": size}, cursor

    def _save_delta(self, name: str, number: int, parent_entry: dict, changes: Any) -> tuple[dict, Any]:
        """Writes a delta after `parent_entry`; returns its manifest entry and the cursor of `changes`."""
        parent = parent_entry["name"]
        arrays: dict = {}
        tables: dict = {}
        for table_name, ch in changes.tables.items():
            table_arrays, tables[table_name] = self._tables[table_name].delta(ch)
            arrays.update(table_arrays)
        dense_dtypes = {}
        self._dense = self._dense_variables()
        for path, var in self._dense.items():
            arrays[f"dense/{path}"], dense_dtypes[path] = delta_arrays.storage(np.asarray(var.numpy()))
        header = {
            "format": _format.FORMAT,
            "format_version": _format.FORMAT_VERSION,
            "model_id": self._model_id,
            "name": name,
            "parent": parent,
            "parent_sha256": _format.entry_digest(parent_entry),
            "step": number,
            "tables": tables,
            "dense": dense_dtypes,
        }
        path = os.path.join(self._directory, f"{name}.delta")
        digest, size = _format.write_delta(path, header, arrays)
        entry = {"name": name, "kind": "delta", "step": number, "sha256": digest, "bytes": size, "parent": parent}
        return entry, changes.cursor

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
        atomic_write.remove_temporaries(self._directory)

    # ------------------------------------------------------------------------------------------ restore
    def restore_or_initialize(self) -> int | None:
        """Restores the newest chain if there is one (`restore()`), else does nothing; returns the step or None."""
        with self._lock:
            return self.restore() if self._manifest["chain"] else None

    def restore(self, allow_partial: bool = False) -> int:
        """Restores the newest full checkpoint and every delta after it; returns the step restored.

        Everything is read and validated before any variable or table changes: checksums, chain links (each delta's
        parent by name and by content), model layout, and every part of every delta (each table's arrays, their
        shapes and dtypes, a dynamic table's merged content against its `max_rows`, dim, slots and lifecycle-policy
        state, the dense variables). The result is bit-identical to a full save taken at the same step.

        Args:
          allow_partial: on a bad or missing delta, restore the longest valid prefix of the chain (logged, with
            the step) instead of raising.

        Returns:
          The step of the last entry restored.

        Raises:
          CheckpointError: no checkpoint, a missing / truncated / corrupted file (naming the file and the tables it
            holds), a broken chain, a delta of another model or another run, or a delta that does not fit the
            model (naming the file and the table); with `allow_partial`, only when not even the full checkpoint is
            valid. Nothing has changed.
        """
        with self._lock:
            return self._restore(bool(allow_partial))

    def _restore(self, allow_partial: bool) -> int:
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
        holds = "tables " + ", ".join(map(repr, self._tables))
        _format.verify_tree(full_dir, full_entry["files"], holds)
        prefix = os.path.join(full_dir, "ckpt")
        deltas, restored = [], [full_entry]
        for entry in chain[base + 1 :]:
            try:
                path = self._entry_paths(entry)
                header, arrays = _format.read_delta(path, entry["sha256"], holds)
                self._check_delta(path, header, arrays, restored[-1])
            except CheckpointError as e:
                if not allow_partial:
                    raise
                _log.warning(
                    "incremental checkpoint: %s; restoring the valid prefix up to step %d", e, restored[-1]["step"]
                )
                break
            deltas.append((header, arrays))
            restored.append(entry)
        plans = self._restore_plans(prefix, deltas)
        # Validated: now change state.
        status = self._checkpoint.read(prefix)
        status.expect_partial()
        self._apply_deltas(deltas, plans)
        self._tracker.mark_all()  # every consumer (publishers too) must take the restored tables whole
        self._cursor = self._tracker.cursor()
        self._manifest = {"chain": chain[: base + len(restored)], "model_id": self._model_id}
        if len(self._manifest["chain"]) != len(chain):
            _format.write_manifest(self._directory, self._manifest)  # later saves continue the valid prefix
        return int(restored[-1]["step"])

    def _check_delta(self, path: str, header: dict, arrays: dict, parent: dict) -> None:
        """Every part of a delta against the model (before anything is written); CheckpointError naming the file,
        the table or variable, and what is wrong."""
        if header.get("model_id") != self._model_id:
            raise CheckpointError(
                f"{path}: a delta of another model (table layout {header.get('model_id')!r}, expected "
                f"{self._model_id!r})"
            )
        _format.check_link(path, header, parent)
        tables = header.get("tables")
        if not isinstance(tables, dict) or set(tables) != set(self._tables):
            got = sorted(tables) if isinstance(tables, dict) else tables
            raise CheckpointError(f"{path}: holds tables {got}, this model has {sorted(self._tables)}")
        for name, info in tables.items():
            state = self._tables[name]
            if info.get("kind") != state.delta_kind:
                raise CheckpointError(f"{path}: table {name!r} is not a table of this model")
            try:
                state.check_delta(path, info, arrays)
            except ValueError as e:
                raise CheckpointError(str(e)) from None
        dense = header.get("dense")
        if not isinstance(dense, dict):
            raise CheckpointError(f"{path}: malformed header (no dense variables)")
        for path_name, var in self._dense.items():
            if path_name not in dense:
                continue
            value = arrays.get(f"dense/{path_name}")
            if value is None:
                raise CheckpointError(f"{path}: dense variable {path_name!r} is listed but not stored")
            if tuple(value.shape) != tuple(var.shape):
                raise CheckpointError(
                    f"{path}: dense variable {path_name!r} has shape {value.shape}, the model's is {tuple(var.shape)}"
                )
            if dense[path_name] != var.dtype.name or value.dtype != delta_arrays.stored_dtype(var.dtype.name):
                raise CheckpointError(
                    f"{path}: dense variable {path_name!r} is {dense[path_name]} ({value.dtype} stored), the model's "
                    f"is {var.dtype.name}"
                )

    def _restore_plans(self, prefix: str, deltas: list) -> dict:
        """{table name: its restore plan (`ChainState.plan_restore`: checked, written by `apply()`)}; {} without
        deltas."""
        if not deltas:
            return {}
        reader = tf.train.load_checkpoint(prefix)
        plans = {}
        for name, state in self._tables.items():
            object_name = self._object_name(state.table) if state.table is not None else None
            try:
                plans[name] = state.plan_restore(deltas, prefix, reader, object_name)
            except ValueError as e:
                raise CheckpointError(str(e)) from None
        return plans

    def _object_name(self, obj: Any) -> str | None:
        """`obj`'s object path in the checkpoint (the prefix of its checkpoint keys), or None if unreachable."""
        descendants, paths = _tf_compat.checkpoint_descendants(self._checkpoint)
        found = [d for d in descendants if d is obj]
        return "/".join(ref.name for ref in paths[found[0]]) if found else None

    def _apply_deltas(self, deltas: list, plans: dict) -> None:
        if not deltas:
            return
        for plan in plans.values():
            plan.apply()
        header, arrays = deltas[-1]
        for path, var in self._dense.items():
            if path in header["dense"]:
                var.assign(delta_arrays.from_storage(arrays[f"dense/{path}"], header["dense"][path]))
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

    # ------------------------------------------------------------------------------------------ identity
    def _fingerprint(self) -> str:
        """A digest of the table layout (names, kinds, sizes, widths, dtypes): deltas of another model are
        refused (the other variables are checked one by one, by path and shape)."""
        desc = {}
        for name, state in self._tables.items():
            desc[name] = state.describe()
        return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]
