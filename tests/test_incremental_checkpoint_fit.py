"""te.checkpoint.IncrementalCheckpointManager as te.distribute.fit's checkpoint_manager (slow: local clusters).

A first run trains 2 epochs on a 1-worker, 2-parameter-server cluster, saving a full checkpoint then a delta;
a second process resumes with the same directory: the tables it starts from are bit-identical to the first
run's last ones, and it trains epoch 3 only.
"""

import json
import os
import sys

import pytest

from tests.distribute_fit_support import STEPS, epoch_dataset_fn, make_layer, make_model, table_values
from tests.script_support import run_script_for_json


def _run(stage: str, out_dir: str) -> None:
    import keras
    import tensorflow as tf

    import tf_embed_ops as te
    from tf_embed_ops import distribute as ted
    from tf_embed_ops.distribute.keras_layer import ShardedEmbeddingLayer

    dataset_fn = epoch_dataset_fn(tf)

    strategy = ted.create_local_cluster(num_workers=1, num_ps=2)
    with strategy.scope():
        layer = make_layer(tf, ShardedEmbeddingLayer)
        model = make_model(tf, keras, layer)
        # The optimizer's variables exist before a restore, so the deltas' values reach them (docs/checkpoints.md).
        model.optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = te.checkpoint.IncrementalCheckpointManager(checkpoint, os.path.join(out_dir, "chain"), full_every=0)
    started = {}

    class Recorder(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            started["table"] = table_values(tf, layer)

    history = ted.fit(
        model,
        dataset_fn,
        epochs=2 if stage == "first" else 3,
        steps_per_epoch=STEPS,
        callbacks=[Recorder()],
        verbose=0,
        checkpoint_manager=manager,
    )
    result = {
        "epochs": history.epoch,
        "tables_at_start": started["table"],
        "table": table_values(tf, layer),
        "chain": [(e["name"], e["kind"]) for e in manager.chain],
    }
    with open(os.path.join(out_dir, f"{stage}.json"), "w") as f:
        json.dump(result, f)


def _subprocess(stage: str, out_dir) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=root)
    result, _ = run_script_for_json(
        [os.path.abspath(__file__), stage, str(out_dir)],
        os.path.join(out_dir, f"{stage}.json"),
        env=env,
        timeout=600,
        what=stage,
    )
    return result


@pytest.mark.slow
def test_fit_resumes_from_an_incremental_chain(tmp_path):
    first = _subprocess("first", tmp_path)
    assert first["epochs"] == [0, 1]
    assert first["chain"] == [["ckpt-1", "full"], ["ckpt-2", "delta"]]
    resume = _subprocess("resume", tmp_path)
    assert resume["epochs"] == [2]
    assert resume["tables_at_start"] == first["table"]  # bit-identical restore of full + delta
    assert resume["chain"] == [["ckpt-1", "full"], ["ckpt-2", "delta"], ["ckpt-3", "delta"]]


if __name__ == "__main__":
    _run(sys.argv[1], sys.argv[2])
