"""The CTR example (ctr.py) trained synchronously by N worker processes, tables sharded over them:

    python -m tf_embed_ops.distribute.launch --workers 2 --collective -- \\
        python -m tf_embed_ops.examples.ctr --collective [--smoke]

Every worker builds the same DLRM model under `tf.distribute.MultiWorkerMirroredStrategy().scope()`, reads its
own 1/N of each global batch (`dataset_fn(input_context)`), and `te.distribute.fit` trains it: each table's rows
live on worker `row % N`, ids and gradient rows travel all-to-all, the dense layers are mirrored
(docs/collective_training.md). Worker 0 then prints the train and test AUC of the trained model.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from tf_embed_ops import distribute as ted
from tf_embed_ops import keras as te_keras
from tf_embed_ops.distribute.collective.loop import worker_index

__all__ = ["run"]


def _auc(model: keras.Model, features: dict, labels: np.ndarray) -> float:
    """AUC of the model's predictions, batch by batch in this process (the layer's full, trained tables)."""
    metric = keras.metrics.AUC()
    data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(2048)
    for x, y in data:
        metric.update_state(y, model(x, training=False))
    return float(metric.result())


def run(args: argparse.Namespace, make_data: Callable, feature_config: Callable, build_model: Callable) -> dict:
    """Trains ctr.py's model (its `make_data`, `feature_config` and `build_model`, passed in by ctr.py's `main`)
    on this worker; returns its train/test AUC and fit seconds."""
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    worker, workers = worker_index()
    keras.utils.set_random_seed(0)
    n_train, n_test, epochs = (2000, 500, 1) if args.smoke else (args.train_size, args.test_size, args.epochs)
    if args.batch_size % workers:
        raise ValueError(
            f"Argument `--batch-size` ({args.batch_size}) must be a multiple of the number of workers ({workers}): "
            "it is the global batch, split evenly over the workers."
        )
    train_x, train_y = make_data(n_train, seed=1)
    test_x, test_y = make_data(n_test, seed=2)
    with strategy.scope():
        fc, optimizer = feature_config()
        model = build_model(te_keras.TPUEmbedding(fc, optimizer, name="embedding"))
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate), loss="binary_crossentropy")

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        per_worker = context.get_per_replica_batch_size(args.batch_size)
        data = tf.data.Dataset.from_tensor_slices((train_x, train_y)).shuffle(n_train, seed=0)
        data = data.shard(context.num_input_pipelines, context.input_pipeline_id)
        return data.batch(per_worker, drop_remainder=True).repeat().prefetch(2)

    steps = n_train // args.batch_size
    start = time.perf_counter()
    ted.fit(
        model,
        dataset_fn,
        epochs=epochs,
        steps_per_epoch=steps,
        strategy=strategy,
        verbose=(2 if not args.quiet else 0) if worker == 0 else 0,
    )
    seconds = time.perf_counter() - start
    results = {"train_auc": _auc(model, train_x, train_y), "test_auc": _auc(model, test_x, test_y)}
    results["fit_seconds"] = seconds
    if worker == 0:
        print(
            f"\n== collective: {workers} workers, global batch {args.batch_size} ({steps} steps per epoch)\n"
            f"train AUC {results['train_auc']:.4f}  test AUC {results['test_auc']:.4f}  fit {seconds:.1f} s",
            flush=True,
        )
    return results
