"""The models, data and cases of the collective-mode tests: run on every worker under the launcher, and imported
by the tests for the single-process reference.

    python -m tf_embed_ops.distribute.launch --workers N --collective -- \\
        python -m tests.collective_cases OUT CASE [CASE ...]

runs the cases one after the other in the same worker processes (one launch for many cases); the chief writes
`OUT/<case>.npz` (every weight of the model, by path) after each. A case is `<optimizer>` (sgd, adagrad, adam:
frozen dense layer, so the activation gradients are those of one process and the tables must match bitwise),
`<optimizer>_dense` (the dense layer trains too: float tolerance), `save` (one epoch, checkpointed by `fit` into
OUT/ckpt), `resume` (fit restores OUT/ckpt and trains until epoch 2), `die` (as `resume`, but worker 1 kills
itself at its second batch), `midsave` (adagrad, one epoch; after step MID_STEPS every worker records what its layer
holds in OUT/midsave_<worker>.json and saves the model with its own `tf.train.Checkpoint`, the chief into
OUT/midckpt).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import sys
import tempfile
import weakref

import numpy as np

GLOBAL_BATCH, STEPS = 8, 3
MID_STEPS = 2  # `midsave`: the steps trained when the user's own checkpoint is saved
V1, V2, DIM = 11, 13, 4
KEYS = np.array([-5, 3, 2**40 + 7, 123456789, 98765, 2**62, 17, -(2**50)], np.int64)  # the dynamic table's keys


def global_batches() -> list:
    """STEPS global batches (the same every epoch): ids for features a (dense), b (ragged), c (dense [B, 1])."""
    out = []
    for step in range(STEPS):
        rng = np.random.default_rng(100 + step)
        lengths = rng.integers(0, 4, GLOBAL_BATCH)
        out.append(
            {
                "a": rng.integers(0, V1, GLOBAL_BATCH).astype(np.int64),
                "b": [rng.integers(0, V1, n).astype(np.int64) for n in lengths],
                "c": rng.integers(0, V2, (GLOBAL_BATCH, 1)).astype(np.int64),
                "d": [rng.choice(KEYS, n).astype(np.int64) for n in rng.integers(0, 4, GLOBAL_BATCH)],
                "y": rng.standard_normal((GLOBAL_BATCH, 1)).astype(np.float32),
            }
        )
    return out


def to_inputs(tf, batch: dict, start: int, stop: int) -> tuple:
    x = {
        "a": tf.constant(batch["a"][start:stop]),
        "b": tf.ragged.constant([list(r) for r in batch["b"][start:stop]], dtype=tf.int64, ragged_rank=1),
        "c": tf.constant(batch["c"][start:stop]),
        "d": tf.ragged.constant([list(r) for r in batch["d"][start:stop]], dtype=tf.int64, ragged_rank=1),
    }
    return x, tf.constant(batch["y"][start:stop])


def table_optimizer(tf, name: str):
    emb = tf.tpu.experimental.embedding
    return {"sgd": emb.SGD(0.1), "adagrad": emb.Adagrad(0.1), "adam": emb.Adam(0.05)}[name]


def build_model(tf, keras, optimizer: str, dense_trains: bool):
    """Two tables (t1: features a and b, mean; t2: feature c, sqrtn), fixed initial values, and a dynamic table
    (feature d, int64 keys, sum), Dense(1) on top."""
    import tf_embed_ops as te

    emb = tf.tpu.experimental.embedding
    t1 = emb.TableConfig(V1, DIM, name="t1", combiner="mean")
    t2 = emb.TableConfig(V2, DIM, name="t2", combiner="sqrtn")
    dyn = te.DynamicTableConfig("dyn", dim=DIM, optimizer=table_optimizer(tf, optimizer), combiner="sum", seed=3)
    features = {
        "a": emb.FeatureConfig(t1),
        "b": emb.FeatureConfig(t1),
        "c": emb.FeatureConfig(t2),
        "d": emb.FeatureConfig(dyn),
    }
    layer = te.keras.TPUEmbedding(features, table_optimizer(tf, optimizer), name="embedding")
    inputs = {
        "a": keras.Input(shape=(), dtype="int64", name="a"),
        "b": keras.Input(shape=(None,), dtype="int64", ragged=True, name="b"),
        "c": keras.Input(shape=(1,), dtype="int64", name="c"),
        "d": keras.Input(shape=(None,), dtype="int64", ragged=True, name="d"),
    }
    acts = layer(inputs)
    dense = keras.layers.Dense(
        1,
        trainable=dense_trains,
        kernel_initializer=keras.initializers.RandomNormal(seed=1),
        bias_initializer="zeros",
        name="out",
    )
    model = keras.Model(inputs, dense(keras.layers.Concatenate()([acts["a"], acts["b"], acts["c"], acts["d"]])))
    model.compile(keras.optimizers.SGD(0.05), "mse")
    rng = np.random.default_rng(7)
    for var in layer.embedding_tables.values():
        var.assign(rng.standard_normal(tuple(var.shape)).astype(np.float32))
    return model


def weights(model) -> dict:
    """Every variable by path, and each dynamic table's content (keys, rows, slots) as `dynamic/<table>/<field>`."""
    out = {v.path: np.asarray(v) for v in model.weights}
    for layer in model.layers:
        for config, table in getattr(layer, "dynamic_tables", {}).items():
            for field, value in table.export().items():
                if field in ("keys", "weights", "slots"):
                    out[f"dynamic/{config.name}/{field}"] = np.asarray(value)
    return out


