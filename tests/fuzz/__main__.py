"""python -m tests.fuzz [--minutes N | --seconds N] [--target config|ops|accumulator ...] [--seed S]
[--max-inputs N]: runs the fuzzers (time shared out equally by default, or per-target counts), prints one
summary line per target and every failure, and exits 1 if any check failed.  A crash or hang ends the process
itself (the watchdog prints every thread's stack)."""

from __future__ import annotations

import argparse
import os
import sys

# The C++ protobuf runtime logs an ERROR line for every string with invalid UTF-8 it refuses: fuzzing makes
# thousands.  Set before TensorFlow loads.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from . import TARGETS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    duration = parser.add_mutually_exclusive_group()
    duration.add_argument("--minutes", type=float, help="total wall time, shared out over the targets")
    duration.add_argument("--seconds", type=float, help="total wall time, shared out over the targets")
    parser.add_argument("--target", action="append", choices=sorted(TARGETS), help="repeatable; default: all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-inputs",
        action="append",
        default=[],
        metavar="TARGET=N",
        help="stop TARGET after N inputs (e.g. config=1000000); the time limit still applies",
    )
    args = parser.parse_args(argv)
    targets = args.target or sorted(TARGETS)
    total = args.seconds if args.seconds is not None else 60.0 * (args.minutes if args.minutes is not None else 1.0)
    limits = dict(item.split("=", 1) for item in args.max_inputs)
    failed = False
    for name in targets:
        report = TARGETS[name]().run(total / len(targets), seed=args.seed, max_inputs=_int(limits.get(name)))
        print(report.summary(), flush=True)
        for failure in report.failures:
            print("  FAIL", failure, flush=True)
        failed = failed or bool(report.failures)
    return 1 if failed else 0


def _int(value: str | None) -> int | None:
    return None if value is None else int(value)


if __name__ == "__main__":
    sys.exit(main())
