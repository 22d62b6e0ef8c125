"""Child process of test_tiered_publisher's kill test: publishes a model with a static and a dynamic tiered table
forever (a full version, deltas, a full version every fourth round), printing each version, until it is killed.

`python tiered_publish_kill_child.py <directory>`: the tables' row files under `<directory>/rows-<pid>` (a killed
process's row files are scratch), the chain in `<directory>/chain`. The static table has 20,000 rows of 16 floats
(Adagrad) read in chunks of 64 KiB, so a full version writes about 40 row slices.
"""

from __future__ import annotations

import os
import sys

import keras
import numpy as np
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops import keras as te_keras

V, DIM = 20000, 16


def build_model(directory: str) -> keras.Model:
    """The model: features "s" (static, tiered) and "d" (dynamic, tiered) over the same ids, row files under
    `<directory>/rows-<pid>`."""
    rows = os.path.join(directory, f"rows-{os.getpid()}")
    storage = te.Tiered(cache_bytes=1 << 20, directory=rows, chunk_bytes=64 << 10)
    static = te.TableConfig(V, DIM, name="s", optimizer=te.optimizers.Adagrad(0.1), storage=storage)
    dynamic = te.DynamicTableConfig("d", DIM, optimizer=te.optimizers.Adagrad(0.1), seed=3, storage=storage)
    emb = tf.tpu.experimental.embedding
    layer = te_keras.TPUEmbedding({"s": emb.FeatureConfig(static, name="s"), "d": emb.FeatureConfig(dynamic, name="d")})
    ids = keras.Input(shape=(), dtype="int64", name="f")
    acts = layer({"s": ids, "d": ids})
    model = keras.Model({"f": ids}, keras.layers.Dense(1)(keras.layers.Concatenate()([acts["s"], acts["d"]])))
    model.compile(optimizer="sgd", loss="mse")
    return model


def main(directory: str) -> None:
    model = build_model(directory)
    pub = te.serving.Publisher(model, os.path.join(directory, "chain"), {"f": tf.TensorSpec([None], tf.int64)})
    print("full", pub.publish_full(), flush=True)
    rng = np.random.default_rng(os.getpid())
    for round_ in range(1, 10**6):
        x = {"f": rng.integers(0, V, size=64).astype(np.int64)}
        model.fit(x, np.ones([64, 1], np.float32), batch_size=32, verbose=0)
        print("delta", pub.publish_delta(), flush=True)
        if round_ % 4 == 0:
            print("full", pub.publish_full(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
