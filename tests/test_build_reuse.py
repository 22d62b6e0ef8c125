"""The pip build reuses its objects and shows progress (setup.py, configure.write_ninja).

pip's build isolation installs TensorFlow and pybind11 under a new random /tmp path for every install; the
compile commands must not change with it, or ninja (and ccache) would recompile the whole library each time.
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import configure  # noqa: E402


def _setup_module():
    spec = importlib.util.spec_from_file_location("tf_embed_ops_setup", os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # setup() itself only runs as __main__
    return module


def _config(prefix: str, version: str = "2.21.0") -> dict:
    include, lib = f"{prefix}/tensorflow/include", f"{prefix}/tensorflow"
    return {
        "tf_version": version,
        "include_dir": include,
        "lib_dir": lib,
        "compile_flags": [f"-I{include}", "-D_GLIBCXX_USE_CXX11_ABI=1", "--std=c++17", "-DEIGEN_MAX_ALIGN_BYTES=64"],
        "link_flags": [f"-L{lib}", "-l:libtensorflow_framework.so.2", "-l:libtensorflow_cc.so.2"],
    }


def _rules(ninja_file: str) -> dict:
    with open(ninja_file, encoding="utf-8") as f:
        return dict(re.findall(r"^(cflags|pyflags|ldflags) = (.*)$", f.read(), re.M))


@pytest.fixture()
def fake_installs(tmp_path):
    """Two TensorFlow 'installations' at different random-looking paths, as two pip builds would see."""
    prefixes = [str(tmp_path / "pip-build-env-a1b2"), str(tmp_path / "pip-build-env-z9y8")]
    for p in prefixes:
        os.makedirs(f"{p}/tensorflow/include")
    return prefixes


def test_compile_commands_do_not_depend_on_where_pip_put_tensorflow(tmp_path, fake_installs):
    build_dir = str(tmp_path / "build")
    out = [str(tmp_path / "a.so"), str(tmp_path / "b.so")]
    first = _rules(configure.write_ninja(build_dir, *out, _config(fake_installs[0])))
    second = _rules(configure.write_ninja(build_dir, *out, _config(fake_installs[1])))
    assert first == second  # compile and link commands: ninja has nothing to do for an unchanged tree
    assert fake_installs[1] not in " ".join(first.values())
    # The stable link now points at the second installation.
    assert os.readlink(os.path.join(build_dir, "sys", "tensorflow_include")) == f"{fake_installs[1]}/tensorflow/include"


def test_third_party_headers_are_system_headers_and_ours_are_not(tmp_path, fake_installs):
    rules = _rules(configure.write_ninja(str(tmp_path / "b"), "x.so", "y.so", _config(fake_installs[0])))
    flags = rules["pyflags"].split()
    assert f"-isystem{tmp_path}/b/sys/tensorflow_include" in flags  # TensorFlow: warnings silenced
    assert flags[flags.index(f"{tmp_path}/b/sys/pybind11_include") - 1] == "-isystem"
    assert f"-I{configure.ROOT}" in flags  # ours: warnings shown
    assert not [f for f in flags if f.startswith("-I") and "include" in f]


def test_build_directory_is_keyed_by_version_and_flags_not_by_paths(fake_installs, monkeypatch):
    setup = _setup_module()
    python = configure.python_build_config()
    a = setup.ninja_build_dir(_config(fake_installs[0]), python, root="/src")
    assert a.startswith("/src/build/ninja/tf2.21.0-")
    assert a == setup.ninja_build_dir(_config(fake_installs[1]), python, root="/src")
    assert a != setup.ninja_build_dir(_config(fake_installs[0], version="2.22.0"), python, root="/src")
    monkeypatch.setenv("TF_EMBED_OPS_CXXFLAGS", "-march=native")
    assert a != setup.ninja_build_dir(_config(fake_installs[0]), python, root="/src")


def test_progress_lines_reach_the_terminal_and_everything_reaches_stdout(capsys):
    setup = _setup_module()
    terminal = io.StringIO()
    script = "print('[1/2] CXX cc/a.cc'); print('warning: ours'); print('[2/2] LINK x.so')"
    setup.run_ninja([sys.executable, "-c", script], terminal=terminal)
    assert terminal.getvalue() == "  [1/2] CXX cc/a.cc\n  [2/2] LINK x.so\n"
    assert capsys.readouterr().out == "[1/2] CXX cc/a.cc\nwarning: ours\n[2/2] LINK x.so\n"
    with pytest.raises(subprocess.CalledProcessError):
        setup.run_ninja([sys.executable, "-c", "import sys; print('error: x'); sys.exit(1)"], terminal=io.StringIO())


def test_progress_can_be_turned_off(monkeypatch):
    setup = _setup_module()
    monkeypatch.setenv("TF_EMBED_OPS_PROGRESS", "0")
    assert setup._terminal() is None


def test_installing_a_library_makes_a_new_file_instead_of_rewriting_the_loaded_one(tmp_path):
    """A test run during a reinstall has the old library mapped: rewriting it in place would break that run."""
    setup = _setup_module()
    source, target = tmp_path / "new.so", tmp_path / "lib.so"
    source.write_bytes(b"new")
    target.write_bytes(b"old")
    with open(target, "rb") as loaded:
        setup.replace_file(str(source), str(target))
        assert loaded.read() == b"old"  # the open (mapped) file is untouched
    assert target.read_bytes() == b"new" and not os.path.exists(str(target) + ".tmp")


def test_sources_of_both_libraries_compile_once(tmp_path, fake_installs):
    """cc/lib and cc/config are in the op library and the config module: one object each, linked into both (every
    build, pip's, the sanitizers' and each TensorFlow minor's, compiles them once)."""
    ninja_file = configure.write_ninja(str(tmp_path / "b"), "op.so", "config.so", _config(fake_installs[0]))
    with open(ninja_file, encoding="utf-8") as f:
        text = f.read()
    compiled = re.findall(r"^build \S+: cxx (\S+)$", text, re.M)
    assert len(compiled) == len(set(compiled))
    every = set(configure.sources(configure.OP_LIBRARY_SOURCES)) | set(
        configure.sources(configure.CONFIG_MODULE_SOURCES)
    )
    assert set(compiled) == every
    links = dict(re.findall(r"^build (\S+): link (.*?)(?: \|.*)?$", text, re.M))
    op_objects, config_objects = set(links["op.so"].split()), set(links["config.so"].split())
    shared = sorted(o for o in op_objects & config_objects)
    lib = configure.sources(["cc/lib/*.cc", "cc/config/*.cc"])
    assert len(shared) == len(lib) and all("/op/cc/" in o for o in shared)
    assert [o for o in config_objects - op_objects if "/cc/python/" not in o] == []
