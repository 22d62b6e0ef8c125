"""Runs a training program as the chief of a local ParameterServerStrategy job of processes (development, tests):

    python -m tf_embed_ops.distribute.launch --ps 2 --workers 2 -- python train.py [ARGS]

or on every worker of a local collective (MultiWorkerMirroredStrategy) job, with no parameter servers:

    python -m tf_embed_ops.distribute.launch --workers 2 --collective -- python train.py [ARGS]

In collective mode each of the `--workers` processes runs the command with its own TF_CONFIG
(`{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": i}}`, localhost ports); the launcher waits
for all of them and exits with 0 when all succeed. When one fails, the others get `--failure-grace` seconds
(default 60) to stop by themselves (a collective's timeout, `te.distribute.fit`'s `WorkerLostError`) before they
are killed; the launcher then exits with the first failure's status (128 + the signal's number for a signal).

starts `--ps` parameter-server and `--workers` worker processes (`python -m tf_embed_ops.distribute.server`) on
localhost ports, waits until every one serves, then runs the command with the chief's TF_CONFIG (so
`TFConfigClusterResolver()` in it finds the job).  A task whose port another process took after the launcher
chose it exits with `server.EXIT_PORT_TAKEN`; the job then starts again on other ports (START_ATTEMPTS in all).
When the command exits, every task is killed and the launcher exits with the command's status.  The command also
gets TF_EMBED_OPS_TASK_PIDS, `{"ps": [pid, ...], "worker": [...]}`, for fault-injection experiments.

However the launcher ends, its tasks end with it (docs/reliability.md, "Processes"):

- the command exits, or the launcher fails: every task is killed (SIGKILL to its process group);
- SIGTERM, SIGINT or SIGHUP: the signal is passed on to the command once, which gets `--stop-timeout` seconds
  (default 10) to exit before it is killed; then every task is killed and the launcher exits with 128 + the
  signal's number;
- the launcher itself is killed (SIGKILL, a crash): on Linux each task and the command were started with a
  parent-death signal (`prctl(PR_SET_PDEATHSIG)`, SIGKILL), so the kernel ends them.

Each task runs in its own process group, so a terminal's Ctrl-C reaches the launcher (which stops the job in
order) and not the servers directly.

Every address is `localhost`: the tasks only dial each other over loopback.  TensorFlow's servers are
unauthenticated and listen on all interfaces for their ports: on a machine reachable from untrusted networks,
firewall them (docs/distributed.md, "Security").  On real machines, start each task yourself (docs/distributed.md,
"Launching a real multi-host job").
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from tf_embed_ops.distribute.local_cluster import free_port
from tf_embed_ops.distribute.server import EXIT_PORT_TAKEN

__all__ = ["local_cluster_spec", "local_collective_spec", "main"]

PIDS_ENV = "TF_EMBED_OPS_TASK_PIDS"


def local_cluster_spec(num_ps: int, num_workers: int) -> dict:
    """`{"chief": [...], "ps": [...], "worker": [...]}` on free localhost ports.

    Raises:
      ValueError: if a count is not an int >= 1.
    """
    for name, value in (("num_ps", num_ps), ("num_workers", num_workers)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"Argument `{name}` must be an int >= 1; got {value!r}.")
    return {
        "chief": [f"localhost:{free_port()}"],
        "ps": [f"localhost:{free_port()}" for _ in range(num_ps)],
        "worker": [f"localhost:{free_port()}" for _ in range(num_workers)],
    }


def local_collective_spec(num_workers: int) -> dict:
    """`{"worker": [...]}` on free localhost ports: a collective job's cluster.

    Raises:
      ValueError: if `num_workers` is not an int >= 1.
    """
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise ValueError(f"Argument `num_workers` must be an int >= 1; got {num_workers!r}.")
    return {"worker": [f"localhost:{free_port()}" for _ in range(num_workers)]}


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# A port is chosen free, then bound by its task seconds later (once TensorFlow is imported there); another
# process may take it in between.  The job then starts again on other ports, at most this many times in all.
START_ATTEMPTS = 3
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class _Stop(BaseException):  # like KeyboardInterrupt: unwinds to the cleanup; not an error
    """Raised by the launcher's handler of a stop signal (SIGTERM, SIGINT, SIGHUP)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stop(signum: int, _frame) -> None:
    raise _Stop(signum)


