"""Serving: live servables of stock TensorFlow ops, full versions and deltas (docs/serving.md).

- ``Publisher``: writes a model's versions into a directory (full SavedModels, deltas of touched rows).
- ``delta_format``: the delta file (written here, read by the servable with stock TensorFlow ops).
- ``servable``: the SavedModel root with the ``serving_default``, ``apply_delta`` and ``served_version`` signatures.
"""

from tf_embed_ops.serving import delta_format
from tf_embed_ops.serving.publisher import Publisher, read_manifest

__all__ = ["Publisher", "delta_format", "read_manifest"]
