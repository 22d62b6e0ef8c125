"""A child Python process driven by JSON lines: one command object a line on its stdin, one answer object a line
on its stdout. The online example and the serving-delta benchmark run their plain-TensorFlow serving process so.

The child starts without PYTHONPATH and in `/`, so it cannot import this checkout's `tf_embed_ops`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

__all__ = ["WITHOUT_TF_EMBED_OPS", "JsonLinesChild"]

# The start of a child's code that must run on plain TensorFlow (a serving process): any import of tf_embed_ops
# fails. Imports importlib.abc and sys.
WITHOUT_TF_EMBED_OPS = r"""
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "tf_embed_ops":
            raise ImportError("the serving process runs without tf_embed_ops")
sys.meta_path.insert(0, _Block())
"""


class JsonLinesChild:
    """`python -c source *args` as a child process; `ask(**cmd)` sends a command and returns its answer."""

    def __init__(self, source: str, *args: str, env: dict[str, str] | None = None, close_timeout: float = 60):
        child_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        child_env.update(env or {})
        self._close_timeout = close_timeout
        self.proc = subprocess.Popen(
            [sys.executable, "-c", source, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_env,
            cwd="/",
        )

    def ask(self, **cmd) -> dict:
        """Sends `cmd`; returns the child's answer line, parsed.

        Raises:
          RuntimeError: the child exited before answering (its exit status and the command named).
        """
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the child process exited ({self.proc.wait()}) on {cmd}")
        return json.loads(line)

    def close(self) -> None:
        """Asks the child to quit (`{"op": "quit"}`; a child already gone is fine) and waits for it."""
        try:
            self.ask(op="quit")
        except (RuntimeError, BrokenPipeError, ValueError):
            pass
        with contextlib.suppress(BrokenPipeError):  # a child gone already leaves the quit line unflushed
            self.proc.stdin.close()
        self.proc.wait(timeout=self._close_timeout)
