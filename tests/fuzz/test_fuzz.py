"""The fuzzers under pytest, each for a short fixed budget (about three and a half minutes in all; marked slow).
Longer runs: ``python -m tests.fuzz --minutes N``."""

from __future__ import annotations

import pytest

from . import TARGETS

# Seconds per target; seeded, so a failure reproduces with `python -m tests.fuzz --target T --seconds S`.
BUDGET = {"config": 40.0, "ops": 50.0, "accumulator": 30.0, "dynamic": 45.0, "low_precision": 35.0}


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_target(target):
    report = TARGETS[target]().run(BUDGET[target], seed=0)
    print(report.summary())
    assert report.inputs > 0
    assert report.rejected > 0, "the fuzzer produced no invalid input: it tests nothing"
    assert not report.failures, "\n".join(report.failures)
