"""Shared Keras fixtures of the layer and serving tests: a small model over the Keras TPUEmbedding layer and
data with a learnable target (rows >= vocab_max are never touched)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tf_embed_ops import keras as te_keras

emb_api = tf.tpu.experimental.embedding
VOCAB = 20


def _feature_config():
    user = emb_api.TableConfig(VOCAB, 4, name="user", combiner="sum", optimizer=emb_api.Adagrad(0.5))
    item = emb_api.TableConfig(VOCAB, 4, name="item", combiner="mean", optimizer=emb_api.FTRL(0.3))
    return {
        "user": emb_api.FeatureConfig(table=user),
        "items": emb_api.FeatureConfig(table=item),
        "history": emb_api.FeatureConfig(table=item, max_sequence_length=3),
    }


def _model(feature_config=None):
    layer = te_keras.TPUEmbedding(feature_config or _feature_config(), emb_api.SGD(0.1), name="embedding")
    inputs = {
        "user": keras.Input(shape=(), dtype="int64", name="user"),
        "items": keras.Input(shape=(None,), dtype="int64", ragged=True, name="items"),
        "history": keras.Input(shape=(None,), dtype="int64", ragged=True, name="history"),
    }
    acts = layer(inputs)
    x = keras.layers.Concatenate()([acts["user"], acts["items"], keras.layers.Flatten()(acts["history"])])
    out = keras.layers.Dense(1, name="head")(x)
    return keras.Model(inputs, out), layer


def _data(n=32, seed=0, vocab_max=VOCAB - 2):
    """Ids in [0, vocab_max): rows >= vocab_max are never touched."""
    rng = np.random.default_rng(seed)
    user = rng.integers(vocab_max, size=n)
    items = [list(rng.integers(vocab_max, size=int(rng.integers(1, 4)))) for _ in range(n)]
    history = [list(rng.integers(vocab_max, size=int(rng.integers(0, 5)))) for _ in range(n)]
    x = {
        "user": tf.constant(user, tf.int64),
        "items": tf.ragged.constant(items, dtype=tf.int64),
        "history": tf.ragged.constant(history, dtype=tf.int64),
    }
    # A learnable target: a per-user value plus the mean of per-item values.
    user_value, item_value = rng.normal(size=VOCAB), rng.normal(size=VOCAB)
    y = user_value[user] + np.array([item_value[r].mean() for r in items])
    y = tf.constant(y.reshape(n, 1), tf.float32)
    return x, y, (user, items, history)


def _dataset(x, y, batch):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
