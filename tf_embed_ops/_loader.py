"""The only place that loads tf_embed_ops' shared objects.

Loading is lazy (importing ``tf_embed_ops`` costs nothing until an op or the config parser is used) and
checked: before ``tf.load_op_library`` runs, the TensorFlow version the library was compiled against (written
by the build into ``_build_info.json``) is compared with the running one.  A C++ op library built for another
TensorFlow fails in obscure ways (undefined symbols, or worse, a crash in a kernel), so a mismatch is an error
that says both versions and how to rebuild, never a warning.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import threading
import types

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# Built as a setuptools extension, so it carries the interpreter's suffix; it is loaded with dlopen by
# tf.load_op_library, never imported.
_OP_LIBRARY_NAME = "_tf_embed_ops" + importlib.machinery.EXTENSION_SUFFIXES[0]
_BUILD_INFO_NAME = "_build_info.json"
_REBUILD_HINT = (
    "Rebuild tf_embed_ops against the installed TensorFlow: `pip install --force-reinstall --no-deps .` from the "
    "source tree (or `python setup.py build_ext --inplace` for a development checkout)."
)

_lock = threading.Lock()
_ops_module: types.ModuleType | None = None
_config_module: types.ModuleType | None = None


class LibraryLoadError(ImportError):
    """The compiled part of tf_embed_ops is missing, or was built for another TensorFlow."""


def get_library_path() -> str:
    """Returns the path of the op library, for ``tf.load_op_library`` in a user's own model.

    Raises:
      LibraryLoadError: if the library was not built, or was built against another TensorFlow version.
    """
    path = os.path.join(_PACKAGE_DIR, _OP_LIBRARY_NAME)
    if not os.path.exists(path):
        raise LibraryLoadError(
            f"tf_embed_ops op library not found at {path}: the package was not built. {_REBUILD_HINT}"
        )
    _check_tensorflow_version()
    return path


def built_tensorflow_version() -> str:
    """The TensorFlow version the compiled libraries were built against."""
    path = os.path.join(_PACKAGE_DIR, _BUILD_INFO_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)["tensorflow_version"]
    except (OSError, ValueError, KeyError) as e:
        raise LibraryLoadError(
            f"tf_embed_ops build record {path} is missing or unreadable ({e}). {_REBUILD_HINT}"
        ) from e


def _check_tensorflow_version() -> None:
    import tensorflow as tf

    built = built_tensorflow_version()
    if built != tf.__version__:
        raise LibraryLoadError(
            f"tf_embed_ops was built against TensorFlow {built}, but TensorFlow {tf.__version__} is installed; "
            f"a custom-op library only works with the TensorFlow it was compiled for. {_REBUILD_HINT}"
        )


def load_ops() -> types.ModuleType:
    """Loads (once) and returns the op module produced by ``tf.load_op_library``."""
    global _ops_module
    if _ops_module is None:
        with _lock:
            if _ops_module is None:
                import tensorflow as tf

                from tf_embed_ops import _tf_compat

                # Before any of our functions can be traced: the package is library code to AutoGraph, as
                # TensorFlow's own modules are (see _tf_compat).
                _tf_compat.exclude_from_autograph()
                path = get_library_path()
                _ops_module = tf.load_op_library(path)
    return _ops_module


def load_config_module() -> types.ModuleType:
    """Loads (once) the pybind11 module exposing the C++ config parser and validator (cc/config)."""
    global _config_module
    if _config_module is None:
        with _lock:
            if _config_module is None:
                # The module's protobuf and absl code lives in TensorFlow's shared libraries, which importing
                # tensorflow loads into the process first.
                import tensorflow  # noqa: F401

                _check_tensorflow_version()
                try:
                    _config_module = importlib.import_module("tf_embed_ops._config")
                except ImportError as e:
                    raise LibraryLoadError(
                        f"tf_embed_ops config module could not be loaded: {e}. {_REBUILD_HINT}"
                    ) from e
    return _config_module
