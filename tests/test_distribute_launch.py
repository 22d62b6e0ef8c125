"""Argument checks of the cluster helpers (no server is started here; tests/test_distribute_cluster.py runs them)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tf_embed_ops.distribute import create_local_cluster
from tf_embed_ops.distribute.server import main, start_server

CLUSTER = {"chief": ["localhost:1"], "ps": ["localhost:2"], "worker": ["localhost:3"]}


@pytest.mark.parametrize(
    "kwargs,argument",
    [
        ({"num_workers": 0}, "num_workers"),
        ({"num_ps": 0}, "num_ps"),
        ({"num_ps": True}, "num_ps"),
        ({"num_workers": 1.5}, "num_workers"),
    ],
)
def test_create_local_cluster_rejects_bad_counts(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        create_local_cluster(**kwargs)


@pytest.mark.parametrize(
    "tf_config,match",
    [
        ({"cluster": CLUSTER}, "'cluster' and 'task'"),
        ({"task": {"type": "ps", "index": 0}}, "'cluster' and 'task'"),
        ({"cluster": CLUSTER, "task": {"type": "chief", "index": 0}}, "the chief runs the training program"),
        ({"cluster": CLUSTER, "task": {"type": "evaluator", "index": 0}}, "'ps' or 'worker'"),
    ],
)
def test_start_server_rejects_configs_it_cannot_serve(tf_config, match):
    with pytest.raises(ValueError, match=match):
        start_server(tf_config)


def test_server_module_needs_tf_config(monkeypatch, capsys):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert main([]) == 2
    assert "TF_CONFIG" in capsys.readouterr().err


@pytest.mark.slow
def test_server_module_reports_a_bad_task_without_serving():
    tf_config = json.dumps({"cluster": CLUSTER, "task": {"type": "chief", "index": 0}})
    proc = subprocess.run(
        [sys.executable, "-m", "tf_embed_ops.distribute.server", "--tf-config", tf_config],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode != 0
    assert "the chief runs the training program" in proc.stderr
