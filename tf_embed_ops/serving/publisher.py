"""`te.serving.Publisher`: a training job's tables to a live servable, as a chain of full versions and deltas.

The directory a publisher writes (docs/serving.md):

    <directory>/MANIFEST.json        the chain: model id, layout, one entry per version (kind, file, bytes, checksum)
    <directory>/<version>/           a full version: a SavedModel (`servable.Servable`), TensorFlow Serving's layout
    <directory>/deltas/<version>.delta   a delta (`delta_format`) that turns version base into version

Every file is written by `tf_embed_ops.formats.atomic_write` (a temporary name, synced and renamed), and the
manifest is replaced last: a publish killed at any point leaves the previous versions and the manifest as they were
(a renamed but unlisted version is complete, and simply not part of the chain; the next publish takes a higher
number). A publish that fails (a full disk) removes its temporary and raises an error naming the file.

Example:
    >>> pub = te.serving.Publisher(model, "/srv/ctr", input_signature=spec, dense_every=10)
    >>> pub.publish_full()     # 1
    >>> model.fit(...)
    >>> pub.publish_delta()    # 2: the rows fit touched since version 1
"""

from __future__ import annotations

import json
import math
import numbers
import os
import threading
import time
import uuid
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops.dynamic import ops as dynamic_ops
from tf_embed_ops.embedding_ops import checked_int
from tf_embed_ops.formats import atomic_write
from tf_embed_ops.serving import delta_format as fmt
from tf_embed_ops.serving import servable as servable_lib
from tf_embed_ops.serving import streamed as streamed_lib

__all__ = ["MANIFEST", "Publisher", "read_manifest"]

MANIFEST = "MANIFEST.json"
DELTAS = "deltas"
MANIFEST_FORMAT = 1


def read_manifest(directory: str) -> dict | None:
    """The chain's manifest, or None when the directory has none yet.

    Raises:
      ValueError: a manifest that is not JSON, or not a publisher's manifest (an object with a `chain` list of
        entries, each with an integer `version` and a `kind`), naming the file.
    """
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable manifest ({e}); restore it or publish into another directory") from e
    chain = manifest.get("chain") if isinstance(manifest, dict) else None
    entries_ok = isinstance(chain, list) and all(
        isinstance(e, dict)
        and isinstance(e.get("version"), int)
        and not isinstance(e.get("version"), bool)
        and e.get("kind") in ("full", "delta")
        for e in chain
    )
    if not entries_ok or not isinstance(manifest.get("model_id", ""), str):
        raise ValueError(
            f"{path}: not a te.serving.Publisher manifest (an object with a model_id and a chain of entries "
            f"with an integer version and a kind, got {json.dumps(manifest)[:80]})"
        )
    return manifest


def _write_json_atomically(path: str, value: Any) -> None:
    atomic_write.write_file(path, json.dumps(value, indent=1).encode())


def _embedding_layers(model: Any) -> list:
    from tf_embed_ops.keras.layer import TPUEmbedding  # pylint: disable=import-outside-toplevel

    if isinstance(model, TPUEmbedding):
        return [model]
    flatten = getattr(model, "_flatten_layers", None)
    layers = list(flatten(include_self=True)) if flatten else list(getattr(model, "layers", []))
    found = [layer for layer in layers if isinstance(layer, TPUEmbedding)]
    sharded = [type(layer).__name__ for layer in layers if type(layer).__name__ == "ShardedEmbeddingLayer"]
    if sharded:
        raise ValueError(
            "model_or_layer: tables sharded over parameter servers (te.distribute's ShardedEmbeddingLayer) are not "
            "published by te.serving.Publisher yet; restore the checkpoint into a single-host model "
            "(the checkpoint keys are the same) and publish that"
        )
    if not found:
        raise ValueError(f"model_or_layer: {type(model).__name__} holds no tf_embed_ops.keras.TPUEmbedding layer")
    return found


