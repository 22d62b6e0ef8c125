"""Imports a module of the benchmark suite (`benchmarks/`) from this source tree, for the tests of its pure-Python
pieces; the tree's root is on sys.path only during the import."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def import_benchmark(name: str):
    """`benchmarks.<name>`, imported from ROOT."""
    sys.path.insert(0, ROOT)
    try:
        return __import__(f"benchmarks.{name}", fromlist=[name])
    finally:
        sys.path.remove(ROOT)
