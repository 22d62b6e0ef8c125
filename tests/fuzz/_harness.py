"""What every fuzz target shares: the time/count budget, the hang watchdog, failure records, and bitwise state
comparison."""

from __future__ import annotations

import faulthandler
import sys
import time
from dataclasses import dataclass, field

import numpy as np

# A single input taking longer than this is a hang: the watchdog dumps every thread's stack and exits.
HANG_SECONDS = 60.0


class Budget:
    """Stops after `seconds` or `max_inputs` inputs, whichever comes first."""

    def __init__(self, seconds: float, max_inputs: int | None = None):
        self.deadline = time.monotonic() + seconds
        self.max_inputs = max_inputs
        self.count = 0

    def more(self) -> bool:
        if self.max_inputs is not None and self.count >= self.max_inputs:
            return False
        # Checking the clock every input costs more than some inputs; every 64th is plenty.
        return self.count % 64 != 0 or time.monotonic() < self.deadline


class Watchdog:
    """faulthandler's timer, re-armed per batch of inputs: a hang ends the process with all stacks dumped."""

    def __enter__(self):
        faulthandler.enable()
        faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
        return self

    def kick(self):
        faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)

    def __exit__(self, *exc):
        faulthandler.cancel_dump_traceback_later()


@dataclass
class Report:
    """Counts of one target's run, and the first failures (input description + what was wrong)."""

    target: str
    seed: int
    inputs: int = 0
    accepted: int = 0
    rejected: int = 0
    seconds: float = 0.0
    failures: list = field(default_factory=list)
    counters: dict = field(default_factory=dict)

    def fail(self, what: str, case: object) -> None:
        if len(self.failures) < 20:
            self.failures.append(f"{what}: {case!r}"[:2000])

    def bump(self, key: str) -> None:
        self.counters[key] = self.counters.get(key, 0) + 1

    def summary(self) -> str:
        extra = ", ".join(f"{k} {v}" for k, v in sorted(self.counters.items()))
        return (
            f"{self.target}: seed {self.seed}, {self.inputs} inputs in {self.seconds:.1f} s "
            f"({self.accepted} accepted, {self.rejected} rejected{', ' + extra if extra else ''}); "
            f"{len(self.failures)} failures; the process survived every input (no crash, no hang)"
        )


def bits(array: np.ndarray) -> bytes:
    """The exact bytes of an array (NaN payloads and signed zeros included)."""
    return np.ascontiguousarray(array).tobytes()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def check_call(report: Report, fn, snapshot, names: list, certain: bool, read_only: bool, expected: tuple) -> bool:
    """Runs one fuzzed call: an error outside `expected` is a finding; a rejected (or `read_only`) call must leave
    `snapshot()` unchanged; a `certain`ly invalid call must be rejected. Returns whether it was accepted."""
    before = snapshot()
    try:
        fn()
        accepted = True
    except expected:
        accepted = False
    except Exception as e:
        report.fail(f"{type(e).__name__}: {e}", names)
        accepted = False
    if accepted and certain:
        report.fail("certainly invalid input was accepted", names)
    if (not accepted or read_only) and snapshot() != before:
        report.fail("a rejected or read-only call changed the state", names)
    return accepted


def drive(target: str, seconds: float, seed: int, max_inputs: int | None, one_input) -> Report:
    """The budgeted, watched loop of a target: `one_input(index, report)` runs one input and returns (corruption
    names, accepted)."""
    report = Report(target, seed)
    budget = Budget(seconds, max_inputs)
    start = time.monotonic()
    with Watchdog() as watchdog:
        while budget.more():
            budget.count += 1
            watchdog.kick()
            names, accepted = one_input(budget.count, report)
            for name in names:
                report.bump(name)
            if accepted:
                report.accepted += 1
            else:
                report.rejected += 1
    report.inputs = budget.count
    report.seconds = time.monotonic() - start
    return report
