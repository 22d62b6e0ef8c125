"""`python -m tf_embed_ops.distribute.launch`: a local job of processes around a training program.

The argument checks and the cluster spec are in the fast tier; one slow test runs `te.distribute.fit` through the
launcher (2 ps + 2 worker processes) and checks that every task is gone afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tf_embed_ops.distribute.launch import local_cluster_spec, main
from tf_embed_ops.distribute.server import is_loopback_address


@pytest.mark.parametrize(
    "argv,match",
    [
        ([], "after `--`"),
        (["--ps", "1"], "after `--`"),
        (["--ps", "1", "--"], "after `--`"),
        (["--ps", "0", "--", "true"], "`num_ps` must be an int >= 1; got 0"),
        (["--workers", "0", "--", "true"], "`num_workers` must be an int >= 1; got 0"),
    ],
)
def test_launch_rejects_bad_arguments_before_starting_anything(argv, match, capsys):
    assert main(argv) == 2
    assert match in capsys.readouterr().err


def test_local_cluster_spec_is_loopback_only_with_distinct_ports():
    spec = local_cluster_spec(2, 3)
    assert {job: len(addresses) for job, addresses in spec.items()} == {"chief": 1, "ps": 2, "worker": 3}
    addresses = [a for job in spec.values() for a in job]
    assert all(is_loopback_address(a) for a in addresses)
    assert len({a.rsplit(":", 1)[1] for a in addresses}) == len(addresses)


_TRAIN = textwrap.dedent("""
    import json, os, sys
    import keras
    import tensorflow as tf
    from tests.distribute_fit_support import STEPS, epoch_dataset_fn, make_layer, make_model
    from tf_embed_ops import distribute as ted

    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver())
    with strategy.scope():
        model = make_model(tf, keras, make_layer(tf, ted.ShardedEmbeddingLayer))
    history = ted.fit(model, epoch_dataset_fn(tf), epochs=2, steps_per_epoch=STEPS, verbose=2)
    with open(sys.argv[1], "w") as f:
        json.dump({"history": history.history, "pids": json.loads(os.environ["TF_EMBED_OPS_TASK_PIDS"]),
                   "tf_config": json.loads(os.environ["TF_CONFIG"])}, f)
    sys.stdout.flush()
    os._exit(0)
""")


@pytest.mark.slow
def test_launch_runs_fit_as_the_chief_and_stops_every_task(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script, out = tmp_path / "train.py", tmp_path / "out.json"
    script.write_text(_TRAIN)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tf_embed_ops.distribute.launch",
            "--ps",
            "2",
            "--workers",
            "2",
            "--",
            sys.executable,
            str(script),
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    result = json.loads(out.read_text())
    loss = result["history"]["loss"]
    assert len(loss) == 2 and loss[1] < loss[0]
    assert result["tf_config"]["task"] == {"type": "chief", "index": 0}
    assert all(is_loopback_address(a) for job in result["tf_config"]["cluster"].values() for a in job)
    assert "Epoch 2/2" in proc.stdout
    for pid in result["pids"]["ps"] + result["pids"]["worker"]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped by the launcher
