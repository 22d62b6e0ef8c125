"""`tf_embed_ops.distribute.fit` when tasks die: jobs of separate processes on localhost (2 ps + 2 worker processes
from `python -m tf_embed_ops.distribute.server`, and a chief process: this file run as a script).

* a worker killed in the middle of an epoch: the coordinator reschedules its steps on the other worker and
  training finishes every epoch;
* a parameter server killed in the middle of epoch 2: `fit` stops with `TrainingInterruptedError`; a fresh job
  with the same checkpoint directory restores epoch 1 with identical tables and finishes.

Every process is killed by the test at the end; every wait has a deadline (slow tier).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.distribute_fit_support import STEPS, epoch_dataset_fn, make_layer, make_model, table_values
from tests.script_support import run_script_for_json

_START_TIMEOUT_S, _CHIEF_TIMEOUT_S, EPOCHS = 180, 300, 3
pytestmark = pytest.mark.slow


# ------------------------------------------------------------------------ the chief (script side)


def _chief(scenario: str, out_dir: str, kill_pid: int, kill_epoch: int, kill_step: int) -> None:
    import keras
    import tensorflow as tf

    from tf_embed_ops import distribute as ted
    from tf_embed_ops.distribute.keras_layer import ShardedEmbeddingLayer

    dataset_fn = epoch_dataset_fn(tf)

    class Faults(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epoch, self.tables_at_start, self.tables_after_epoch = None, None, {}

        def on_train_begin(self, logs=None):
            self.tables_at_start = table_values(tf, layer)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if kill_pid and (self.epoch, batch) == (kill_epoch, kill_step):
                os.kill(kill_pid, signal.SIGKILL)

        def on_epoch_end(self, epoch, logs=None):  # after fit saved the epoch's checkpoint
            self.tables_after_epoch[epoch] = table_values(tf, layer)

    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver()
    )
    with strategy.scope():
        layer = make_layer(tf, ShardedEmbeddingLayer)
        model = make_model(tf, keras, layer)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), os.path.join(out_dir, "ckpt"), 3)
    faults = Faults()
    results = {}
    try:
        history = ted.fit(
            model,
            dataset_fn,
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            callbacks=[faults],
            verbose=0,
            checkpoint_manager=manager,
        )
        results.update(history=history.history, epochs=history.epoch)
    except ted.TrainingInterruptedError as e:
        results["error"] = str(e)
    results.update(tables_at_start=faults.tables_at_start, tables_after_epoch=faults.tables_after_epoch)
    with open(os.path.join(out_dir, f"{scenario}.json"), "w") as f:
        json.dump(results, f)
    sys.stdout.flush()
    os._exit(0)  # the coordinator's threads may still wait for the killed task


# ------------------------------------------------------------------------ the pytest side


def _env(**extra) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **extra)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


class _Job:
    """2 ps + 2 worker server processes on fresh localhost ports; `run_chief` runs a scenario against them."""

    def __init__(self):
        from tf_embed_ops.distribute.local_cluster import _free_port

        self.cluster = {
            "chief": [f"localhost:{_free_port()}"],
            "ps": [f"localhost:{_free_port()}" for _ in range(2)],
            "worker": [f"localhost:{_free_port()}" for _ in range(2)],
        }
        self.tasks = {}

    def __enter__(self):
        for job in ("ps", "worker"):
            for index in range(2):
                config = json.dumps({"cluster": self.cluster, "task": {"type": job, "index": index}})
                self.tasks[job, index] = subprocess.Popen(
                    [sys.executable, "-m", "tf_embed_ops.distribute.server"],
                    env=_env(TF_CONFIG=config),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
        deadline = time.monotonic() + _START_TIMEOUT_S
        for key, task in self.tasks.items():  # each prints one line once it serves
            ready, _, _ = select.select([task.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = task.stdout.readline() if ready else ""
            assert "server started" in line, f"task {key} did not start (rc {task.poll()}): {line!r}"
        return self

    def __exit__(self, *exc):
        for task in self.tasks.values():
            if task.poll() is None:
                task.kill()
            task.wait(timeout=60)

    def run_chief(self, scenario: str, out_dir, kill=None, at=(0, 0)) -> dict:
        config = json.dumps({"cluster": self.cluster, "task": {"type": "chief", "index": 0}})
        pid = str(self.tasks[kill].pid) if kill else "0"
        result, _ = run_script_for_json(
            [os.path.abspath(__file__), scenario, str(out_dir), pid, str(at[0]), str(at[1])],
            os.path.join(out_dir, f"{scenario}.json"),
            env=_env(TF_CONFIG=config),
            timeout=_CHIEF_TIMEOUT_S,
            what=f"chief {scenario}",
        )
        return result


def test_a_worker_killed_mid_epoch_is_replaced_and_training_finishes(tmp_path):
    with _Job() as job:
        run = job.run_chief("worker_killed", tmp_path, kill=("worker", 1), at=(0, 2))
        assert job.tasks["worker", 1].poll() is not None  # it really died
    assert "error" not in run, run.get("error")
    assert run["epochs"] == list(range(EPOCHS))
    loss = run["history"]["loss"]
    assert np.all(np.isfinite(loss)) and loss[-1] < loss[0]


def test_a_killed_parameter_server_stops_training_and_a_restart_resumes_identically(tmp_path):
    with _Job() as job:
        first = job.run_chief("ps_killed", tmp_path, kill=("ps", 1), at=(1, 2))
    assert "error" in first, "training went on without a parameter server"
    assert "parameter server is unreachable" in first["error"] and "ckpt-1" in first["error"]
    assert "continues with epoch 2" in first["error"]
    with _Job() as job:  # a fresh job: new processes, new ports, the same checkpoint directory
        resumed = job.run_chief("resumed", tmp_path)
    assert "error" not in resumed, resumed.get("error")
    assert resumed["tables_at_start"] == first["tables_after_epoch"]["0"]  # bit-identical tables
    assert resumed["epochs"] == list(range(1, EPOCHS))


if __name__ == "__main__":
    _chief(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
