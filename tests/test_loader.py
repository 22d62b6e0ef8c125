"""The loader: lazy, version-checked, and usable through tf.load_op_library in a fresh process."""

import json
import os
import subprocess
import sys

import pytest

import tf_embed_ops
from tf_embed_ops import _loader


def test_library_path_exists_and_is_the_op_library():
    path = tf_embed_ops.get_library_path()
    assert os.path.isfile(path)
    assert os.path.basename(path).startswith("_tf_embed_ops")


@pytest.mark.slow
def test_load_op_library_in_a_new_process():
    code = (
        "import tensorflow as tf, tf_embed_ops\n"
        "m = tf.load_op_library(tf_embed_ops.get_library_path())\n"
        "print(type(m).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "module"


def test_import_does_not_load_the_library():
    code = "import sys, tf_embed_ops\nprint('tensorflow' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_version_mismatch_names_both_versions_and_the_fix(tmp_path, monkeypatch):
    import tensorflow as tf

    (tmp_path / "_build_info.json").write_text(json.dumps({"tensorflow_version": "1.15.0"}))
    lib = os.path.basename(tf_embed_ops.get_library_path())
    (tmp_path / lib).write_bytes(b"")
    monkeypatch.setattr(_loader, "_PACKAGE_DIR", str(tmp_path))
    with pytest.raises(_loader.LibraryLoadError) as err:
        _loader.get_library_path()
    message = str(err.value)
    assert "1.15.0" in message and tf.__version__ in message and "Rebuild" in message


def test_missing_build_record_is_an_error(tmp_path, monkeypatch):
    lib = os.path.basename(tf_embed_ops.get_library_path())
    (tmp_path / lib).write_bytes(b"")
    monkeypatch.setattr(_loader, "_PACKAGE_DIR", str(tmp_path))
    with pytest.raises(_loader.LibraryLoadError, match="build record"):
        _loader.get_library_path()


def test_missing_library_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(_loader, "_PACKAGE_DIR", str(tmp_path))
    with pytest.raises(_loader.LibraryLoadError, match="not found"):
        _loader.get_library_path()
