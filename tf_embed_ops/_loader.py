"""The only place that loads tf_embed_ops' shared objects.

Loading is lazy (importing ``tf_embed_ops`` costs nothing until an op or the config parser is used) and
checked: the build writes what it compiled against into ``_build_info.json`` (the TensorFlow version, its ABI
flags, where to rebuild from), and a C++ op library built for another TensorFlow fails in obscure ways
(undefined symbols, or worse, a crash in a kernel). So a mismatch is an error that says both versions and the
command that rebuilds, never a warning: at ``import tf_embed_ops`` when the installed TensorFlow distribution is of
another minor (read from its package metadata, without importing TensorFlow), and before the library is loaded
against the running TensorFlow (minor and ABI flags; a patch release keeps TensorFlow's C++ interface).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import os
import shlex
import sys
import threading
import types
from importlib import metadata

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# Built as a setuptools extension, so it carries the interpreter's suffix; it is loaded with dlopen by
# tf.load_op_library, never imported.
_OP_LIBRARY_NAME = "_tf_embed_ops" + importlib.machinery.EXTENSION_SUFFIXES[0]
_BUILD_INFO_NAME = "_build_info.json"
# The distributions that install the `tensorflow` package (the build looks them up with this module too).
_TF_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-intel",
    "tensorflow-aarch64",
    "tf-nightly",
    "tf-nightly-cpu",
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
            f"tf_embed_ops op library not found at {path}: the package was not built. "
            f"{rebuild_hint(_build_info_or_empty())}"
        )
    _check_tensorflow_version()
    return path


def build_info() -> dict:
    """What the compiled libraries were built against: ``tensorflow_version``, ``abi_flags`` and, from a pip or
    setup.py build, ``source_dir`` and ``editable`` (from bazel: ``rebuild``, the rebuild instructions)."""
    path = os.path.join(_PACKAGE_DIR, _BUILD_INFO_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
        str(info["tensorflow_version"])
        return info
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LibraryLoadError(
            f"tf_embed_ops build record {path} is missing or unreadable ({e}). {rebuild_hint({})}"
        ) from e


def built_tensorflow_version() -> str:
    """The TensorFlow version the compiled libraries were built against."""
    return build_info()["tensorflow_version"]


def _build_info_or_empty() -> dict:
    try:
        return build_info()
    except LibraryLoadError:
        return {}


def tensorflow_minor(version: str) -> tuple[int, int]:
    """(major, minor) of a TensorFlow version ("2.21.0" -> (2, 21), "2.22.0rc1" -> (2, 22)); (-1, -1) if unparsable.
    The build (configure.py) uses it too."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()))
    except (IndexError, ValueError):
        return (-1, -1)


def rebuild_hint(info: dict) -> str:
    """The command that rebuilds the libraries against the TensorFlow installed for this interpreter."""
    if info.get("rebuild"):
        return f"Rebuild: {info['rebuild']}."
    python = shlex.quote(sys.executable)
    source = info.get("source_dir")
    if source and os.path.isfile(os.path.join(source, "setup.py")):
        editable = "-e " if info.get("editable") else ""
        return (
            "Rebuild tf_embed_ops against the installed TensorFlow (it builds against the TensorFlow of the "
            f"environment it installs into): `{python} -m pip install --no-deps --force-reinstall "
            f"{editable}{shlex.quote(source)}`."
        )
    return (
        "Rebuild tf_embed_ops from its source tree against the installed TensorFlow: "
        f"`{python} -m pip install --no-deps --force-reinstall <path to the tf_embed_ops source>` (or install the "
        "tf_embed_ops wheel built for the installed TensorFlow's minor: its version ends in +tf<major><minor>)."
    )


def _mismatch(built: str, running: str, info: dict, what: str = "") -> LibraryLoadError:
    return LibraryLoadError(
        f"tf_embed_ops was built against TensorFlow {built}, but TensorFlow {running} is installed{what} "
        f"(for {sys.executable}); a custom-op library only works with the TensorFlow minor (and ABI) it was "
        f"compiled for. {rebuild_hint(info)}"
    )


def installed_tensorflow_version() -> str | None:
    """The version of the installed TensorFlow distribution (package metadata; TensorFlow is not imported)."""
    if importlib.util.find_spec("tensorflow") is None:
        return None
    for name in _TF_DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_installed_tensorflow() -> None:
    """At ``import tf_embed_ops``: refuses at once when the installed TensorFlow is of another minor than the one
    the libraries were built for. Without a build record or a TensorFlow it does nothing here: the first use says
    what is missing."""
    path = os.path.join(_PACKAGE_DIR, _BUILD_INFO_NAME)
    if not os.path.exists(path):
        return
    info = build_info()
    running = installed_tensorflow_version()
    if running is not None and tensorflow_minor(running) != tensorflow_minor(info["tensorflow_version"]):
        raise _mismatch(info["tensorflow_version"], running, info)


def _check_tensorflow_version() -> None:
    try:
        import tensorflow as tf
    except ModuleNotFoundError as e:
        raise LibraryLoadError(
            "tf_embed_ops needs TensorFlow, and none is installed for "
            f"{sys.executable}: install the one it was built for "
            f'(`pip install "tensorflow-cpu=={".".join(built_tensorflow_version().split(".")[:2])}.*"`, or '
            "`tensorflow`), or install tf_embed_ops with its `cpu` extra"
        ) from e

    info = build_info()
    built = info["tensorflow_version"]
    if tensorflow_minor(built) != tensorflow_minor(tf.__version__):
        raise _mismatch(built, tf.__version__, info)
    running_abi = [flag for flag in tf.sysconfig.get_compile_flags() if not flag.startswith("-I")]
    if "abi_flags" in info and info["abi_flags"] != running_abi:
        raise _mismatch(
            built,
            tf.__version__,
            info,
            f" with other ABI flags ({' '.join(running_abi)}; built with {' '.join(info['abi_flags'])})",
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
                        f"tf_embed_ops config module could not be loaded: {e}. {rebuild_hint(_build_info_or_empty())}"
                    ) from e
    return _config_module
