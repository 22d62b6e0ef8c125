"""tf_embed_ops: the TPU embedding training contract on CPU, as TensorFlow custom ops.

Everything is loaded lazily: ``import tf_embed_ops`` imports neither TensorFlow nor the op library; each name
below is resolved on first use. It does register the Keras classes (``keras.models.load_model`` needs them): at
once when TensorFlow and Keras are loaded already, else as soon as they are.

- ``get_library_path()``: the op library, for ``tf.load_op_library`` in other programs; ``ops``: the raw op module.
- ``config``: the TPUEmbeddingConfiguration loader (``from_feature_config``, ``load``, ``to_feature_config``).
- ``optimizers``: the TPU optimizer catalogue (TensorFlow's five plus Momentum, RMSProp, ... Assign).
- ``embedding_activations``, ``send_tpu_embedding_gradients``, ``embedding_lookup_and_update``,
  ``normalize_feature``, ``FeatureInput``, ``adam_bias_corrected_learning_rate``: the fused ops' wrappers.
- ``TPUEmbedding``: the mid-level API, trainable on CPU; ``keras.TPUEmbedding``: the Keras 3 layer.
- ``TPUEmbeddingV2``: the SparseCore mid-level API (TPU v5p/v6e), trainable on CPU; ``sparse_core``: its layouts,
  host preprocessing and checkpoint format.
- ``DynamicTableConfig``, ``dynamic``: dynamic-vocabulary tables (int64 or string keys, rows created as ids
  arrive, admission and eviction policies), accepted wherever a ``TableConfig`` is.
- ``Tiered``, ``tiered``: tables larger than memory, ``TableConfig(..., storage=Tiered(cache_bytes=...,
  directory=...))``: rows on disk behind a DRAM row cache, trained by ``TPUEmbedding`` (docs/tiered_tables.md).
- ``serving``: smaller servables: ``Prune`` (publish-time pruning) and the row ``quantization`` of
  ``keras.export_for_serving(..., quantization=..., prune=...)``.
- ``SparseConditionalAccumulator``: an eager-capable replica of TensorFlow's.
- ``tracking``: which table rows changed since a version (docs/tracking.md); ``checkpoint``: incremental
  checkpoints built on it (docs/checkpoints.md).
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from importlib import metadata as _metadata
from typing import Any

from tf_embed_ops import _loader as _loader_module
from tf_embed_ops._loader import LibraryLoadError, get_library_path

# A build for another TensorFlow minor than the installed one fails here, at once (package metadata only: TensorFlow
# is not imported), with both versions and the command that rebuilds.
_loader_module.check_installed_tensorflow()


# The version is written once, in pyproject.toml; an installed package reads it from its metadata, and its local
# label from the build record (the TensorFlow minor the libraries were built for): an editable install's source
# tree can hold metadata written before the build knew that minor, and a checkout on sys.path finds that first.
def _version() -> str:
    try:
        declared = _metadata.version("tf_embed_ops").split("+", 1)[0]
    except _metadata.PackageNotFoundError:  # a source tree that was never installed (e.g. bazel's runfiles)
        return "0+unknown"
    try:
        major, minor = _loader_module.tensorflow_minor(_loader_module.built_tensorflow_version())
    except LibraryLoadError:  # no build record: the libraries were never built here
        return declared
    return f"{declared}+tf{major}{minor}"


__version__ = _version()

# Public name -> (module, attribute or None for the module itself).
_LAZY: dict[str, tuple[str, str | None]] = {
    "config": ("tf_embed_ops.config", None),
    "optimizers": ("tf_embed_ops.optimizers", None),
    "keras": ("tf_embed_ops.keras", None),
    "serving": ("tf_embed_ops.serving", None),
    "distribute": ("tf_embed_ops.distribute", None),
    "dynamic": ("tf_embed_ops.dynamic", None),
    "DynamicTableConfig": ("tf_embed_ops.dynamic.config", "DynamicTableConfig"),
    "tiered": ("tf_embed_ops.tiered", None),
    "Tiered": ("tf_embed_ops.tiered.config", "Tiered"),
    "SparseConditionalAccumulator": ("tf_embed_ops.sparse_accumulator", "SparseConditionalAccumulator"),
    "TPUEmbedding": ("tf_embed_ops.tpu_embedding", "TPUEmbedding"),
    "TableConfig": ("tf_embed_ops.table_config", "TableConfig"),
    "TPUEmbeddingV2": ("tf_embed_ops.tpu_embedding_v2", "TPUEmbeddingV2"),
    "sparse_core": ("tf_embed_ops.sparse_core", None),
    "tracking": ("tf_embed_ops.tracking", None),
    "checkpoint": ("tf_embed_ops.checkpoint", None),
    "FeatureInput": ("tf_embed_ops.embedding_ops", "FeatureInput"),
    "normalize_feature": ("tf_embed_ops.embedding_ops", "normalize_feature"),
    "embedding_activations": ("tf_embed_ops.embedding_ops", "embedding_activations"),
    "send_tpu_embedding_gradients": ("tf_embed_ops.embedding_ops", "send_tpu_embedding_gradients"),
    "embedding_lookup_and_update": ("tf_embed_ops.embedding_ops", "embedding_lookup_and_update"),
    "adam_bias_corrected_learning_rate": ("tf_embed_ops.embedding_ops", "adam_bias_corrected_learning_rate"),
}

__all__ = ["LibraryLoadError", "get_library_path", "ops", *_LAZY]


def __getattr__(name: str) -> Any:
    if name == "ops":
        from tf_embed_ops import _loader

        return _loader.load_ops()
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        module = importlib.import_module(module_name)
        if "tensorflow" in sys.modules:
            # AutoGraph must see the package as library code before a user's tf.function reaches it (_tf_compat).
            importlib.import_module("tf_embed_ops._tf_compat")
        value = module if attribute is None else getattr(module, attribute)
        globals()[name] = value  # resolve once
        return value
    raise AttributeError(f"module 'tf_embed_ops' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# `keras.models.load_model` finds our layers (`tf_embed_ops>TPUEmbedding`, `tf_embed_ops>DistributedEmbedding`) and
# Keras objects by their registered names, which `tf_embed_ops.keras` registers when it is imported. Importing Keras
# here would cost its whole import (seconds, TensorFlow included), so: when Keras and TensorFlow are loaded already
# (importing TensorFlow imports Keras), `tf_embed_ops.keras` is imported now; otherwise as soon as they are, by a
# finder that watches the two and this package's own modules. It registers once no import of either package, and
# none of this package's modules, is still running: `import tf_embed_ops.config` imports TensorFlow half way through,
# and importing `tf_embed_ops.keras` then would import `tf_embed_ops.config` again, half made.
_KERAS_PACKAGES = ("keras", "tensorflow")
_PACKAGE_PREFIX = __name__ + "."


def _register_keras_serializables() -> None:
    importlib.import_module("tf_embed_ops.keras")  # its classes register themselves with Keras
    importlib.import_module("tf_embed_ops._tf_compat")  # AutoGraph sees the package as library code (__getattr__)


def _initializing(module: Any) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _may_register(finished: Any) -> bool:
    """Whether Keras and TensorFlow are loaded, and no import of them or of this package's modules (other than
    `finished`, whose import is ending) still runs."""
    if not all(p in sys.modules for p in _KERAS_PACKAGES):
        return False
    return not any(
        (name in _KERAS_PACKAGES or name == __name__ or name.startswith(_PACKAGE_PREFIX))
        and module is not finished
        and _initializing(module)
        for name, module in list(sys.modules.items())
    )


class _RegisteringLoader(importlib.abc.Loader):
    """The real loader of `keras`, `tensorflow` or one of this package's modules; registers the Keras classes when
    the import it ran was the last one running (`_may_register`)."""

    def __init__(self, loader: Any, watcher: _KerasImportWatcher):
        self._loader = loader
        self._watcher = watcher

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        if self._watcher in sys.meta_path and _may_register(module):
            sys.meta_path.remove(self._watcher)  # registered once: nothing left to watch
            _register_keras_serializables()

    def __getattr__(self, name: str) -> Any:  # everything else (resources, get_data, ...) is the real loader's
        return getattr(self._loader, name)


class _KerasImportWatcher(importlib.abc.MetaPathFinder):
    """Hands `keras`, `tensorflow` and this package's modules their own specs with a `_RegisteringLoader`; leaves
    once it has registered."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _KERAS_PACKAGES and not fullname.startswith(_PACKAGE_PREFIX):
            return None
        for finder in list(sys.meta_path):  # the spec the other finders give
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisteringLoader(spec.loader, self)
                return spec
        return None


if all(p in sys.modules for p in _KERAS_PACKAGES):
    _register_keras_serializables()
elif not any(isinstance(f, _KerasImportWatcher) for f in sys.meta_path):
    sys.meta_path.insert(0, _KerasImportWatcher())
