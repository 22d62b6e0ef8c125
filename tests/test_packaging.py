"""Packaging: the build uses the environment's TensorFlow (tools/pep517_backend.py, configure.py), the version
names the TensorFlow minor, the supported range is declared once, and the build refuses a TensorFlow outside it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.exists(os.path.join(ROOT, "configure.py")):
    pytest.skip("run from an installed wheel: the build files are not beside the tests", allow_module_level=True)
sys.path.insert(0, ROOT)
import configure  # noqa: E402


def _module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pyproject() -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        return f.read()


def test_extras_install_the_supported_range_and_nothing_requires_tensorflow():
    text = _pyproject()
    assert f'cpu = ["{configure.tf_requirement("tensorflow-cpu")}"]' in text
    assert f'tensorflow = ["{configure.tf_requirement("tensorflow")}"]' in text
    assert configure.tf_requirement("tensorflow-cpu") == "tensorflow-cpu>=2.16,<2.22"
    dependencies = text[text.index("dependencies = [") : text.index("[project.optional-dependencies]")]
    build_requires = text[text.index("[build-system]") : text.index("[project]")]
    assert "tensorflow" not in re.sub(r"#.*", "", dependencies)
    assert "tensorflow" not in re.sub(r"#.*", "", build_requires)


def test_build_asks_for_tensorflow_only_when_the_environment_has_none(monkeypatch):
    backend = _module("pep517_backend_under_test", os.path.join(ROOT, "tools", "pep517_backend.py"))
    monkeypatch.setattr(backend.configure, "installed_tf_version", lambda: "2.18.1")
    assert backend.tensorflow_build_requirements() == []
    monkeypatch.setattr(backend.configure, "installed_tf_version", lambda: None)
    assert backend.tensorflow_build_requirements() == ["tensorflow-cpu>=2.16,<2.22"]


def test_the_build_sees_the_environment_tensorflow_through_pip_build_isolation(tmp_path):
    """pip hides the environment's site-packages from the backend (a sitecustomize on PYTHONPATH, as here); the
    version lookup must still find the environment's TensorFlow, which is what the library is built against."""
    import tensorflow as tf

    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nsys.path[:] = [p for p in sys.path if 'site-packages' not in p]\n", encoding="utf-8"
    )
    code = textwrap.dedent(
        f"""
        import importlib.util, sys
        sys.path.insert(0, {ROOT!r})
        import configure
        assert importlib.util.find_spec("tensorflow") is None, "the isolation did not hide TensorFlow"
        print(configure.installed_tf_version())
        """
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == tf.__version__


def test_package_version_names_the_tensorflow_minor(monkeypatch):
    setup = _module("tf_embed_ops_setup_version", os.path.join(ROOT, "setup.py"))
    base = re.search(r'^version = "([^"]+)"$', _pyproject()[_pyproject().index("[tool.tf_embed_ops]") :], re.M)[1]
    monkeypatch.setattr(setup.configure, "installed_tf_version", lambda: "2.16.2")
    assert setup.package_version() == f"{base}+tf216"
    monkeypatch.setattr(setup.configure, "installed_tf_version", lambda: "2.21.0rc1")
    assert setup.package_version() == f"{base}+tf221"
    monkeypatch.setattr(setup.configure, "installed_tf_version", lambda: None)
    assert setup.package_version() == base


@pytest.mark.parametrize("version", ["2.15.1", "2.22.0", "3.0.0"])
def test_build_refuses_a_tensorflow_outside_the_supported_range(version, monkeypatch):
    monkeypatch.delenv("TF_EMBED_OPS_ALLOW_UNSUPPORTED_TF", raising=False)
    with pytest.raises(
        RuntimeError, match=rf"supports TensorFlow 2\.16 to 2\.21, but the build found TensorFlow {version}"
    ):
        configure.check_supported(version)
    monkeypatch.setenv("TF_EMBED_OPS_ALLOW_UNSUPPORTED_TF", "1")
    configure.check_supported(version)


@pytest.mark.parametrize("version", ["2.16.0", "2.18.1", "2.21.0"])
def test_build_accepts_the_supported_minors(version):
    configure.check_supported(version)


def test_build_record_holds_the_version_abi_flags_and_source(tmp_path):
    config = {
        "tf_version": "2.19.1",
        "compile_flags": ["-I/x/include", "-D_GLIBCXX_USE_CXX11_ABI=1", "--std=c++17", "-DEIGEN_MAX_ALIGN_BYTES=64"],
    }
    configure.write_build_info(str(tmp_path), config, source_dir="/src", editable=True)
    import json

    info = json.loads((tmp_path / "_build_info.json").read_text())
    assert info == {
        "tensorflow_version": "2.19.1",
        "abi_flags": ["-D_GLIBCXX_USE_CXX11_ABI=1", "--std=c++17", "-DEIGEN_MAX_ALIGN_BYTES=64"],
        "source_dir": "/src",
        "editable": True,
    }


def test_version_matrix_covers_every_supported_minor_at_a_patch_release():
    matrix = _module("version_matrix_under_test", os.path.join(ROOT, "tools", "version_matrix.py"))
    assert matrix.supported_minors() == [(2, m) for m in range(16, 22)]
    assert sorted(matrix.LATEST_PATCH) == matrix.supported_minors()
    assert all(configure.minor(v) == m for m, v in matrix.LATEST_PATCH.items())


def test_version_matrix_table_replaces_the_rows_it_ran_and_keeps_the_others(tmp_path):
    matrix = _module("version_matrix_table_under_test", os.path.join(ROOT, "tools", "version_matrix.py"))
    doc = tmp_path / "building.md"
    old_216 = "| tensorflow-cpu 2.16.2 | 3.15.1 | `w216` | 500 s | pass: old | 2026-01-01 00:00 |"
    old_219 = "| tensorflow-cpu 2.19.1 | 3.15.1 | `w219` | 500 s | pass: kept | 2026-01-01 00:00 |"
    doc.write_text(
        f"intro\n{matrix.TABLE_BEGIN}\n{matrix.HEADER[0]}\n{matrix.HEADER[1]}\n{old_219}\n{old_216}\n{matrix.TABLE_END}\nend\n"
    )
    result = {
        "minor": "2.16",
        "tensorflow": "tensorflow-cpu 2.16.2",
        "keras": "3.15.1",
        "wheel": "w.whl",
        "build_seconds": 400,
        "passed": 10,
        "failures": 1,
        "errors": 0,
        "skipped": 2,
        "status": "fail (pytest exit 1)",
        "test_wall_seconds": 99,
        "jobs": 2,
        "date": "2026-12-03 18:00",
    }
    failed = {"minor": "2.17", "tensorflow": "tensorflow-cpu 2.17.1", "failed": "the wheel build failed", "date": "d"}
    matrix.write_table(str(doc), {"2.16": matrix.row(result), "2.17": matrix.row(failed)})
    lines = doc.read_text().splitlines()
    table = lines[lines.index(matrix.TABLE_BEGIN) + 3 : lines.index(matrix.TABLE_END)]
    assert (
        table[0].startswith("| tensorflow-cpu 2.16.2 |")
        and "**fail (pytest exit 1)**: 10 passed, 1 failed, 2 skipped" in table[0]
    )
    assert table[1].startswith("| tensorflow-cpu 2.17.1 |") and "**the wheel build failed**" in table[1]
    assert table[2] == old_219
    assert lines[0] == "intro" and lines[-1] == "end"


def test_version_matrix_counts_xfailed_tests_apart_from_skipped_ones(tmp_path):
    """pytest's JUnit report writes an xfailed test as skipped (type pytest.xfail): the row names them apart."""
    matrix = _module("version_matrix_junit_under_test", os.path.join(ROOT, "tools", "version_matrix.py"))
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="3" tests="10" time="5.0">'
        '<testcase name="a"><skipped type="pytest.xfail" message="by design"/></testcase>'
        '<testcase name="b"><skipped type="pytest.skip" message="needs TensorFlow 2.17"/></testcase>'
        '<testcase name="c"><skipped type="pytest.skip" message="needs TensorFlow 2.17"/></testcase>'
        '<testcase name="d"><failure message="boom"/></testcase></testsuite></testsuites>'
    )
    counts = matrix.junit_counts(str(junit))
    assert (counts["passed"], counts["failures"], counts["skipped"], counts["xfailed"]) == (6, 1, 3, 1)
    result = dict(
        counts, tensorflow="tensorflow-cpu 2.16.2", keras="3.15.1", wheel="w.whl", build_seconds=3, jobs=2, date="d"
    )
    result.update(status="fail (pytest exit 1)", test_wall_seconds=9)
    assert "10 passed" not in matrix.row(result)
    assert ": 6 passed, 1 failed, 2 skipped, 1 xfailed, 9 s (-n 2) |" in matrix.row(result)
