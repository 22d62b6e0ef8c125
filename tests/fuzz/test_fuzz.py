"""The fuzzers under pytest, each for a short fixed budget (about a minute and a half in all; marked slow).

CI's sanitizer stage runs every target again for a minute under ASan and UBSan with another seed
(.ci/sanitize.sh), so the two passes feed the kernels different inputs. Longer runs:
``python -m tests.fuzz --minutes N``."""

from __future__ import annotations

import pytest

from . import TARGETS

# Seconds per target; seeded, so a failure reproduces with `python -m tests.fuzz --target T --seconds S`.
BUDGET = {"config": 20.0, "ops": 25.0, "accumulator": 15.0, "dynamic": 22.0, "low_precision": 18.0}


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_target(target):
    report = TARGETS[target]().run(BUDGET[target], seed=0)
    print(report.summary())
    assert report.inputs > 0
    assert report.rejected > 0, "the fuzzer produced no invalid input: it tests nothing"
    assert not report.failures, "\n".join(report.failures)
