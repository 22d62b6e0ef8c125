"""tf_embed_ops' PEP 517 build backend: setuptools' own, plus one decision, which TensorFlow to build against.

The op library is compiled against a TensorFlow and only works with that one (its minor), so the build uses the
TensorFlow already installed in the environment being installed into. pip runs a backend with the target
environment's interpreter (``sys.executable``) but hides that environment's packages from it (build isolation);
a child ``sys.executable -I`` sees them (configure.installed_tf_version). When the environment has a TensorFlow,
the build asks for nothing more than setuptools' requirements (no second TensorFlow is downloaded, and the user's
is kept, whichever distribution it is: ``tensorflow``, ``tensorflow-cpu``...); when it has none (a fresh machine,
``pip install ".[cpu]"``), it asks for the newest supported ``tensorflow-cpu`` in the build environment, the one
the ``cpu`` extra then installs beside the package.

pyproject.toml names this module (``build-backend = "pep517_backend"``, ``backend-path = ["tools"]``).
"""

from __future__ import annotations

import os
import sys

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401  (the hooks this backend leaves to setuptools)
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import configure


def tensorflow_build_requirements() -> list[str]:
    """[] when the environment being installed into has a TensorFlow (the build uses it), else the newest
    supported tensorflow-cpu for the build environment."""
    if configure.installed_tf_version() is not None:
        return []
    return [configure.tf_requirement("tensorflow-cpu")]


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + tensorflow_build_requirements()


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) + tensorflow_build_requirements()
