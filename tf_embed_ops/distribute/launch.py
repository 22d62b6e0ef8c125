"""Runs a training program as the chief of a local ParameterServerStrategy job of processes (development, tests):

    python -m tf_embed_ops.distribute.launch --ps 2 --workers 2 -- python train.py [ARGS]

starts `--ps` parameter-server and `--workers` worker processes (`python -m tf_embed_ops.distribute.server`) on
localhost ports, waits until every one serves, then runs the command with the chief's TF_CONFIG (so
`TFConfigClusterResolver()` in it finds the job).  When the command exits, every task is killed and the
launcher exits with the command's status.  The command also gets TF_EMBED_OPS_TASK_PIDS, `{"ps": [pid, ...],
"worker": [...]}`, for fault-injection experiments.

Every address is `localhost`: the tasks only dial each other over loopback.  TensorFlow's servers are
unauthenticated and listen on all interfaces for their ports: on a machine reachable from untrusted networks,
firewall them (docs/distributed.md, "Security").  On real machines, start each task yourself (docs/distributed.md,
"Launching a real multi-host job").
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time

from tf_embed_ops.distribute.local_cluster import free_port

__all__ = ["local_cluster_spec", "main"]

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
                )
        deadline = time.monotonic() + timeout
        for (job, index), task in tasks.items():
            ready, _, _ = select.select([task.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = task.stdout.readline() if ready else ""
            if "server started" not in line:
                state = f"exited with {task.poll()}" if task.poll() is not None else f"not serving after {timeout}s"
                raise RuntimeError(f"task {job}:{index} ({cluster[job][index]}) did not start: {state}")
    except BaseException:
        _stop(tasks)
        raise
    return tasks


def _stop(tasks: dict) -> None:
    for task in tasks.values():
        if task.poll() is None:
            task.kill()
    for task in tasks.values():
        task.wait(timeout=60)


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
    parser.add_argument("--ps", type=int, default=2, help="parameter-server processes (default 2)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--start-timeout", type=float, default=300.0, help="seconds to wait for every task to serve (default 300)"
    )
    args = parser.parse_args(argv[:split])
    try:
        cluster = local_cluster_spec(args.ps, args.workers)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        tasks = _start_tasks(cluster, args.start_timeout)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        pids = {job: [tasks[job, i].pid for i in range(len(cluster[job]))] for job in ("ps", "worker")}
        env = dict(
            os.environ,
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}),
            **{PIDS_ENV: json.dumps(pids)},
        )
        return subprocess.run(argv[split + 1 :], env=env, check=False).returncode
    finally:
        _stop(tasks)


if __name__ == "__main__":
    sys.exit(main())
