"""`tf_embed_ops.distribute.fit` on in-process localhost clusters (2 parameter servers), against Keras' own
`model.fit` of the same model on one machine.

Every cluster runs in a fresh Python process (in-process servers cannot be shut down): this file, run as a
script (`python test_distribute_fit.py SCENARIO OUT_DIR`), killed after `_TIMEOUT_S`.

* `first`: 1 worker, 2 epochs with validation and a CheckpointManager.  With one worker the steps run one after
  another, in dataset order, so tables, dense weights and every epoch's logs must equal single-machine
  `model.fit` on the same batches.
* `resume`: a fresh cluster, the same checkpoint directory, `epochs=3`: restores epoch 2 (tables, slots, dense
  weights and Adam state), runs epoch 3 only, and must equal 3 single-machine epochs.
* `two_workers`: 2 workers (asynchronous): the loss goes down, callbacks and the progress bar run, rows never
  looked up do not move, EarlyStopping stops the run.
The argument checks (no cluster) are in the fast tier.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from tests.distribute_fit_support import (
    BATCH,
    INIT,
    STEPS,
    USED_ROWS,
    epoch_data,
    epoch_dataset_fn,
    make_layer,
    make_model,
    table_values,
)
from tests.script_support import run_script_for_json

_TIMEOUT_S = 300


# ------------------------------------------------------------------------ the cluster side (script)


def _has_tensorboard() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def _summary_tags(tf, log_dir: str) -> dict:
    """{subdirectory of log_dir: {tag: number of steps written}} from the event files TensorBoard wrote."""
    tags: dict = {}
    for root, _, files in os.walk(log_dir):
        for name in files:
            if "tfevents" not in name:
                continue
            per_dir = tags.setdefault(os.path.relpath(root, log_dir), {})
            for event in tf.compat.v1.train.summary_iterator(os.path.join(root, name)):
                for value in event.summary.value:
                    per_dir[value.tag] = per_dir.get(value.tag, 0) + 1
    return tags


def _run_scenario(scenario: str, out_dir: str) -> None:
    import keras
    import tensorflow as tf

    from tf_embed_ops import distribute as ted
    from tf_embed_ops.distribute.keras_layer import ShardedEmbeddingLayer

    dataset_fn = epoch_dataset_fn(tf)

    class Recorder(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.events = []
            self.tables_at_start = None

        def on_train_begin(self, logs=None):
            self.tables_at_start = table_values(tf, layer)

        def on_epoch_begin(self, epoch, logs=None):
            self.events.append(["epoch_begin", epoch])

        def on_train_batch_end(self, batch, logs=None):
            self.events.append(["batch_end", batch, sorted(logs)])

        def on_epoch_end(self, epoch, logs=None):
            self.events.append(["epoch_end", epoch, sorted(logs)])

    strategy = ted.create_local_cluster(num_workers=2 if scenario == "two_workers" else 1, num_ps=2)
    with strategy.scope():
        layer = make_layer(tf, ShardedEmbeddingLayer)
        model = make_model(tf, keras, layer)
    results = {}
    if scenario in ("first", "resume"):
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        manager = tf.train.CheckpointManager(checkpoint, os.path.join(out_dir, "ckpt"), max_to_keep=2)
        recorder = Recorder()
        history = ted.fit(
            model,
            dataset_fn,
            epochs=2 if scenario == "first" else 3,
            steps_per_epoch=STEPS,
            callbacks=[recorder],
            validation_data=dataset_fn,
            validation_steps=STEPS,
            verbose=0,
            checkpoint_manager=manager,
        )
        results["tables_at_start"] = recorder.tables_at_start
        results["checkpoints"] = [os.path.basename(p) for p in manager.checkpoints]
    else:
        recorder = Recorder()
        history = ted.fit(
            model,
            dataset_fn,
            epochs=3,
            steps_per_epoch=STEPS,
            callbacks=[recorder],
            validation_data=dataset_fn,
            validation_steps=4,
            verbose=1,
        )
        stopper = keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=1e9, patience=0)
        # Keras' TensorBoard callback writes its epoch summaries on the chief (it needs the tensorboard package).
        tensorboard_dir = os.path.join(out_dir, "tensorboard")
        board = [keras.callbacks.TensorBoard(log_dir=tensorboard_dir)] if _has_tensorboard() else []
        stopped = ted.fit(
            model,
            dataset_fn,
            epochs=5,
            steps_per_epoch=2,
            callbacks=[stopper, *board],
            validation_data=dataset_fn,
            validation_steps=1,
            verbose=0,
        )
        results["stopped_epochs"] = stopped.epoch
        results["tensorboard"] = _summary_tags(tf, tensorboard_dir) if board else None
        outside = make_model(tf, keras, make_layer(tf, ShardedEmbeddingLayer, num_shards=2))  # not in the scope
        try:
            ted.fit(
                outside,
                dataset_fn,
                steps_per_epoch=1,
                verbose=0,
                coordinator=tf.distribute.coordinator.ClusterCoordinator(strategy),
            )
            results["outside_scope_error"] = None
        except ValueError as e:
            results["outside_scope_error"] = str(e)
    results.update(
        history=history.history,
        epochs=history.epoch,
        events=recorder.events,
        table=table_values(tf, layer),
        dense=[w.tolist() for w in model.get_layer("hidden").get_weights() + model.get_layer("out").get_weights()],
    )
    with open(os.path.join(out_dir, f"{scenario}.json"), "w") as f:
        json.dump(results, f)


# ------------------------------------------------------------------------ the pytest side


def _run_cluster(scenario: str, out_dir) -> tuple:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return run_script_for_json(
        [os.path.abspath(__file__), scenario, str(out_dir)],
        os.path.join(out_dir, f"{scenario}.json"),
        env=env,
        timeout=_TIMEOUT_S,
        what=scenario,
    )


def _single_machine(epochs: int) -> dict:
    """Keras' own fit, one process, the same model with the tables on one device, the same batches."""
    import keras
    import tensorflow as tf

    from tf_embed_ops.distribute.keras_layer import ShardedEmbeddingLayer

    ids, y = epoch_data()
    layer = make_layer(tf, ShardedEmbeddingLayer, num_shards=2)
    model = make_model(tf, keras, layer)
    history = model.fit(
        {"watched": ids},
        y,
        batch_size=BATCH,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        validation_data=({"watched": ids}, y),
    )
    dense = model.get_layer("hidden").get_weights() + model.get_layer("out").get_weights()
    return {"history": history.history, "table": table_values(tf, layer), "dense": [w.tolist() for w in dense]}


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("fit")
    first, _ = _run_cluster("first", out_dir)
    resume, _ = _run_cluster("resume", out_dir)
    two, stdout = _run_cluster("two_workers", out_dir)
    return {"first": first, "resume": resume, "two_workers": two, "two_workers_stdout": stdout}


