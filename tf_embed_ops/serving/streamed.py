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
from tf_embed_ops.serving import quantization
from tf_embed_ops.serving import tables as tables_lib

__all__ = ["StreamedTable", "write_rows"]

# Where an export keeps its streamed tables (the SavedModel root's attribute): their checkpoint keys are found by
# this path in the checkpoint's object graph.
ROOT_ATTRIBUTE = "tiered_tables"
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def _module_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in str(name)) or "table"
    return cleaned if cleaned[0].isalpha() else "t_" + cleaned


class StreamedTable(tables_lib.ServedTable):
    """A tiered table's serving form: `rows` [vocabulary_size, encoded width] with no value until `write_rows`.

    The lookups are `ServedTable`'s (gather, then decode), so a streamed table serves exactly what the same rows
    exported from memory serve.

    Args:
      table: the `te.tiered.TieredTable` (read only, by `write_rows`; not saved with the servable).
      mode: the quantization mode (`tf_embed_ops.serving.quantization.MODES`); None keeps the table's storage
        dtype (float32, bfloat16 or float16), as an in-memory table is exported.
    """

    def __init__(self, table: Any, mode: str | None = None):
        tf.Module.__init__(self, name=_module_name(table.table_name))  # pylint: disable=non-parent-init-called
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

    def _gather(self, ids: Any) -> tf.Tensor:
        rows = tf.gather(self.rows, ids)
        return tf.bitcast(rows, self.dtype) if self.stored_dtype != self.dtype else rows


def _slice_spec(num_rows: int, width: int, start: int, n: int) -> str:
    return f"{num_rows} {width} {start},{n}:0,{width}"


def _checkpoint_keys(prefix: str, count: int) -> list[str]:
    """The checkpoint key of `<ROOT_ATTRIBUTE>/<i>/rows` for i < count, from the checkpoint's object graph."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2  # pylint: disable=import-outside-toplevel

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(prefix).get_tensor(_OBJECT_GRAPH_KEY))

    def child(node: Any, name: str) -> Any:
        for ref in node.children:
            if ref.local_name == name:
                return graph.nodes[ref.node_id]
        raise RuntimeError(f"streamed export: the SavedModel's object graph has no {name!r} below its root")

    keys = []
    holder = child(graph.nodes[0], ROOT_ATTRIBUTE)
    for i in range(count):
        rows = child(child(holder, str(i)), "rows")
        found = [a.checkpoint_key for a in rows.attributes if a.name == "VARIABLE_VALUE"]
        if not found:
            raise RuntimeError(f"streamed export: the SavedModel's checkpoint records no value for table {i}'s rows")
        keys.append(found[0])
    return keys


def write_rows(export_dir: str, streamed: list[tuple[StreamedTable, Any]]) -> None:
    """Completes the checkpoint of the SavedModel at `export_dir` with the rows of its streamed tables.

    Call it after `tf.saved_model.save` of a root whose `ROOT_ATTRIBUTE` lists the `StreamedTable`s of `streamed`,
    in that order.

    Args:
      export_dir: the SavedModel directory (a temporary one: a failure leaves it incomplete).
      streamed: `[(StreamedTable, TieredTable)]`.

    Raises:
      ValueError: a row the table's mode cannot encode (the export must then be discarded).
    """
    if not streamed:
        return
    variables = os.path.join(export_dir, "variables")
    base = os.path.join(variables, "tf_embed_ops_base")
    for path in glob.glob(glob.escape(os.path.join(variables, "variables")) + ".*"):
        os.rename(path, base + path[len(os.path.join(variables, "variables")) :])
    keys = _checkpoint_keys(base, len(streamed))
    prefixes = [base]
    for i, ((served, table), key) in enumerate(zip(streamed, keys, strict=True)):
        for k, (start, n) in enumerate(table.chunks()):
            values, _ = table.read_rows(start, n)
            prefix = os.path.join(variables, f"tf_embed_ops_tiered_{i}_{k}")
            tf.raw_ops.SaveV2(
                prefix=prefix,
                tensor_names=[key],
                shape_and_slices=[_slice_spec(served.num_rows, served.width, start, n)],
                tensors=[served.encode(values, start)],
            )
            prefixes.append(prefix)
    tf.raw_ops.MergeV2Checkpoints(
        checkpoint_prefixes=prefixes, destination_prefix=os.path.join(variables, "variables"), delete_old_dirs=False
    )
    _tf_compat.write_saved_model_fingerprint(export_dir)