class Publisher:
    """Publishes a model's servable versions into `directory`: full SavedModels and deltas of touched rows.

    Args:
      model_or_layer: a Keras model holding `tf_embed_ops.keras.TPUEmbedding` layers, or such a layer.
      directory: where the chain lives (created if needed).
      input_signature: the nest of specs of the model's input (as `export_for_serving`).
      dense_every: every `dense_every`-th delta also carries the dense (non-embedding) weights; 1 = every delta.
      model_id: the chain's id (deltas of another id are refused by the servable); default: the manifest's, or a
        new random one.
      dynamic_headroom: a full version gives each dynamic table room for this fraction more keys than it has
        (at least `min_free_slots`); a delta that needs more makes `publish_delta` write a full version instead.
      min_free_slots: see `dynamic_headroom`.

    Tiered tables (`storage=te.Tiered`, docs/tiered_tables.md) are published without holding them in memory: a
    full version's table variable is saved without a value and its rows are streamed from the tier into the
    SavedModel's checkpoint one chunk at a time (`tf_embed_ops.serving.streamed`); a delta reads the touched rows
    from the tier through its cache (without filling it). A tiered table the tracker reports changed whole (`full`:
    a restore, a non-lazy optimizer, `mark_all`), or whose every row is listed changed (training or `write_rows`
    reached them all), makes `publish_delta` write a full version instead of a delta of every row. The chain is
    bitwise the one the same model with its tables in memory publishes (same layout, same deltas).

    A tiered dynamic table's full version holds its keys (read whole: they are in DRAM anyway) with the free slots
    `dynamic_headroom` gives, and its rows streamed from the tier (`streamed_row_table.StreamedRowTable`); a delta
    holds the changed keys' rows as the tracker reads them from the tier.

    Thread safety: `publish_full`, `publish_delta` and `write_delta` may be called from several threads (while
    others train): the calls on one publisher run one at a time (a lock), so versions are numbered and listed in
    order. One publisher per directory: two publishers (or processes) writing one directory are not supported.

    Raises:
      ValueError: for a bad argument (named, with its value: `dense_every` and `min_free_slots` must be integers,
        `dynamic_headroom` a finite number >= 0, `model_id` a non-empty string), a model without embedding layers,
        or an unreadable `MANIFEST.json` in `directory` (named).
    """

    def __init__(
        self,
        model_or_layer: Any,
        directory: str,
        input_signature: Any,
        dense_every: int = 1,
        model_id: str | None = None,
        dynamic_headroom: float = 1.0,
        min_free_slots: int = 1024,
    ):
        dense_every = checked_int(dense_every, "dense_every", 1)
        min_free_slots = checked_int(min_free_slots, "min_free_slots", 0)
        if (
            isinstance(dynamic_headroom, bool)
            or not isinstance(dynamic_headroom, numbers.Real)
            or not math.isfinite(dynamic_headroom)
            or dynamic_headroom < 0
        ):
            raise ValueError(f"dynamic_headroom: must be a finite number >= 0, got {dynamic_headroom!r}")
        if model_id is not None and (not isinstance(model_id, str) or not model_id):
            raise ValueError(f"model_id: must be a non-empty string or None, got {model_id!r}")
        self._model = model_or_layer
        self._layers = _embedding_layers(model_or_layer)
        self._directory = os.fspath(directory)
        manifest = read_manifest(self._directory)  # before anything is created or removed
        self._signature = input_signature
        self._dense_every = dense_every
        self._headroom = float(dynamic_headroom)
        self._min_free = min_free_slots
        self._lock = threading.RLock()  # publishes: one at a time (see the class docstring)
        os.makedirs(os.path.join(self._directory, DELTAS), exist_ok=True)
        self._clean_temporaries()
        self._model_id = model_id or (manifest or {}).get("model_id") or f"model-{uuid.uuid4().hex}"
        self._chain: list = list((manifest or {}).get("chain", []))
        self._served: Any = None  # the Servable of the current full version (its layout and capacities)
        self._deltas_since_dense = 0
        self._tracker: Any = None
        self._cursor: Any = None
        self._live: dict = {}  # dynamic table name -> keys the servable holds after the latest version (count)
        self._released: dict = {}  # dynamic table name -> slots the latest delta released

    # -------------------------------------------------------------------------------------------- queries
    @property
    def directory(self) -> str:
        return self._directory

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def version(self) -> int:
        """The latest published version (0 before the first)."""
        return int(self._chain[-1]["version"]) if self._chain else 0

    # ------------------------------------------------------------------------------------------ the tables
    def _static_tables(self) -> list:
        """[(name, variable)] of the static tables kept in memory."""
        out = []
        for layer in self._layers:
            store = layer.embedding
            for name, slots in store.variables.items():
                var = slots["parameters"]
                out.append((name, getattr(var, "value", var)))
        return out

    def _tiered_tables(self) -> dict:
        """{name: te.tiered.TieredTable} of the static tiered tables (storage=te.Tiered)."""
        return {config.name: table for layer in self._layers for config, table in layer.tiered_tables.items()}

    def _static_order(self) -> list:
        """Every static table's name (in memory or tiered), in the order the engines number their tables (first
        appearance among the features): a tiered table takes the place the same table in memory takes, so that both
        publish the same layout and the same deltas."""
        from tf_embed_ops.dynamic import config as dynamic_config  # pylint: disable=import-outside-toplevel

        names: list = []
        for layer in self._layers:
            for feature in tf.nest.flatten(layer.feature_config):
                table = feature.table
                if not dynamic_config.is_dynamic(table) and table.name not in names:
                    names.append(table.name)
        return names

    def _dynamic_tables(self) -> dict:
        out = {}
        for layer in self._layers:
            for config, table in layer.dynamic_tables.items():
                out[config.name] = table
        return out

    def _capacity(self, n: int) -> int:
        return max(int(math.ceil(n * (1.0 + self._headroom))), n + self._min_free)

    def _make_mutable(self, table: Any) -> servable_lib.MutableRowTable:
        if getattr(table, "tiered", None) is not None:
            # Its keys now, its rows streamed from the tier when the servable is saved (`publish_full`).
            from tf_embed_ops.serving import streamed_row_table  # pylint: disable=import-outside-toplevel

            return streamed_row_table.StreamedRowTable(table, self._capacity)
        with tf.init_scope():
            contents = table.export()
            keys, weights = contents["keys"].numpy(), contents["weights"].numpy()
            return servable_lib.MutableRowTable(
                keys, weights, self._capacity(keys.shape[0]), table.key_dtype, table.table_name
            )

    def build_servable(self, version: int) -> servable_lib.Servable:
        """The `Servable` of the model as it is now, as `publish_full` saves it."""
        from tf_embed_ops.keras import serving as keras_serving  # pylint: disable=import-outside-toplevel

        # A static tiered table's serving form: its variable has no value until `publish_full` streams its rows.
        tiered = self._tiered_tables()
        streamed = {name: streamed_lib.StreamedTable(table) for name, table in tiered.items()}
        served = {id(table): (table, streamed[name]) for name, table in tiered.items()}
        concrete, _, frozen = keras_serving.trace_serving_function(
            self._model, self._signature, self._make_mutable, served=served
        )
        in_memory = self._static_tables()
        table_ids = {id(v.handle) for _, v in in_memory}
        static = {**dict(in_memory), **streamed}
        tables = [(name, static[name]) for name in self._static_order() if name in static]
        tables += [(t.table_name, t) for t in frozen]
        captured = {id(t) for t in concrete.captured_inputs}
        dense, seen = [], set()
        for v in self._model.variables if hasattr(self._model, "variables") else []:
            backing = getattr(v, "value", v)
            handle = getattr(backing, "handle", None)
            if handle is None or id(handle) in table_ids or id(handle) not in captured or id(handle) in seen:
                continue
            seen.add(id(handle))
            dense.append((getattr(v, "path", None) or backing.name, backing))
        return servable_lib.Servable(concrete, tables, dense, self._model_id, version)

    # --------------------------------------------------------------------------------------------- publish
    def _next_version(self) -> int:
        taken = [self.version]
        for entry in os.listdir(self._directory):
            if entry.isdigit():
                taken.append(int(entry))
        for entry in os.listdir(os.path.join(self._directory, DELTAS)):
            stem = entry.split(".")[0]
            if stem.isdigit():
                taken.append(int(stem))
        return max(taken) + 1

    def _clean_temporaries(self) -> None:
        """The temporaries of a publish that was killed (the directory's one publisher owns them all)."""
        for parent in (self._directory, os.path.join(self._directory, DELTAS)):
            atomic_write.remove_temporaries(parent)

    def _commit(self, entry: dict, servable: Any, written: str) -> None:
        """Lists `entry` (whose file or directory `written` is in place) in the manifest; if that write fails,
        `written` is removed and the chain is as it was."""
        manifest = {
            "format": MANIFEST_FORMAT,
            "model_id": self._model_id,
            "layout": servable.layout,
            "layout_id": servable.metadata()["layout_id"],
            "chain": self._chain + [entry],
        }
        try:
            _write_json_atomically(os.path.join(self._directory, MANIFEST), manifest)
        except BaseException:
            atomic_write.remove(written)
            raise
        self._chain.append(entry)

    def _ensure_tracker(self) -> None:
        if self._tracker is None:
            try:
                from tf_embed_ops import tracking  # pylint: disable=import-outside-toplevel
            except ImportError:
                return
            self._tracker = tracking.Tracker(self._model)

    def publish_full(self) -> int:
        """Writes the model as it is now as a new full version (a SavedModel); later deltas build on it.

        Returns:
          The version number.

        Raises:
          tf.errors.ResourceExhaustedError: the disk is full (naming the version's directory); OSError: another
            write failure (naming it). No temporary is left and the chain is unchanged.
        """
        with self._lock:
            return self._publish_full()

    def _publish_full(self) -> int:
        self._ensure_tracker()
        cursor = (
            self._tracker.cursor() if self._tracker is not None else None
        )  # before reading: a concurrent step lands in the next delta
        version = self._next_version()
        started = time.time()
        servable = self.build_servable(version)

        def fill(tmp: str) -> None:
            tf.saved_model.save(servable, tmp, signatures=servable.signatures())
            if servable.streamed:
                # Tiered tables: their rows, read from the tier one chunk at a time, complete the checkpoint.
                streamed_lib.write_rows(tmp, servable)
            with open(os.path.join(tmp, "servable.json"), "w") as f:
                json.dump({"version": version, **servable.metadata()}, f, indent=1)

        final = os.path.join(self._directory, str(version))
        atomic_write.write_directory(final, fill)
        entry = {
            "version": version,
            "kind": "full",
            "path": str(version),
            "base": None,
            "step": self._step(),
            "seconds": round(time.time() - started, 3),
        }
        self._commit(entry, servable, final)
        self._served = servable
        self._live = {t["name"]: None for t in servable.layout["tables"] if t["kind"] == "dynamic"}
        self._released = {name: 0 for name in self._live}
        self._cursor = cursor
        self._deltas_since_dense = 0
        return version

    def publish_delta(self, dense: bool | None = None) -> int:
        """Writes the rows touched since the previous version (and evicted keys) as a new delta version.

        A dynamic table the tracker reports as wholly changed (restored, imported), or whose new keys would not
        fit the servable's free slots, makes this a full version instead (`publish_full`).

        Args:
          dense: carry the dense weights in this delta (default: every `dense_every`-th delta).

        Returns:
          The new version.

        Raises:
          RuntimeError: before the first `publish_full` of this publisher.
          ValueError: a touched row that is not finite (NaN or infinity), naming the table and the row or key;
            nothing is written (a servable refuses such a delta too).
          tf.errors.ResourceExhaustedError: the disk is full (naming the delta file); OSError: another write
            failure (naming it). No temporary is left, the chain is unchanged, and the next publish takes the rows.
        """
        with self._lock:
            return self._publish_delta(dense)

    def _publish_delta(self, dense: bool | None) -> int:
        if self._served is None:
            raise RuntimeError("publish_delta: publish_full() first (a delta needs a full version to build on)")
        if self._tracker is None:
            raise RuntimeError("publish_delta: this build has no touched-row tracker (tf_embed_ops.tracking)")
        changes = self._tracker.changed_since(self._cursor)
        touched = {}
        tiered = self._tiered_tables()
        for name, tc in changes.tables.items():
            whole = name in tiered and (tc.full or np.asarray(tc.rows).size >= tiered[name].num_rows)
            if whole or (tc.kind == "dynamic" and tc.full):
                # A tiered table changed whole (`full`: a restore, a non-lazy optimizer, mark_all), or every row
                # of it changed one by one: a full version streams it from the tier, where a delta would hold every
                # row in memory.
                return self._publish_full()
            contents = getattr(tc, "contents", None)
            weights = contents["weights"] if tc.kind == "dynamic" and contents is not None else None
            touched[name] = (np.asarray(tc.rows, np.int64), np.asarray(tc.evicted, np.int64), weights)
        version = self._write_delta(touched, dense=dense)
        if version is None:
            return self._publish_full()
        self._cursor = changes.cursor
        return version

    def write_delta(self, touched: dict, dense: bool | None = None) -> int | None:
        """Writes a delta of the given rows, read from the tables now (what `publish_delta` does with the
        tracker's rows).

        Args:
          touched: {table name: (row ids or keys int64[n], evicted keys int64[m])}, or for a dynamic table
            (keys, evicted, rows [n, dim]) with the keys' rows as read (sorted by key, as the tracker gives them);
            tables left out are unchanged.
          dense: as `publish_delta`.

        Returns:
          The new version, or None if a dynamic table's new keys would not fit the servable (nothing written).

        Raises:
          ValueError: unsorted keys given with rows, or a row that is not finite (naming the table and the row or
            key); nothing is written.
          tf.errors.ResourceExhaustedError / OSError: as `publish_delta`.
        """
        with self._lock:
            return self._write_delta(touched, dense)

    def _write_delta(self, touched: dict, dense: bool | None = None) -> int | None:
        layout = self._served.layout
        static = dict(self._static_tables())
        tiered = self._tiered_tables()
        dynamic = self._dynamic_tables()
        tables = []
        for entry in layout["tables"]:
            name = entry["name"]
            keys, evicted, *given = touched.get(name, (np.zeros([0], np.int64), np.zeros([0], np.int64)))
            given_rows = given[0] if given else None
            if given_rows is not None:
                keys = np.asarray(keys, np.int64)
                if keys.size > 1 and not bool(np.all(keys[1:] > keys[:-1])):
                    raise ValueError(f"touched[{name!r}]: keys given with their rows must be sorted and unique")
            else:
                keys = _sorted_unique(keys)
            if entry["kind"] == "static":
                if not keys.size:
                    rows = np.zeros([0, entry["dim"]])
                elif name in tiered:
                    rows = _tiered_rows(tiered[name], keys)
                else:
                    rows = tf.gather(static[name], keys).numpy()
                tables.append(fmt.TableDelta(keys, rows, encoding=entry["encoding"], dim=entry["dim"]))
                continue
            table = dynamic[name]
            keys, rows = (keys, np.asarray(given_rows)) if given_rows is not None else _dynamic_rows(table, keys)
            evicted = _sorted_unique(evicted)
            if evicted.size and keys.size:
                evicted = evicted[~np.isin(evicted, keys, assume_unique=True)]
            size = int(table.size().numpy()) if hasattr(table, "size") else keys.shape[0]
            # Slots in use after the apply (the training table's size) plus those it releases must fit.
            if size + evicted.shape[0] > entry["capacity"]:
                return None
            tables.append(fmt.TableDelta(keys, rows, evicted, encoding=entry["encoding"], dim=entry["dim"]))
        for entry, delta in zip(layout["tables"], tables, strict=True):
            _check_finite(f"table {entry['name']!r}", delta.rows, delta.keys, entry["kind"])
        carry = (self._deltas_since_dense + 1 >= self._dense_every) if dense is None else bool(dense)
        dense_values = [v.numpy() for v in self._served.dense] if carry else None
        for spec, value in zip(layout["dense"], dense_values or [], strict=False):
            _check_finite(f"dense variable {spec['name']!r}", value, None, "dense")
        version = self._next_version()
        base = self.version
        path = os.path.join(self._directory, DELTAS, f"{version}.delta")
        started = time.time()
        nbytes = fmt.write_delta(
            path,
            model_id=fmt.fingerprint64(self._model_id),
            layout_id=self._served.metadata()["layout_id"],
            version=version,
            base_version=base,
            step=self._step(),
            tables=tables,
            dense=dense_values,
        )
        self._commit(
            {
                "version": version,
                "kind": "delta",
                "path": os.path.join(DELTAS, f"{version}.delta"),
                "base": base,
                "step": self._step(),
                "bytes": nbytes,
                "rows": {t["name"]: int(d.keys.shape[0]) for t, d in zip(layout["tables"], tables, strict=True)},
                "evicted": {t["name"]: int(d.evicted.shape[0]) for t, d in zip(layout["tables"], tables, strict=True)},
                "dense": carry,
                "seconds": round(time.time() - started, 3),
            },
            self._served,
            path,
        )
        self._deltas_since_dense = 0 if carry else self._deltas_since_dense + 1
        return version

    def _step(self) -> int:
        for layer in self._layers:
            for table in layer.dynamic_tables.values():
                return int(table.step.numpy())
        optimizer = getattr(self._model, "optimizer", None)
        iterations = getattr(optimizer, "iterations", None)
        return int(iterations.numpy()) if iterations is not None else 0