def _assert_same_training(run: dict, ref: dict, epochs: slice) -> None:
    np.testing.assert_allclose(run["table"], ref["table"], rtol=1e-5, atol=1e-6)
    for a, b in zip(run["dense"], ref["dense"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert sorted(run["history"]) == sorted(ref["history"]) == ["loss", "mae", "val_loss", "val_mae"]
    for key, values in run["history"].items():
        np.testing.assert_allclose(values, ref["history"][key][epochs], rtol=1e-5, atol=1e-7, err_msg=key)


@pytest.mark.slow
def test_one_worker_fit_equals_single_machine_keras_fit(clusters):
    run = clusters["first"]
    assert run["epochs"] == [0, 1]
    _assert_same_training(run, _single_machine(2), slice(0, 2))
    assert run["history"]["loss"][1] < run["history"]["loss"][0]
    assert run["checkpoints"] == ["ckpt-1", "ckpt-2"]


@pytest.mark.slow
def test_restart_resumes_from_the_last_checkpoint(clusters):
    first, resume = clusters["first"], clusters["resume"]
    assert resume["tables_at_start"] == first["table"]  # bit-identical restore
    assert resume["epochs"] == [2]
    _assert_same_training(resume, _single_machine(3), slice(2, 3))
    assert resume["checkpoints"] == ["ckpt-2", "ckpt-3"]


@pytest.mark.slow
def test_two_workers_train_and_drive_the_callbacks(clusters):
    run = clusters["two_workers"]
    loss = run["history"]["loss"]
    assert run["epochs"] == [0, 1, 2] and len(loss) == 3 and loss[2] < loss[0]
    expected = []
    for epoch in range(3):
        expected.append(["epoch_begin", epoch])
        expected += [["batch_end", step, ["loss", "mae"]] for step in range(STEPS)]
        expected.append(["epoch_end", epoch, ["loss", "mae", "val_loss", "val_mae"]])
    assert run["events"] == expected
    table = np.asarray(run["table"], np.float32)
    np.testing.assert_array_equal(table[USED_ROWS:], np.float32(INIT))  # never looked up: never updated
    assert np.all(np.any(table[:USED_ROWS] != np.float32(INIT), axis=1))
    assert "Epoch 3/3" in clusters["two_workers_stdout"] and "val_loss" in clusters["two_workers_stdout"]
    assert run["stopped_epochs"] == [0, 1]  # EarlyStopping with an unreachable min_delta stops after epoch 2
    assert "created outside the strategy's scope" in run["outside_scope_error"]
    if run["tensorboard"] is not None:  # Keras' TensorBoard callback: one epoch summary per epoch run (2)
        assert run["tensorboard"]["train"]["epoch_loss"] == 2, run["tensorboard"]
        assert run["tensorboard"]["validation"]["epoch_loss"] == 2, run["tensorboard"]


# ------------------------------------------------------------------------ argument checks (fast, no cluster)


def _compiled_model():
    import keras
    import tensorflow as tf

    from tf_embed_ops.distribute.keras_layer import ShardedEmbeddingLayer

    return make_model(tf, keras, make_layer(tf, ShardedEmbeddingLayer, num_shards=2))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"epochs": 0, "steps_per_epoch": 1}, "`epochs` must be an int >= 1; got 0"),
        ({"epochs": 1.5, "steps_per_epoch": 1}, "`epochs`"),
        ({"steps_per_epoch": None}, "`steps_per_epoch` is required"),
        ({"steps_per_epoch": 0}, "`steps_per_epoch` must be an int >= 1; got 0"),
        ({"steps_per_epoch": True}, "`steps_per_epoch`"),
        ({"steps_per_epoch": 1, "initial_epoch": -1}, "`initial_epoch` must be an int >= 0; got -1"),
        ({"steps_per_epoch": 1, "validation_data": ([1], [2]), "validation_steps": 1}, "`validation_data` must"),
        ({"steps_per_epoch": 1, "validation_data": lambda ctx: None}, "`validation_steps` is required"),
        ({"steps_per_epoch": 1, "validation_data": lambda ctx: None, "validation_steps": 0}, "`validation_steps`"),
        ({"steps_per_epoch": 1, "verbose": 3}, "`verbose` must be 0, 1, 2 or 'auto'; got 3"),
    ],
)
def test_fit_rejects_bad_arguments_before_touching_the_model(kwargs, match):
    import tensorflow as tf

    from tf_embed_ops.distribute import fit

    model = _compiled_model()
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match=match):
        fit(model, lambda ctx: None, **kwargs)
    for a, b in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(a, b)
    assert tf.distribute.get_strategy() is not None


def test_fit_needs_a_compiled_model_under_parameter_server_strategy():
    import keras
    import tensorflow as tf

    from tf_embed_ops.distribute import fit
    from tf_embed_ops.distribute.keras_layer import ShardedEmbeddingLayer

    with pytest.raises(ValueError, match="`dataset_fn` must be a function"):
        fit(_compiled_model(), "data.csv", steps_per_epoch=1)
    ids = keras.Input(shape=(), dtype="int64", name="watched")
    layer = make_layer(tf, ShardedEmbeddingLayer, num_shards=2)
    uncompiled = keras.Model({"watched": ids}, layer({"watched": ids})["watched"])
    with pytest.raises(ValueError, match="compiled model"):
        fit(uncompiled, lambda ctx: None, steps_per_epoch=1)
    with pytest.raises(ValueError, match="ParameterServerStrategy.*strategy is _DefaultDistributionStrategy"):
        fit(_compiled_model(), lambda ctx: None, steps_per_epoch=1)


if __name__ == "__main__":
    _run_scenario(sys.argv[1], sys.argv[2])
