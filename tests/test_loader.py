"""The loader: lazy, version-checked, and usable through tf.load_op_library in a fresh process."""

import json
import os
import re
import shutil
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


def _fake_build(tmp_path, monkeypatch, **info):
    """A package directory whose build record says `info` (over this build's version and ABI flags), with an empty
    library."""
    real = _loader.build_info()
    record = {"tensorflow_version": real["tensorflow_version"], "abi_flags": real["abi_flags"], **info}
    (tmp_path / "_build_info.json").write_text(json.dumps(record))
    lib = os.path.basename(tf_embed_ops.get_library_path())
    (tmp_path / lib).write_bytes(b"")
    monkeypatch.setattr(_loader, "_PACKAGE_DIR", str(tmp_path))


def test_version_mismatch_names_both_versions_and_the_rebuild_command(tmp_path, monkeypatch):
    import tensorflow as tf

    _fake_build(tmp_path, monkeypatch, tensorflow_version="2.15.0", source_dir=str(tmp_path), editable=False)
    (tmp_path / "setup.py").write_text("")  # a source tree to rebuild from
    with pytest.raises(_loader.LibraryLoadError) as err:
        _loader.get_library_path()
    message = str(err.value)
    assert "built against TensorFlow 2.15.0" in message and f"TensorFlow {tf.__version__} is installed" in message
    assert f"`{sys.executable} -m pip install --no-deps --force-reinstall {tmp_path}`" in message


def test_rebuild_command_of_an_editable_build_reinstalls_it_editable(tmp_path, monkeypatch):
    _fake_build(tmp_path, monkeypatch, tensorflow_version="2.15.0", source_dir=str(tmp_path), editable=True)
    (tmp_path / "setup.py").write_text("")
    with pytest.raises(_loader.LibraryLoadError, match=re.escape(f"--force-reinstall -e {tmp_path}`")):
        _loader.get_library_path()


def test_rebuild_advice_without_the_source_tree_names_the_wheel_or_a_checkout(tmp_path, monkeypatch):
    _fake_build(tmp_path, monkeypatch, tensorflow_version="2.15.0", source_dir=str(tmp_path / "gone"))
    with pytest.raises(_loader.LibraryLoadError) as err:
        _loader.get_library_path()
    assert "<path to the tf_embed_ops source>" in str(err.value) and "+tf<major><minor>" in str(err.value)


def test_another_patch_release_of_the_same_minor_loads(tmp_path, monkeypatch):
    import tensorflow as tf

    major, minor = tf.__version__.split(".")[:2]
    _fake_build(tmp_path, monkeypatch, tensorflow_version=f"{major}.{minor}.99")
    assert _loader.get_library_path() == str(tmp_path / os.path.basename(_loader._OP_LIBRARY_NAME))


def test_other_abi_flags_are_a_mismatch_too(tmp_path, monkeypatch):
    _fake_build(tmp_path, monkeypatch, abi_flags=["-D_GLIBCXX_USE_CXX11_ABI=0", "--std=c++17"])
    with pytest.raises(_loader.LibraryLoadError, match="other ABI flags .*built with -D_GLIBCXX_USE_CXX11_ABI=0"):
        _loader.get_library_path()


def test_build_record_of_this_build_matches_the_running_tensorflow():
    import tensorflow as tf

    info = _loader.build_info()
    assert info["tensorflow_version"].split(".")[:2] == tf.__version__.split(".")[:2]
    assert info["abi_flags"] == [f for f in tf.sysconfig.get_compile_flags() if not f.startswith("-I")]


def test_missing_tensorflow_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # `import tensorflow` now raises ModuleNotFoundError
    with pytest.raises(
        _loader.LibraryLoadError, match=r"none is installed .*tensorflow-cpu==\d+\.\d+\.\*.*`cpu` extra"
    ):
        _loader.get_library_path()


def test_import_fails_at_once_under_another_tensorflow_minor(tmp_path):
    """`import tf_embed_ops` itself (TensorFlow not imported) refuses a build for another minor than the installed
    distribution's, naming both versions and the rebuild command."""
    package = tmp_path / "tf_embed_ops"
    shutil.copytree(_loader._PACKAGE_DIR, package, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (package / "_build_info.json").write_text(
        json.dumps({"tensorflow_version": "2.15.0", "abi_flags": [], "source_dir": "/nonexistent"})
    )
    code = "import sys, tf_embed_ops"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode != 0
    installed = _loader.installed_tensorflow_version()
    assert "LibraryLoadError: tf_embed_ops was built against TensorFlow 2.15.0" in out.stderr
    assert (
        f"TensorFlow {installed} is installed" in out.stderr and "pip install --no-deps --force-reinstall" in out.stderr
    )
    # The same package with a record of the installed minor imports (without importing TensorFlow).
    (package / "_build_info.json").write_text(json.dumps({"tensorflow_version": installed, "abi_flags": []}))
    code = "import sys, tf_embed_ops; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.strip() == "False"


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


def test_rebuild_advice_of_a_bazel_build_is_its_own():
    assert _loader.rebuild_hint({"rebuild": "python3 configure.py, then bazel build again", "source_dir": "/x"}) == (
        "Rebuild: python3 configure.py, then bazel build again."
    )
