"""Runs one pytest file as a bazel py_test: `pytest_main.py tests/test_x.py [pytest args]`.

Bazel runs a test from its read-only runfiles tree, so pytest must not write its cache or .pyc files there;
the exit status is pytest's (0 = passed).
"""

import os
import sys

import pytest


def _check_package_is_from_runfiles() -> None:
    """Fails unless `tf_embed_ops` is the bazel-built package of this test's runfiles.

    An editable pip install of the same checkout would otherwise be a silent fallback, and the bazel run would
    test setup.py's libraries instead of its own.
    """
    runfiles = os.environ.get("TEST_SRCDIR")
    if not runfiles:
        return
    import tf_embed_ops  # lazy: loads no library and no TensorFlow

    location = os.path.abspath(tf_embed_ops.__file__)
    if not location.startswith(os.path.abspath(runfiles) + os.sep):
        sys.exit(f"tf_embed_ops was imported from {location}, not from the bazel runfiles under {runfiles}")


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    _check_package_is_from_runfiles()
    # A bazel target is one file, run whole: both tiers (pyproject's addopts select only the fast one).
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-m", "slow or not slow", *sys.argv[1:]]))
