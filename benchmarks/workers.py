"""Persistent engine workers: a process that holds prepared engines and times one block on request, over a pipe.

The out-of-process engines (FBGEMM under PyTorch, the speed-of-light kernel, ours at another thread count) cannot
share this process, but they must run their blocks alternately in time with ours (``benchmarks/pairs.py``). So
each runs as a worker that stays up for a whole comparison and answers one line per request on stdout:

    prepare NAME [key=value ...]   build engine NAME (workload, optimizer, ... as the worker reads them), warm it
                                   -> "ok" | "error MESSAGE"
    time NAME STEPS                run STEPS steps of NAME back to back -> "seconds S" | "error MESSAGE"
    drop NAME                      free NAME's state -> "ok"
    quit                           exit (also at end of input)

Names and values are single words. The same protocol is spoken by ``serve`` (any Python worker: FBGEMM,
ours), and by ``speed_of_light --serve`` (C++). ``Worker`` is the client; ``Worker.engine(name)`` is an engine for
``pairs.run_pairs``. Standard library only: the FBGEMM worker imports this under PyTorch, without TensorFlow.

Example:
    >>> import io
    >>> out = io.StringIO()
    >>> serve(io.StringIO("prepare a\\ntime a 3\\nquit\\n"), out, lambda name, params: lambda: None,
    ...       clock=iter([0.0, 0.5]).__next__)
    >>> out.getvalue()
    'ok\\nseconds 0.500000000\\n'
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import IO


class WorkerError(RuntimeError):
    """A worker answered ``error ...``, died, or said something outside the protocol."""


def parse_params(words: list[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``; a word without ``=`` is an error naming it."""
    params = {}
    for w in words:
        key, sep, value = w.partition("=")
        if not sep or not key:
            raise ValueError(f"parameter {w!r} is not key=value")
        params[key] = value
    return params


def serve(
    inp: IO[str],
    out: IO[str],
    make: Callable[[str, dict[str, str]], Callable[[], object]],
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """The worker loop: reads requests from ``inp``, answers on ``out`` (flushed after every line).

    Args:
        inp, out: the pipe's ends (text).
        make: ``make(name, params)`` builds and warms engine ``name``; returns its zero-argument step function.
            An exception becomes ``error <message>`` and the worker keeps serving.
        clock: seconds (injectable, so the loop is tested without timing anything).
    """
    engines: dict[str, Callable[[], object]] = {}

    def reply(text: str) -> None:
        out.write(text + "\n")
        out.flush()

    for line in inp:
        words = line.split()
        if not words:
            continue
        cmd, args = words[0], words[1:]
        try:
            if cmd == "quit":
                return
            if cmd == "prepare" and args:
                params = parse_params(args[1:])  # a malformed request changes nothing
                if engines.pop(args[0], None) is not None:  # a re-prepare replaces: the old state is freed first
                    gc.collect()
                engines[args[0]] = make(args[0], params)
                reply("ok")
            elif cmd == "time" and len(args) == 2:
                name, steps = args[0], int(args[1])
                if name not in engines:
                    raise KeyError(f"engine {name!r} is not prepared (prepared: {sorted(engines)})")
                if steps < 1:
                    raise ValueError(f"steps must be >= 1, got {steps}")
                reply(f"seconds {_time_block(engines[name], steps, clock):.9f}")
            elif cmd == "drop" and len(args) == 1:
                if engines.pop(args[0], None) is not None:
                    # Freed now, cycles included (a tf.function step holds some), not at some later collection: the
                    # next engine's tables must reuse this memory. Tables placed on memory the process never had
                    # stepped up to 1.5x slower for as long as they lived, in about one run in four (on a VM).
                    gc.collect()
                reply("ok")
            else:
                raise ValueError(f"unknown request {line.strip()!r}")
        except Exception as e:  # reported to the client; the worker stays up for the next request
            msg = " ".join(f"{type(e).__name__}: {e}".split())
            reply(f"error {msg[:500]}")


def _time_block(step: Callable[[], object], steps: int, clock: Callable[[], float]) -> float:
    # A function of its own, so that no variable of the serve loop keeps the step (and its tables) after a drop.
    t0 = clock()
    for _ in range(steps):
        step()
    return clock() - t0


class Worker:
    """The client of one worker process (started here, stopped by ``close`` or a ``with`` block)."""

    def __init__(
        self,
        argv: list[str],
        env: dict | None = None,
        cwd: str | None = None,
        label: str = "",
        scratch: str | None = None,
    ):
        """Starts ``argv``; ``scratch`` (the worker's job directory, say) is removed by ``close``."""
        self.label = label or os.path.basename(argv[0])
        self.scratch = scratch
        # stderr to a file, not a pipe: a chatty worker (TensorFlow's logs) must never block on a full pipe.
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
            cwd=cwd,
            bufsize=1,
        )

    def request(self, line: str) -> str:
        """Sends one request; returns the answer's text after its keyword, or raises ``WorkerError``."""
        if self.proc.poll() is not None:
            raise WorkerError(f"{self.label}: worker exited ({self.proc.returncode}): {self._stderr_tail()}")
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        except (BrokenPipeError, OSError) as e:
            raise WorkerError(f"{self.label}: {e}: {self._stderr_tail()}") from e
        if not answer:
            self.proc.wait(timeout=30)
            raise WorkerError(f"{self.label}: worker exited ({self.proc.returncode}): {self._stderr_tail()}")
        word, _, rest = answer.strip().partition(" ")
        if word == "error":
            raise WorkerError(f"{self.label}: {rest}")
        if word not in ("ok", "seconds"):
            raise WorkerError(f"{self.label}: unexpected answer {answer.strip()[:200]!r}")
        return rest

    def prepare(self, name: str, **params) -> None:
        words = [f"{k}={v}" for k, v in params.items()]
        bad = [w for w in [name, *words] if not w or any(c.isspace() for c in w)]
        if bad:
            raise ValueError(f"prepare: names and values must be single words, got {bad}")
        self.request(" ".join(["prepare", name, *words]))

    def time(self, name: str, steps: int) -> float:
        return float(self.request(f"time {name} {int(steps)}"))

    def drop(self, name: str) -> None:
        self.request(f"drop {name}")

    def engine(self, name: str) -> RemoteEngine:
        return RemoteEngine(self, name)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self._stderr):
            f.close()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            text = self._stderr.read()
        except (OSError, ValueError):
            return ""
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RemoteEngine:
    """One prepared engine of a worker, as ``pairs.run_pairs`` takes engines: ``run(steps) -> seconds``."""

    def __init__(self, worker: Worker, name: str):
        self.worker, self.name = worker, name

    def run(self, steps: int) -> float:
        return self.worker.time(self.name, steps)