class _PortTaken(RuntimeError):
    """A task found its port held by another process (it exited with EXIT_PORT_TAKEN)."""


def _child_setup(death_signal: int, new_group: bool) -> Callable[[], None]:
    """The `preexec_fn` of a child: its own process group (tasks), and the kernel's signal when the launcher dies.

    Without the parent-death signal a SIGKILLed launcher would leave orphaned servers listening. Linux only; on
    other systems the launcher's signal handlers and the process groups remain.
    """
    launcher = os.getpid()
    prctl = None
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl

    def setup() -> None:
        if new_group:
            os.setpgid(0, 0)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(death_signal), 0, 0, 0)
            # The launcher may have died between fork and prctl: then nobody would send the signal.
            if os.getppid() != launcher:
                os.kill(os.getpid(), death_signal)

    return setup


def _start_tasks(cluster: dict, timeout: float) -> dict:
    """Starts every ps/worker task; returns {(job, index): Popen} once all serve (each prints one line then)."""
    tasks = {}
    try:
        for job in ("ps", "worker"):
            for index in range(len(cluster[job])):
                task_config = {"cluster": cluster, "task": {"type": job, "index": index}}
                env = dict(os.environ, TF_CONFIG=json.dumps(task_config))
                tasks[job, index] = subprocess.Popen(
                    [sys.executable, "-m", "tf_embed_ops.distribute.server"],
                    env=env,
                    stdout=subprocess.PIPE,
                    text=True,
                    preexec_fn=_child_setup(signal.SIGKILL, new_group=True),
                )
        deadline = time.monotonic() + timeout
        for (job, index), task in tasks.items():
            ready, _, _ = select.select([task.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = task.stdout.readline() if ready else ""
            if "server started" not in line:
                code = task.poll()
                if ready and code is None:  # its output ended or went astray: it is exiting, or stuck
                    try:
                        code = task.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        pass
                if code == EXIT_PORT_TAKEN:
                    raise _PortTaken(f"task {job}:{index}: another process took its port ({cluster[job][index]})")
                state = f"exited with {code}" if code is not None else f"not serving after {timeout}s"
                raise RuntimeError(f"task {job}:{index} ({cluster[job][index]}) did not start: {state}")
    except BaseException:
        _stop(tasks)
        raise
    return tasks


def _stop(tasks: dict) -> None:
    """Kills every task's process group (the task and anything it started), then reaps the tasks."""
    for task in tasks.values():
        if task.poll() is None:
            try:
                os.killpg(task.pid, signal.SIGKILL)
            except OSError:  # not a group leader (setup failed before setpgid) or already gone
                task.kill()
    for task in tasks.values():
        task.wait(timeout=60)
        if task.stdout is not None:
            task.stdout.close()


def _run_command(command: list, env: dict, stop_timeout: float) -> int:
    """Runs the chief's command; on a stop signal passes it on once, waits `stop_timeout` s, then kills it.

    Returns:
      The command's exit status, or 128 + the signal's number when a stop signal ended the run.
    """
    chief = subprocess.Popen(command, env=env, preexec_fn=_child_setup(signal.SIGKILL, new_group=False))
    try:
        return chief.wait()
    except _Stop as stop:
        try:
            chief.send_signal(stop.signum)
            chief.wait(timeout=stop_timeout)
        except (_Stop, subprocess.TimeoutExpired):
            pass
        finally:
            if chief.poll() is None:
                chief.kill()
                chief.wait()
        return 128 + stop.signum
    except BaseException:
        chief.kill()
        chief.wait()
        raise


def _status(code: int) -> int:
    """A process's exit status as a shell reports it (128 + the signal's number for a signal)."""
    return 128 - code if code < 0 else code


def _run_workers(command: list, cluster: dict, stop_timeout: float, failure_grace: float) -> int:
    """Runs `command` on every worker of a collective job; returns 0, or the first failure's status."""
    workers: list = []
    try:
        for index in range(len(cluster["worker"])):
            env = dict(
                os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            )
            workers.append(subprocess.Popen(command, env=env, preexec_fn=_child_setup(signal.SIGKILL, new_group=True)))
        failed, deadline = None, None
        while True:
            codes = [w.poll() for w in workers]
            if failed is None:
                failed = next((c for c in codes if c not in (None, 0)), None)
                if failed is not None:
                    deadline = time.monotonic() + failure_grace
            if all(c is not None for c in codes):
                return _status(failed) if failed is not None else 0
            if deadline is not None and time.monotonic() >= deadline:
                return _status(failed)
            time.sleep(0.1)
    except _Stop as stop:
        for w in workers:
            if w.poll() is None:
                try:
                    w.send_signal(stop.signum)
                except OSError:
                    pass
        end = time.monotonic() + stop_timeout
        try:
            while time.monotonic() < end and any(w.poll() is None for w in workers):
                time.sleep(0.1)
        except _Stop:
            pass
        return 128 + stop.signum
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        _stop({i: w for i, w in enumerate(workers)})


def main(argv: list | None = None) -> int:
    """Entry point; returns the command's exit status (2 for bad arguments, 1 if a task did not start)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print(
            "error: give the chief's command after `--`, e.g. `--ps 2 --workers 2 -- python train.py`", file=sys.stderr
        )
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(
        prog="python -m tf_embed_ops.distribute.launch", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--ps", type=int, default=None, help="parameter-server processes (default 2)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--collective",
        action="store_true",
        help="a MultiWorkerMirroredStrategy job: every worker runs the command; no parameter servers",
    )
    parser.add_argument(
        "--failure-grace",
        type=float,
        default=60.0,
        help="collective mode: seconds the other workers get to stop after one fails, before they are killed",
    )
    parser.add_argument(
        "--start-timeout", type=float, default=300.0, help="seconds to wait for every task to serve (default 300)"
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=10.0,
        help="on SIGTERM/SIGINT/SIGHUP, seconds the command gets to exit before it is killed (default 10)",
    )
    args = parser.parse_args(argv[:split])
    if args.collective and args.ps is not None:
        print(
            f"error: --ps {args.ps} with --collective: a collective job has no parameter servers (drop --ps)",
            file=sys.stderr,
        )
        return 2
    num_ps = 2 if args.ps is None else args.ps
    try:
        if args.collective:
            cluster = local_collective_spec(args.workers)
        else:
            cluster = local_cluster_spec(num_ps, args.workers)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.stop_timeout >= 0:
        print(f"error: --stop-timeout must be >= 0; got {args.stop_timeout}", file=sys.stderr)
        return 2
    if not args.failure_grace >= 0:
        print(f"error: --failure-grace must be >= 0; got {args.failure_grace}", file=sys.stderr)
        return 2
    if args.collective:
        previous = {signum: signal.signal(signum, _raise_stop) for signum in STOP_SIGNALS}
        try:
            return _run_workers(argv[split + 1 :], cluster, args.stop_timeout, args.failure_grace)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    previous = {signum: signal.signal(signum, _raise_stop) for signum in STOP_SIGNALS}
    tasks: dict = {}
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                tasks = _start_tasks(cluster, args.start_timeout)
                break
            except _PortTaken as e:
                if attempt == START_ATTEMPTS:
                    print(f"error: {e}, in each of {START_ATTEMPTS} attempts", file=sys.stderr)
                    return 1
                print(f"note: {e}; starting the job again on other ports", file=sys.stderr)
                cluster = local_cluster_spec(num_ps, args.workers)
            except RuntimeError as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
        pids = {job: [tasks[job, i].pid for i in range(len(cluster[job]))] for job in ("ps", "worker")}
        env = dict(
            os.environ,
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}),
            **{PIDS_ENV: json.dumps(pids)},
        )
        return _run_command(argv[split + 1 :], env, args.stop_timeout)
    except _Stop as stop:  # a stop signal while the tasks were starting
        return 128 + stop.signum
    finally:
        # A second stop signal must not interrupt the cleanup: from here on they are ignored.
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        try:
            _stop(tasks)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
