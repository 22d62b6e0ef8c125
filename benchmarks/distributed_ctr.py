"""The CTR example (tf_embed_ops.examples.ctr) trained with `tf_embed_ops.distribute.fit` on a local job of
processes, against Keras' own `model.fit` of the same model with the single-machine embedding layer.

    python benchmarks/distributed_ctr.py --single        # one process: tf_embed_ops.keras.TPUEmbedding + model.fit
    python -m tf_embed_ops.distribute.launch --ps 2 --workers 2 -- python benchmarks/distributed_ctr.py

Same data (the example's generator and sizes), model, batch size, learning rates and number of epochs; on the
cluster an epoch is `train_size / batch_size` steps over all workers together, each worker reading the training
set in its own random order (asynchronous training).  Both print one JSON line with the test AUC, computed on
this process with `keras.metrics.AUC` on the example's test set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras
import numpy as np
import tensorflow as tf

from tf_embed_ops import distribute as ted
from tf_embed_ops import keras as te_keras
from tf_embed_ops.examples import ctr


def _test_auc(model, test_x, test_y) -> float:
    auc = keras.metrics.AUC(name="auc")
    for x, y in ctr.dataset(test_x, test_y, 2048, shuffle=False):
        auc.update_state(y, model(x, training=False))
    return float(auc.result())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single", action="store_true")
    parser.add_argument("--train-size", type=int, default=40000)
    parser.add_argument("--test-size", type=int, default=10000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=0.003)
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    train_x, train_y = ctr.make_data(args.train_size, seed=1)
    test_x, test_y = ctr.make_data(args.test_size, seed=2)
    fc, _ = ctr.feature_config()

    def compiled(layer):
        model = ctr.build_model(layer)
        model.compile(
            keras.optimizers.Adam(args.learning_rate), "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")]
        )
        return model

    start = time.perf_counter()
    if args.single:
        model = compiled(te_keras.TPUEmbedding(fc, None, name="embedding"))
        model.fit(ctr.dataset(train_x, train_y, args.batch_size, shuffle=True), epochs=args.epochs, verbose=2)
        mode = "single machine, keras model.fit"
    else:
        strategy = tf.distribute.experimental.ParameterServerStrategy(
            tf.distribute.cluster_resolver.TFConfigClusterResolver()
        )
        with strategy.scope():
            model = compiled(ted.ShardedEmbeddingLayer(fc, None, name="embedding"))

        def dataset_fn(input_context):
            ds = tf.data.Dataset.from_tensor_slices((train_x, train_y)).shuffle(len(train_y))
            return ds.batch(args.batch_size).repeat()

        steps = int(np.ceil(args.train_size / args.batch_size))
        ted.fit(model, dataset_fn, epochs=args.epochs, steps_per_epoch=steps, verbose=2)
        mode = "cluster, te.distribute.fit"
    seconds = time.perf_counter() - start
    print(json.dumps({"mode": mode, "test_auc": _test_auc(model, test_x, test_y), "fit_seconds": seconds}))
    sys.stdout.flush()
    os._exit(0)  # the coordinator's threads need not be joined


if __name__ == "__main__":
    main()
