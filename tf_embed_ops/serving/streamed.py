"""A tiered table in a servable, written chunk by chunk: never the whole table in memory.

A tiered table can be larger than the exporting process's memory, so its servable cannot be a variable built from
the table's rows. Its serving form, `StreamedTable`, is a variable that has the table's shape and dtype but no value
(TensorFlow's `UninitializedVariable`): the serving function is traced and the SavedModel saved around it, and
TensorFlow's checkpoint of the SavedModel records the variable without a value. `write_rows` then completes the
checkpoint: each chunk of rows (`te.Tiered(chunk_bytes=...)`) is read from the tier, encoded (quantized when asked)
and written by its own `SaveV2` as a *slice* of the variable's tensor (the way partitioned variables are saved),
and `MergeV2Checkpoints` merges the slices into the SavedModel's `variables/` checkpoint. A loader (TensorFlow
Serving, `tf.saved_model.load`) restores the variable from its slices with stock `RestoreV2`: the SavedModel is a
plain one, and `tf_embed_ops` is not needed to load it.

Any serving form of this kind (`Streamed`: a static tiered table's `StreamedTable`, a tiered dynamic table's
`tf_embed_ops.dynamic.streamed_serving.StreamedDynamicTable`) is found by walking the saved checkpoint's object
graph beside the Python objects from the root, wherever the root holds it; `save` is `tf.saved_model.save` followed
by `write_rows`, into a temporary directory renamed into place.

Memory: one chunk of the tier's rows and slots (float32) and its encoded copy, whatever the table's size.

float16 rows (the "float16" mode, or a float16 table exported as stored) are kept as their int16 bits and bitcast
back after the gather: TensorFlow's restore of a tensor saved as slices has no float16 case ("Dtype half not
supported"), while int16 slices restore; the values served are the same bits.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat
from tf_embed_ops.formats import atomic_write
from tf_embed_ops.serving import quantization
from tf_embed_ops.serving import tables as tables_lib

__all__ = ["Streamed", "StreamedTable", "check_export_target", "save", "write_atomically", "write_rows"]

# Where `te.keras.export_for_serving` keeps its static tiered tables' serving forms (an attribute of its root).
ROOT_ATTRIBUTE = "tiered_tables"
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


class Streamed:
    """A serving form whose variable `streamed_variable` ([num_rows, width]) is saved without a value and written
    by `write_rows`, chunk by chunk, from `streamed_chunks()`: `(first row, encoded rows)` in row order."""

    streamed_variable = "rows"
    num_rows: int
    width: int
    table_name: str

    def streamed_chunks(self) -> Any:
        raise NotImplementedError

    def _hold_source(self, table: Any) -> None:
        """Keeps the training `table` for `streamed_chunks`, out of the servable (`_Source`)."""
        self._source = _Source(table)


class StreamedTable(Streamed, tables_lib.ServedTable):
    """A tiered table's serving form: `rows` [vocabulary_size, encoded width] with no value until `write_rows`.

    The lookups are `ServedTable`'s (gather, then decode), so a streamed table serves exactly what the same rows
    exported from memory serve.

    Args:
      table: the `te.tiered.TieredTable` (read only, by `write_rows`; not saved with the servable).
      mode: the quantization mode (`tf_embed_ops.serving.quantization.MODES`); None keeps the table's storage
        dtype (float32, bfloat16 or float16), as an in-memory table is exported.
    """

    def __init__(self, table: Any, mode: str | None = None):
        tf.Module.__init__(self, name=tables_lib.module_name(table.table_name))  # pylint: disable=non-parent-init-called
        quantization.check_mode(mode, table.table_name)
        self.table_name, self.mode, self.dim = table.table_name, mode, int(table.dim)
        trained_dtype = tf.as_dtype(table.dtypes[0])
        self.dtype = tf.as_dtype(quantization.storage_dtype(mode)) if mode is not None else trained_dtype
        self.width = quantization.encoded_width(mode, self.dim)
        self.num_rows = int(table.num_rows)
        # What the variable holds: float16 as its int16 bits (see the module docstring).
        self.stored_dtype = tf.int16 if self.dtype == tf.float16 else self.dtype
        with tf.init_scope():
            self.rows = _tf_compat.UninitializedVariable(
                shape=[self.num_rows, self.width], dtype=self.stored_dtype, trainable=False, name="rows"
            )
        self.remap = None
        self._hold_source(table)
        nbytes = self.num_rows * self.width * self.dtype.size
        self.set_metadata(
            tables_lib.table_metadata(
                "tiered", self.dim, self.num_rows, self.num_rows, mode, None, nbytes, trained_dtype.name
            )
        )

    def encode(self, values: tf.Tensor, first_row: int) -> tf.Tensor:
        """Float32 rows [n, dim] (rows `first_row`...) in this table's encoding, as the variable stores it.

        Raises:
          ValueError: a row the mode cannot encode (non-finite, beyond float16's range), naming the table, the row
            within the chunk and the chunk's first row.
        """
        if self.mode is None:
            encoded = tf.cast(values, self.dtype)
        else:
            try:
                encoded = tf.constant(quantization.encode(values.numpy(), self.mode, self.table_name))
            except ValueError as e:
                raise ValueError(f"{e} (row numbers counted from row {first_row}, the chunk being exported)") from None
        return tf.bitcast(encoded, self.stored_dtype) if self.stored_dtype != self.dtype else encoded

    def streamed_chunks(self) -> Any:
        """The table's rows encoded, chunk by chunk (`te.Tiered(chunk_bytes=...)`), read through its cache."""
        table = self._source.table
        for start, n in table.chunks():
            values, _ = table.read_rows(start, n)
            yield start, self.encode(values, start)

    def _gather(self, ids: Any) -> tf.Tensor:
        rows = tf.gather(self.rows, ids)
        return tf.bitcast(rows, self.dtype) if self.stored_dtype != self.dtype else rows


def _slice_spec(num_rows: int, width: int, start: int, n: int) -> str:
    return f"{num_rows} {width} {start},{n}:0,{width}"


class _Source:
    """Holds a streamed form's training table out of TensorFlow's object tracking: the table is read by
    `write_rows`, never saved with the servable (a tiered table refuses to be part of a SavedModel)."""

    def __init__(self, table: Any):
        self.table = table


def streamed_forms_and_keys(prefix: str, root: Any) -> list[tuple[Any, str]]:
    """[(streamed form, checkpoint key of its streamed variable)] of every streamed form reachable from `root`.

    The checkpoint's object graph is walked beside the Python objects (a child is matched by its local name), so a
    streamed form is found wherever the root holds it; each is listed once, in the order of the walk.
    """
    from tensorflow.core.protobuf import trackable_object_graph_pb2  # pylint: disable=import-outside-toplevel

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(prefix).get_tensor(_OBJECT_GRAPH_KEY))
    found: list[tuple[Any, str]] = []
    seen_nodes, seen_forms = {0}, set()
    queue = [(root, 0)]
    while queue:
        obj, node_id = queue.pop(0)
        node = graph.nodes[node_id]
        children = _trackable_children(obj)
        if isinstance(obj, Streamed) and id(obj) not in seen_forms:
            seen_forms.add(id(obj))
            variable = children.get(obj.streamed_variable)
            ref = [r for r in node.children if r.local_name == obj.streamed_variable]
            keys = [a.checkpoint_key for a in graph.nodes[ref[0].node_id].attributes] if ref else []
            if variable is None or len(keys) != 1:
                raise RuntimeError(
                    f"streamed export: the SavedModel's checkpoint records no value for table {obj.table_name!r}'s "
                    f"{obj.streamed_variable!r}"
                )
            found.append((obj, keys[0]))
        for ref in node.children:
            child = children.get(ref.local_name)
            if child is not None and ref.node_id not in seen_nodes:
                seen_nodes.add(ref.node_id)
                queue.append((child, ref.node_id))
    return found


