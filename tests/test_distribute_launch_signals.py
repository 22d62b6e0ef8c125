"""`python -m tf_embed_ops.distribute.launch` ends every process it started, however it ends: SIGTERM (what
`timeout`, CI, systemd and container runtimes send), SIGINT, SIGHUP, and SIGKILL of the launcher itself (the
kernel's parent-death signal). After each, every task and the command are gone and the tasks' ports are closed
within a bounded time. Loopback only; every process is killed at the end whatever happens."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 300
STOP_BOUND = 30  # seconds every process gets to be gone after the launcher was signalled

# The chief's command: writes what it knows (TF_CONFIG, the tasks' pids, its own pid), then waits forever; with
# `ignore`, it ignores SIGTERM/SIGINT/SIGHUP, so the launcher must kill it after --stop-timeout.
_COMMAND = textwrap.dedent(
    """
    import json, os, signal, sys, time
    if sys.argv[2] == "ignore":
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
    info = {"tf_config": json.loads(os.environ["TF_CONFIG"]),
            "pids": json.loads(os.environ["TF_EMBED_OPS_TASK_PIDS"]), "chief": os.getpid()}
    with open(sys.argv[1] + ".tmp", "w") as f:
        json.dump(info, f)
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    while True:
        time.sleep(1)
    """
)


def _gone(pid: int) -> bool:
    """No such process, or a zombie (dead, waiting for its new parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _port_open(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1" if host == "localhost" else host, int(port))) == 0


def _launch(tmp_path, mode: str):
    script = tmp_path / "chief.py"
    script.write_text(_COMMAND)
    info = tmp_path / "info.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tf_embed_ops.distribute.launch", "--ps", "1", "--workers", "1", "--stop-timeout", "3"]
        + ["--", sys.executable, str(script), str(info), mode],
        env=env,
        cwd=str(tmp_path),
        start_new_session=True,  # a signal to the test's own group never reaches it
    )
    deadline = time.monotonic() + START_TIMEOUT
    while not info.exists():
        if launcher.poll() is not None:
            raise AssertionError(f"the launcher exited with {launcher.returncode} before the command started")
        if time.monotonic() > deadline:
            launcher.kill()
            raise AssertionError("the command did not start")
        time.sleep(0.5)
    data = json.loads(info.read_text())
    pids = data["pids"]["ps"] + data["pids"]["worker"] + [data["chief"]]
    cluster = data["tf_config"]["cluster"]
    return launcher, pids, cluster["ps"] + cluster["worker"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "mode"),
    [
        (signal.SIGTERM, "wait"),
        (signal.SIGTERM, "ignore"),  # the command ignores it: killed after --stop-timeout
        (signal.SIGHUP, "wait"),
        (signal.SIGKILL, "ignore"),  # the launcher cannot clean up: the parent-death signal does
    ],
    ids=["sigterm", "sigterm_ignored", "sighup", "sigkill"],
)
def test_every_task_and_port_is_gone_after_the_launcher_is_signalled(tmp_path, signum, mode):
    if signum == signal.SIGKILL and not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    launcher, pids, addresses = _launch(tmp_path, mode)
    try:
        assert all(not _gone(pid) for pid in pids)
        assert all(_port_open(a) for a in addresses), addresses  # the check below can fail
        os.kill(launcher.pid, signum)
        deadline = time.monotonic() + STOP_BOUND
        while time.monotonic() < deadline and not (
            all(_gone(pid) for pid in pids) and not any(_port_open(a) for a in addresses)
        ):
            time.sleep(0.2)
        alive = [pid for pid in pids if not _gone(pid)]
        assert not alive, f"still running {STOP_BOUND}s after {signal.Signals(signum).name}: {alive} of {pids}"
        assert not any(_port_open(a) for a in addresses)
        code = launcher.wait(timeout=STOP_BOUND)
        assert code == (-signal.SIGKILL if signum == signal.SIGKILL else 128 + signum)
    finally:
        for pid in [*pids, launcher.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        launcher.wait(timeout=60)