def reference(case: str, epochs: int = 1, steps: int | None = None) -> dict:
    """The case trained in this process with `train_on_batch` on the global batches (no strategy): `epochs` epochs,
    or only the first `steps` batches."""
    import keras
    import tensorflow as tf

    optimizer, _, dense = case.partition("_")
    model = build_model(tf, keras, optimizer, dense == "dense")
    for batch in (global_batches() * epochs)[:steps]:
        model.train_on_batch(*to_inputs(tf, batch, 0, GLOBAL_BATCH))
    return weights(model)


def checkpoint(tf, model):
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer)


def save_reference_checkpoint(directory: str, epochs: int) -> dict:
    """The `adagrad` case trained `epochs` epochs in this process, saved as `fit` saves it (checkpoint-<epochs>)."""
    import keras
    import tensorflow as tf

    model = build_model(tf, keras, "adagrad", False)
    for _ in range(epochs):
        for batch in global_batches():
            model.train_on_batch(*to_inputs(tf, batch, 0, GLOBAL_BATCH))
    tf.train.CheckpointManager(checkpoint(tf, model), directory, max_to_keep=2).save(checkpoint_number=epochs)
    return weights(model)


def restore_in_one_process(directory: str) -> dict:
    """A fresh `adagrad` model in this process (no strategy) with the latest checkpoint of `directory` restored."""
    import keras
    import tensorflow as tf

    model = build_model(tf, keras, "adagrad", False)
    checkpoint(tf, model).restore(tf.train.latest_checkpoint(directory)).assert_existing_objects_matched()
    return weights(model)


def _dataset_fn(tf, die_at: int | None = None, bad: str | None = None):
    batches = global_batches()

    def dataset_fn(context):
        worker, workers = context.input_pipeline_id, context.num_input_pipelines
        size = GLOBAL_BATCH // workers

        def generate():
            seen = 0
            while True:
                for batch in batches:
                    if die_at is not None and worker == 1 and seen == die_at:
                        os.kill(os.getpid(), signal.SIGKILL)  # a worker lost mid-epoch
                    seen += 1
                    if bad == "bad_id" and worker == 1:
                        batch = dict(batch, a=np.full_like(batch["a"], V1))  # one past the last row
                    stop = (worker + 1) * size - (1 if bad == "bad_batch" and worker == 1 else 0)
                    yield to_inputs(tf, batch, worker * size, stop)

        spec = (
            {
                "a": tf.TensorSpec([None], tf.int64),
                "b": tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64),
                "c": tf.TensorSpec([None, 1], tf.int64),
                "d": tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64),
            },
            tf.TensorSpec([None, 1], tf.float32),
        )
        return tf.data.Dataset.from_generator(generate, output_signature=spec)

    return dataset_fn


