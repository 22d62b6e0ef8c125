"""tf_embed_ops: the TPU embedding training contract on CPU, as TensorFlow custom ops.

``tf_embed_ops.ops`` is the raw op module (loaded on first use); ``get_library_path()`` gives the library for
``tf.load_op_library`` in other programs.
"""
from __future__ import annotations

from tf_embed_ops._loader import LibraryLoadError, get_library_path

__all__ = ["LibraryLoadError", "TPUEmbedding", "get_library_path", "keras", "ops"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy: `import tf_embed_ops` must not load the library (nor TensorFlow's kernels) by itself.
    if name == "ops":
        from tf_embed_ops import _loader  # pylint: disable=import-outside-toplevel

        return _loader.load_ops()
    if name == "TPUEmbedding":
        from tf_embed_ops.tpu_embedding import TPUEmbedding  # pylint: disable=import-outside-toplevel

        return TPUEmbedding
    if name == "keras":
        import importlib  # pylint: disable=import-outside-toplevel

        return importlib.import_module("tf_embed_ops.keras")
    raise AttributeError(f"module 'tf_embed_ops' has no attribute {name!r}")
