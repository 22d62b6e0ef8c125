"""Runs one pytest file as a bazel py_test: `pytest_main.py tests/test_x.py [pytest args]`.

Bazel runs a test from its read-only runfiles tree, so pytest must not write its cache or .pyc files there;
the exit status is pytest's (0 = passed).
"""
import sys

import pytest

if __name__ == "__main__":
    sys.dont_write_bytecode = True
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