def main(out: str, cases: list) -> None:
    import keras
    import tensorflow as tf

    from tf_embed_ops import distribute as ted
    from tf_embed_ops.distribute.collective.loop import worker_index

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    worker, _ = worker_index()
    for case in cases:
        if case in BAD_CASES:
            _bad_case(tf, keras, ted, strategy, out, case, worker)
            continue
        kind = case if case in ("save", "resume", "die") else None
        optimizer, _, dense = ("adagrad", "", "") if kind or case == "midsave" else case.partition("_")
        with strategy.scope():
            model = build_model(tf, keras, optimizer, dense == "dense")
        callbacks = [_mid_epoch_save(tf, keras, model, out, worker)] if case == "midsave" else None
        manager = None
        if kind:
            manager = tf.train.CheckpointManager(checkpoint(tf, model), os.path.join(out, "ckpt"), max_to_keep=2)
        # `die` runs after a checkpoint of epoch 1: worker 1 dies at its second batch of epoch 2.
        dataset_fn = _dataset_fn(tf, die_at=1 if kind == "die" else None)
        ted.fit(
            model,
            dataset_fn,
            epochs=1 if kind == "save" else 2 if kind else 1,
            steps_per_epoch=STEPS,
            strategy=strategy,
            verbose=0,
            callbacks=callbacks,
            checkpoint_manager=manager,
            timeout_seconds=float(os.environ.get("COLLECTIVE_TIMEOUT", "120")),
        )
        if worker == 0:
            np.savez(os.path.join(out, f"{case}.npz"), **weights(model))
        print(f"case {case} done", flush=True)


def _mid_epoch_save(tf, keras, model, out: str, worker: int):
    """`midsave`'s callback: after MID_STEPS steps, what this worker's layer holds (OUT/midsave_<worker>.json: the
    rows of every table and slot variable, the layer's and the shard's dynamic keys, how many of the layer's full
    variables are still alive), then the model saved by the user's own Checkpoint on every worker."""
    from tf_embed_ops.distribute.collective.loop import embedding_layers
    from tf_embed_ops.distribute.collective.shards import attached

    (layer,) = embedding_layers(model)
    full = [weakref.ref(v.value) for v in layer.weights if len(v.shape) == 2]  # before fit: the full variables

    class Callback(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch != MID_STEPS - 1:
                return
            gc.collect()
            rows = {t.name: int(np.asarray(v).shape[0]) for t, v in layer.embedding_tables.items()}
            for t, slots in layer.slot_variables.items():
                rows.update({f"{t.name}/{s}": int(np.asarray(v).shape[0]) for s, v in slots.items()})
            (dynamic,) = layer.dynamic_tables.values()
            facts = {
                "rows": rows,
                "layer_dynamic_size": int(dynamic.size()),
                "shard_dynamic_keys": attached(layer).dynamic_shard(0).export()["keys"].numpy().tolist(),
                "full_alive": sum(ref() is not None for ref in full),
            }
            with open(os.path.join(out, f"midsave_{worker}.json"), "w") as f:
                json.dump(facts, f)
            ckpt = checkpoint(tf, model)  # every worker saves (MultiWorkerMirroredStrategy); the others' is scratch
            if worker == 0:
                ckpt.save(os.path.join(out, "midckpt", "ckpt"))
            else:
                scratch = tempfile.mkdtemp(prefix="midsave")
                try:
                    ckpt.save(os.path.join(scratch, "ckpt"))
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)

    return Callback()


BAD_CASES = ("overflow", "bad_id", "bad_batch")


def _bad_case(tf, keras, ted, strategy, out: str, case: str, worker: int) -> None:
    """A step every worker must refuse (the same error on each, nothing changed): writes OUT/<case>.txt and .npz."""
    with strategy.scope():
        model = build_model(tf, keras, "adagrad", True)
    before = weights(model)
    try:
        ted.fit(
            model,
            _dataset_fn(tf, bad=case),
            epochs=1,
            steps_per_epoch=STEPS,
            strategy=strategy,
            verbose=0,
            max_ids_per_worker=1 if case == "overflow" else None,
            timeout_seconds=60.0,
        )
        message = "no error"
    except tf.errors.InvalidArgumentError as e:
        message = e.message
    unchanged = all(np.array_equal(before[k], v) for k, v in weights(model).items())
    if worker == 0:
        with open(os.path.join(out, f"{case}.txt"), "w") as f:
            f.write(f"unchanged={unchanged}\n{message}")
    print(f"case {case} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
