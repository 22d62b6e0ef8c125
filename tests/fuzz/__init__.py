"""Seeded, bounded fuzzers of tf_embed_ops' untrusted inputs (docs/reliability.md).

Five targets: ``config`` (wire-format bytes and text of a TPUEmbeddingConfiguration), ``ops`` (the fused
embedding ops' inputs), ``accumulator`` (the sparse conditional accumulator), ``dynamic`` (the dynamic-table ops,
``DynamicTable`` and ``te.TPUEmbedding`` with dynamic tables) and ``low_precision`` (16-bit tables through the
ops and ``te.TPUEmbedding``).  Each checks that nothing
crashes or hangs, that every rejection is a documented error, and that a rejected call changes no state.

    python -m tests.fuzz --minutes 10               # all targets, time shared out, seed 0
    python -m tests.fuzz --target ops --seconds 60 --seed 7

``tests/fuzz/test_fuzz.py`` runs each for a short fixed budget under pytest (marked slow).
"""

import os
import sys

# The fuzzers reuse the suites' helpers (tests/*.py are top-level modules there).
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


def _config():
    from . import config_fuzz

    return config_fuzz


def _ops():
    from . import ops_fuzz

    return ops_fuzz


def _accumulator():
    from . import accumulator_fuzz

    return accumulator_fuzz


def _dynamic():
    from . import dynamic_fuzz

    return dynamic_fuzz


def _low_precision():
    from . import low_precision_fuzz

    return low_precision_fuzz


# Target name -> its module (imported on use: each pulls in TensorFlow).
TARGETS = {
    "config": _config,
    "ops": _ops,
    "accumulator": _accumulator,
    "dynamic": _dynamic,
    "low_precision": _low_precision,
}
