"""The serving lifecycle: smaller servables (quantized, pruned tables) on stock TensorFlow ops.

- `Prune`: publish-time pruning criteria of one table (`te.keras.export_for_serving(..., prune={table: Prune(...)})`).
- `quantization`: the row encodings (`"int8"`, `"int4"`, `"float16"`, `"bfloat16"`): numpy encoders and
  stock-TensorFlow decoders, shared by everything that writes rows for a servable.
- `ServedTable`: a static table's serving form (encoded, possibly pruned rows).
- `read_export_metadata`: what an export records about its tables (``python -m tf_embed_ops inspect-export``).

Example:
    >>> import tf_embed_ops as te
    >>> te.keras.export_for_serving(model, "/tmp/ctr", spec, quantization="int8",
    ...                             prune={"user": te.serving.Prune(min_l2_norm=1e-3)})
"""

from tf_embed_ops.serving import quantization
from tf_embed_ops.serving.metadata import read_export_metadata
from tf_embed_ops.serving.prune import Prune

__all__ = ["Prune", "ServedTable", "quantization", "read_export_metadata"]


def __getattr__(name: str):
    if name == "ServedTable":  # imports TensorFlow; the rest of the package does not
        from tf_embed_ops.serving.tables import ServedTable

        return ServedTable
    raise AttributeError(f"module 'tf_embed_ops.serving' has no attribute {name!r}")