def _trackable_children(obj: Any) -> dict:
    """`obj`'s children as a SavedModel tracks them (its checkpoint's children are a subset)."""
    try:
        return _tf_compat.trackable_children(obj, save_type="savedmodel")
    except Exception:  # an object that cannot list them here: follow its checkpoint children
        try:
            return _tf_compat.trackable_children(obj)
        except Exception:
            return {}


def write_rows(export_dir: str, root: Any) -> list:
    """Completes the checkpoint of the SavedModel at `export_dir` (saved from `root`) with the rows of every
    streamed form `root` holds (`StreamedTable`, `tf_embed_ops.dynamic.serving.StreamedDynamicTable`).

    Each form's `streamed_chunks()` yields `(first row, encoded rows)`, the rows of its variable in order, one
    chunk at a time; each chunk is saved by its own `SaveV2` as a slice of the variable, and `MergeV2Checkpoints`
    merges them with the SavedModel's checkpoint. The merged checkpoint is then checked: every value its object
    graph records must be in it (a streamed variable not reached here would leave the servable unloadable).

    Args:
      export_dir: the SavedModel directory (a temporary one: a failure leaves it incomplete).
      root: the object `tf.saved_model.save` saved.

    Returns:
      The streamed forms written.

    Raises:
      ValueError: a row a table's mode cannot encode (the export must then be discarded).
      tf.errors.OpError: a row that cannot be read from the tier (the same).
      RuntimeError: a streamed variable without a value in the merged checkpoint.
    """
    variables = os.path.join(export_dir, "variables")
    current = os.path.join(variables, "variables")
    base = os.path.join(variables, "tf_embed_ops_base")
    if not tf.io.gfile.exists(current + ".index"):
        return []  # nothing saved: no variable at all
    forms = streamed_forms_and_keys(current, root)
    if not forms:
        return []
    for path in glob.glob(glob.escape(current) + ".*"):
        os.rename(path, base + path[len(current) :])
    prefixes = [base]
    for i, (served, key) in enumerate(forms):
        for k, (start, encoded) in enumerate(served.streamed_chunks()):
            prefix = os.path.join(variables, f"tf_embed_ops_tiered_{i}_{k}")
            n = int(encoded.shape[0])
            tf.raw_ops.SaveV2(
                prefix=prefix,
                tensor_names=[key],
                shape_and_slices=[_slice_spec(served.num_rows, served.width, start, n)],
                tensors=[encoded],
            )
            prefixes.append(prefix)
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=prefixes, destination_prefix=current, delete_old_dirs=False)
    _check_complete(current)
    _tf_compat.write_saved_model_fingerprint(export_dir)
    return [served for served, _ in forms]