def _sorted_unique(values: Any) -> np.ndarray:
    """`values` as sorted unique int64 (the tracker's rows already are: checked in one pass, not re-sorted)."""
    values = np.asarray(values, np.int64).reshape([-1])
    if values.size < 2 or bool(np.all(values[1:] > values[:-1])):
        return values
    return np.unique(values)


def _tiered_rows(table: Any, rows: np.ndarray) -> np.ndarray:
    """Rows `rows` of a static tiered table in its storage dtype (as the same table in memory gathers them), read
    from the tier through its cache without filling it; the op checks every row id before it reads one."""
    with tf.init_scope():
        values, _ = table.gather_rows(tf.constant(rows, tf.int64))
        return tf.cast(values, table.dtypes[0]).numpy()  # float32 -> the 16-bit storage dtype is exact here


def _dynamic_rows(table: Any, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The keys among `keys` that have a row now, and their rows."""
    if keys.size == 0:
        return keys, np.zeros([0, table.dim], np.float32)
    ids = tf.constant(keys)
    if table.key_dtype == tf.string:
        # The keys are already fingerprints; the table's own ops take int64 keys of a string table the same way.
        raise NotImplementedError("deltas of string-keyed dynamic tables come through the tracker's read_dynamic")
    found = table.find(ids).numpy()
    present = found >= 0
    if getattr(table, "tiered", None) is not None:  # read from the tier through its cache, without filling it
        rows, _ = dynamic_ops.dynamic_table_tiered_read_rows(
            table.handle, tf.constant(keys[present]), num_slots=table.num_slots
        )
        return keys[present], rows.numpy()
    rows = table.lookup(tf.constant(keys[present])).numpy()
    return keys[present], rows


def _check_finite(what: str, values: Any, keys: Any, kind: str) -> None:
    """Raises ValueError naming the first non-finite value of a delta's rows (or a dense variable's value)."""
    values = np.asarray(values)
    if values.dtype.name == "bfloat16":
        finite = np.isfinite(values.astype(np.float32))  # exact: float32 holds every bfloat16
    elif values.dtype.kind == "f":
        finite = np.isfinite(values)
    else:
        return
    if bool(finite.all()):
        return
    first = np.unravel_index(int(np.argmin(finite.reshape([-1]))), finite.shape)
    if keys is None:
        where = f"element {[int(i) for i in first]}"
    else:
        where = f"{'row' if kind == 'static' else 'key'} {int(keys[first[0]])}"
    raise ValueError(
        f"publish_delta: {what}: {where} is {values[first]} (not finite); a servable refuses non-finite rows, so "
        "nothing was written (check_numerics=True refuses the training step that makes them)"
    )
