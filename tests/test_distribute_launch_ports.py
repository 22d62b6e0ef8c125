"""A task whose port another process took after the launcher chose it: the task says so by its exit status, and
the launcher starts the job again on other ports instead of failing (or of waiting out its start timeout).
Loopback only; every process the launcher started is gone when it returns."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from tf_embed_ops.distribute import launch
from tf_embed_ops.distribute.server import EXIT_PORT_TAKEN

pytestmark = pytest.mark.slow

_COMMAND = "import os, sys; open(sys.argv[1], 'w').write(os.environ['TF_CONFIG'])"


def _held_port() -> socket.socket:
    """A listening socket on every interface, as a process that took a task's port holds it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("0.0.0.0", launch.free_port()))
    s.listen()
    return s


def test_a_task_whose_port_is_held_exits_with_the_port_taken_status():
    with _held_port() as held:
        port = held.getsockname()[1]
        tf_config = {"cluster": {"ps": [f"localhost:{port}"]}, "task": {"type": "ps", "index": 0}}
        proc = subprocess.run(
            [sys.executable, "-m", "tf_embed_ops.distribute.server", "--tf-config", json.dumps(tf_config)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert proc.returncode == EXIT_PORT_TAKEN, proc.stderr[-2000:]
    assert f"localhost:{port}: another process holds its port" in proc.stderr


def test_the_launcher_starts_the_job_again_on_other_ports(tmp_path, monkeypatch, capsys):
    specs = []
    real_spec = launch.local_cluster_spec

    def first_spec_with_a_held_port(num_ps, num_workers):
        spec = real_spec(num_ps, num_workers)
        if not specs:
            spec["ps"][0] = f"localhost:{held.getsockname()[1]}"
        specs.append(spec)
        return spec

    out = tmp_path / "tf_config.json"
    with _held_port() as held:
        monkeypatch.setattr(launch, "local_cluster_spec", first_spec_with_a_held_port)
        code = launch.main(["--ps", "1", "--workers", "1", "--", sys.executable, "-c", _COMMAND, str(out)])
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    assert "another process took its port" in err and "starting the job again on other ports" in err
    assert len(specs) == 2
    # The command ran once, with the second job's cluster.
    assert json.loads(out.read_text())["cluster"] == specs[1]


def test_the_launcher_gives_up_after_its_attempts(tmp_path, monkeypatch, capsys):
    real_spec = launch.local_cluster_spec
    out = tmp_path / "tf_config.json"
    with _held_port() as held:
        address = f"localhost:{held.getsockname()[1]}"
        monkeypatch.setattr(
            launch, "local_cluster_spec", lambda ps, workers: {**real_spec(ps, workers), "ps": [address]}
        )
        code = launch.main(["--ps", "1", "--workers", "1", "--", sys.executable, "-c", _COMMAND, str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert f"in each of {launch.START_ATTEMPTS} attempts" in err
    assert not out.exists()  # the command never ran