def _check_complete(prefix: str) -> None:
    """Every value the checkpoint's object graph records is in the checkpoint."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2  # pylint: disable=import-outside-toplevel

    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
    # A saveable of several tensors (a MutableHashTable's "-keys" and "-values") records its key as their prefix.
    names = reader.get_variable_to_shape_map()
    parts = {name.rsplit("-", 1)[0] for name in names if "-" in name}
    missing = [a.checkpoint_key for n in graph.nodes for a in n.attributes if a.checkpoint_key not in names]
    missing = [key for key in missing if key not in parts]
    if missing:
        raise RuntimeError(f"streamed export: the SavedModel's checkpoint has no value for {missing[:5]}")


def save(root: Any, export_dir: str, signatures: Any = None, options: Any = None) -> list:
    """`tf.saved_model.save(root, export_dir, signatures, options)` for a root holding streamed forms, atomically.

    The SavedModel is written into a temporary sibling of `export_dir`; then every streamed form reachable from
    `root` (`tf_embed_ops.dynamic.serving.freeze_streamed`, `StreamedTable`) gets its rows, read from its tiered
    table chunk by chunk (`write_rows`); then the directory is renamed into `export_dir` (an export already there
    is replaced; anything else there is refused, see `write_atomically`). A failure (a row a mode cannot encode, a
    corrupted row in the tier, a full disk) leaves `export_dir` as it was, and no temporary directory.

    Args:
      root: the object to save (a `tf.Module` holding the streamed forms and whatever else the servable reads).
      export_dir: the SavedModel directory.
      signatures, options: as `tf.saved_model.save`.

    Returns:
      The streamed forms written.

    Raises:
      ValueError: a row a table's mode cannot encode, naming the table and the key or row; or an `export_dir` that
        is neither absent, empty nor a previous export (nothing is written or removed).
      tf.errors.OpError: a row that cannot be read from the tier, naming the table, the row, its key and the file;
        `tf.errors.ResourceExhaustedError` for a full disk, naming `export_dir`.
    """
    written: list = []

    def write(tmp: str) -> None:
        tf.saved_model.save(root, tmp, signatures=signatures, options=options)
        written.extend(write_rows(tmp, root))

    try:
        write_atomically(export_dir, write)
    except tf.errors.OpError as e:  # its message names the export directory (atomic_write)
        raise type(e)(e.node_def, e.op, f"save_streamed to {e.message}") from None
    except ValueError as e:
        raise ValueError(f"save_streamed to {export_dir}: {e}; nothing was written") from None
    return written


# What a SavedModel export holds (`tf.saved_model.save`, plus `assets.extra/` for tools): a directory holding these
# entries only, `saved_model.pb` among them, is a previous export that a new one may replace.
_EXPORT_ENTRIES = frozenset(
    {"saved_model.pb", "saved_model.pbtxt", "fingerprint.pb", "variables", "assets", "assets.extra"}
)


def check_export_target(filepath: str) -> None:
    """Raises ValueError unless an export may be written at `filepath`: nothing there, an empty directory, or a
    previous export (a directory holding only a SavedModel's entries). An export never deletes what it did not
    write: a file, or a directory with anything else in it (e.g. `"."`, a project directory), is refused."""
    if not os.path.lexists(filepath):
        return
    if os.path.islink(filepath) or not os.path.isdir(filepath):
        raise ValueError(
            f"filepath: {filepath} exists and is not a directory; refusing to replace it (nothing written)"
        )
    entries = set(os.listdir(filepath))
    if not entries:
        return
    others = sorted(entries - _EXPORT_ENTRIES)
    if others or not entries & {"saved_model.pb", "saved_model.pbtxt"}:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "") if others else "no saved_model.pb"
        raise ValueError(
            f"filepath: {filepath} is a non-empty directory that is not a previous export ({shown}); an export "
            "replaces only an earlier export, never other files: choose a new or empty directory (nothing was "
            "written or removed)"
        )


def write_atomically(filepath: str, write: Any) -> None:
    """Runs `write(tmp)` into a temporary sibling of `filepath`, then renames it into place, so that a reader never
    sees a half-written export and a failed write leaves nothing (`tf_embed_ops.formats.atomic_write`).

    `filepath` may be absent, an empty directory or a previous export, which is replaced; anything else is refused
    before anything is written (`check_export_target`). Temporaries beside `filepath` left by an export that was
    killed (their process is gone) are removed first.

    Raises:
      ValueError: a `filepath` that may not be replaced (see above).
      tf.errors.ResourceExhaustedError: a full disk, naming `filepath`; OSError / tf.errors.OpError: another write
        failure, naming it. No temporary is left and `filepath` is as it was.
    """
    filepath = os.path.abspath(os.fspath(filepath)).rstrip(os.sep)
    check_export_target(filepath)
    parent = os.path.dirname(filepath)
    os.makedirs(parent, exist_ok=True)
    stem = os.path.basename(filepath) + atomic_write.TEMPORARY_MARK
    atomic_write.remove_temporaries(parent, prefix=stem, only_dead_writers=True)

    def fill(tmp: str) -> None:
        write(tmp)
        check_export_target(filepath)  # again: something may have appeared there meanwhile

    atomic_write.write_directory(filepath, fill, replace=True)
