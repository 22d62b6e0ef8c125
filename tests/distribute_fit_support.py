"""The model, data and layer that `distribute.fit`'s tests train, on the cluster side and the pytest side alike.

Shared by test_distribute_fit.py (which also runs as the cluster's script), test_distribute_fit_launch.py and
test_distribute_fit_faults.py; TensorFlow and Keras are passed in, so importing this module loads neither.
"""

from __future__ import annotations

import numpy as np

ROWS, DIM, USED_ROWS, BATCH, STEPS, INIT = 11, 3, 9, 8, 10, 0.25


def epoch_data() -> tuple:
    """One epoch: STEPS batches of BATCH ids in [0, USED_ROWS) (rows 9 and 10 are never looked up)."""
    rng = np.random.default_rng(5)
    ids = rng.integers(USED_ROWS, size=STEPS * BATCH).astype(np.int64)
    y = (np.sin(ids.astype(np.float32)) + 0.1)[:, None].astype(np.float32)
    return ids, y


def epoch_dataset_fn(tf):
    """A `dataset_fn` for `fit`: the epoch's batches (`epoch_data`), repeated."""
    ids, y = epoch_data()
    return lambda input_context: tf.data.Dataset.from_tensor_slices(({"watched": ids}, y)).batch(BATCH).repeat()


def make_model(tf, keras, layer):
    keras.utils.set_random_seed(3)
    ids = keras.Input(shape=(), dtype="int64", name="watched")
    hidden = keras.layers.Dense(4, activation="tanh", name="hidden")(layer({"watched": ids})["watched"])
    model = keras.Model({"watched": ids}, keras.layers.Dense(1, name="out")(hidden))
    model.compile(keras.optimizers.Adam(0.05), "mse", metrics=["mae"])
    return model


def make_layer(tf, sharded_cls=None, **kwargs):
    emb_api = tf.tpu.experimental.embedding
    # A scalar: initializers run per shard with the shard's shape.
    table = emb_api.TableConfig(ROWS, DIM, name="video", initializer=tf.constant_initializer(INIT))
    return sharded_cls({"watched": emb_api.FeatureConfig(table)}, emb_api.Adagrad(0.2), **kwargs)


def table_values(tf, layer) -> list:
    (var,) = layer.embedding_tables.values()
    return tf.convert_to_tensor(var).numpy().tolist()
