"""The version is written once (pyproject.toml's [tool.tf_embed_ops]) and tf_embed_ops.__version__ reports it,
with the TensorFlow minor the libraries were built for as its local label (0.1.0+tf221)."""

from __future__ import annotations

import pathlib
import re

import pytest

import tf_embed_ops
from tf_embed_ops import _loader


def test_version_comes_from_pyproject_and_names_the_tensorflow_minor():
    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("run from an installed wheel: no source tree beside the tests")
    text = pyproject.read_text(encoding="utf-8")
    section = text[text.index("[tool.tf_embed_ops]") :]
    declared = re.search(r'^version = "([^"]+)"$', section, re.MULTILINE).group(1)
    if tf_embed_ops.__version__ == "0+unknown":
        pytest.skip("tf_embed_ops is not installed here (no package metadata to read the version from)")
    major, minor = _loader.built_tensorflow_version().split(".")[:2]
    assert tf_embed_ops.__version__ == f"{declared}+tf{major}{minor}"
