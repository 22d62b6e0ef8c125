"""The version is written once (pyproject.toml) and tf_embed_ops.__version__ reports it."""

from __future__ import annotations

import pathlib
import re

import pytest

import tf_embed_ops


def test_version_comes_from_pyproject():
    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    # [project]'s `version = "..."` (tomllib is Python 3.11+; the package supports 3.10).
    declared = re.search(r'^version = "([^"]+)"$', pyproject.read_text(encoding="utf-8"), re.MULTILINE).group(1)
    if tf_embed_ops.__version__ == "0+unknown":
        pytest.skip("tf_embed_ops is not installed here (no package metadata to read the version from)")
    assert tf_embed_ops.__version__ == declared
