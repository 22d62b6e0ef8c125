"""The serving lifecycle on stock TensorFlow ops: live servables that take deltas, smaller (quantized, pruned)
tables (docs/serving.md).

- `Publisher`: writes a model's versions into a directory (full SavedModels, deltas of touched rows);
  `read_manifest` reads that directory's chain.
- `delta_format`: the delta file (written here, read by the servable with stock TensorFlow ops).
- `Prune`: publish-time pruning criteria of one table (`te.keras.export_for_serving(..., prune={table: Prune(...)})`).
- `quantization`: the row encodings (`"int8"`, `"int4"`, `"float16"`, `"bfloat16"`): numpy encoders and
  stock-TensorFlow decoders, shared by everything that writes rows for a servable.
- `ServedTable`: a static table's serving form (encoded, possibly pruned rows).
- `save_streamed`: `tf.saved_model.save` of a root holding tiered tables' serving forms
  (`te.dynamic.serving.freeze_streamed`), their rows streamed into the SavedModel chunk by chunk.
- `read_export_metadata`: what an export records about its tables (``python -m tf_embed_ops inspect-export``).

Example:
    >>> import tf_embed_ops as te
    >>> te.keras.export_for_serving(model, "/tmp/ctr", spec, quantization="int8",
    ...                             prune={"user": te.serving.Prune(min_l2_norm=1e-3)})
    >>> pub = te.serving.Publisher(model, "/tmp/live", input_signature=spec)
    >>> pub.publish_full(); pub.publish_delta()
"""

import importlib

from tf_embed_ops.serving import quantization
from tf_embed_ops.serving.metadata import read_export_metadata
from tf_embed_ops.serving.prune import Prune

__all__ = [
    "Prune",
    "Publisher",
    "ServedTable",
    "delta_format",
    "quantization",
    "read_export_metadata",
    "read_manifest",
    "save_streamed",
]


def __getattr__(name: str):
    # These import TensorFlow and the exporter, which itself imports this package's light modules (`prune`):
    # loaded on first use, so importing `tf_embed_ops.serving` stays light and free of cycles.
    if name == "ServedTable":
        from tf_embed_ops.serving.tables import ServedTable

        return ServedTable
    # (import_module, not `from tf_embed_ops.serving import ...`: that form asks this very __getattr__ first.)
    if name in ("Publisher", "read_manifest"):
        return getattr(importlib.import_module("tf_embed_ops.serving.publisher"), name)
    if name == "save_streamed":
        return importlib.import_module("tf_embed_ops.serving.streamed").save
    if name == "delta_format":
        return importlib.import_module("tf_embed_ops.serving.delta_format")
    raise AttributeError(f"module 'tf_embed_ops.serving' has no attribute {name!r}")
