"""Running a test file as a script in a child interpreter (a cluster's chief, a training stage) and reading the JSON
result it writes."""

from __future__ import annotations

import json
import subprocess
import sys


def run_script_for_json(args: list, result_path, *, env: dict, timeout: float, what: str) -> tuple[dict, str]:
    """Runs `python *args` to its end; returns the JSON object it wrote to `result_path`, and its stdout.

    A non-zero exit fails the test with `what` and the tail of the child's stdout and stderr.
    """
    proc = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{what} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    with open(result_path) as f:
        return json.load(f), proc.stdout
