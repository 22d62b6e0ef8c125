"""How the suite finds and probes a peer's own interpreter (a virtualenv with the peer's framework, which must not
share a process with our TensorFlow), and reads what the peer's script printed."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess


@dataclasses.dataclass(frozen=True)
class Interpreter:
    """Where a peer's interpreter is looked for: ``flag`` (the suite's option), $``env_var``, then ``default`` (what
    benchmarks/peers/``setup`` creates)."""

    peer: str
    setup: str
    flag: str
    env_var: str
    default: str

    def find(self, explicit: str | None = None) -> str | None:
        """The first of ``explicit``, $env_var and default that exists, else None."""
        for cand in (explicit, os.environ.get(self.env_var), self.default):
            if cand and os.path.exists(cand):
                return cand
        return None

    def probe(self, python: str | None, code: str, what: str, timeout: int) -> tuple[bool, str]:
        """(True, what ``code`` printed) if ``python`` runs it, else (False, why: no interpreter, or ``python``
        cannot import ``what``)."""
        if python is None:
            return False, (
                f"no {self.peer} interpreter: run benchmarks/peers/{self.setup} or pass {self.flag} "
                f"(looked at ${self.env_var} and {self.default})"
            )
        try:
            proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f"{python}: {e}"
        if proc.returncode != 0:
            return False, f"{python} cannot import {what}: {proc.stderr.strip().splitlines()[-1:]}"
        return True, proc.stdout


def failed(proc: subprocess.CompletedProcess, script: str, names) -> dict | None:
    """name -> {"error"} for each of ``names`` if ``script``'s run failed, naming its last line of stderr; else None."""
    if proc.returncode == 0:
        return None
    msg = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    return {n: {"error": f"{script} failed: {msg[:300]}"} for n in names}


def last_json(proc: subprocess.CompletedProcess) -> dict:
    """The JSON object the peer printed last."""
    return json.loads(proc.stdout.strip().splitlines()[-1])
