"""A TFRA Keras program with only its import changed: the model of TFRA's movielens-1m-keras demo
(demo/dynamic_embedding/movielens-1m-keras in TFRA's repository: two `SquashedEmbedding`s of user and movie ids, a
dense tower and a bias net, a `@tf.function` call, Adam wrapped in `DynamicEmbeddingOptimizer`, `model.fit`), on
synthetic ratings (the demo reads tensorflow_datasets' movielens, which needs a download), written here in the
demo's shape. Besides the import, one line changes, for Keras 3 rather than for tf_embed_ops: `call` loses its
`@tf.function`. Then the demo's export path: weights saved, a model built with `is_training=False` (inference mode)
loads them and predicts the same.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tf_embed_ops.tfra as de  # the one line a TFRA user changes


class DualChannelsDeepModel(tf.keras.Model):
    def __init__(self, user_embedding_size=1, movie_embedding_size=1, embedding_initializer=None, is_training=True):
        if not is_training:
            de.enable_inference_mode()
        super().__init__()
        if embedding_initializer is None:
            embedding_initializer = tf.keras.initializers.Zeros()
        self.user_embedding = de.keras.layers.SquashedEmbedding(
            user_embedding_size, initializer=embedding_initializer, name="user_embedding"
        )
        self.movie_embedding = de.keras.layers.SquashedEmbedding(
            movie_embedding_size, initializer=embedding_initializer, name="movie_embedding"
        )
        normal = tf.keras.initializers.RandomNormal(0.0, 0.1)
        self.dnn1 = tf.keras.layers.Dense(64, "relu", kernel_initializer=normal, bias_initializer=normal)
        self.dnn2 = tf.keras.layers.Dense(16, "relu", kernel_initializer=normal, bias_initializer=normal)
        self.dnn3 = tf.keras.layers.Dense(5, "softmax", kernel_initializer=normal, bias_initializer=normal)
        self.bias_net = tf.keras.layers.Dense(5, "softmax", kernel_initializer=normal, bias_initializer=normal)

    # The demo decorates `call` with @tf.function; Keras 3's fit then finds no gradients (for any Keras 3 model,
    # with or without dynamic embeddings): the one Keras 3 change the program needs (docs/migrating.md).
    def call(self, features):
        user_id = tf.reshape(features["user_id"], (-1, 1))
        movie_id = tf.reshape(features["movie_id"], (-1, 1))
        latent = tf.concat([self.user_embedding(user_id), self.movie_embedding(movie_id)], axis=1)
        x = self.dnn3(self.dnn2(self.dnn1(latent)))
        return 0.2 * x + 0.8 * self.bias_net(latent)


def _dataset(n=512, batch=32):
    rng = np.random.default_rng(0)
    users = rng.integers(1, 200, n).astype(np.int64)
    movies = rng.integers(1, 300, n).astype(np.int64)
    ratings = tf.one_hot((users + movies) % 5, 5)
    return tf.data.Dataset.from_tensor_slices(({"user_id": users, "movie_id": movies}, ratings)).batch(batch)


def test_movielens_keras_demo_trains_and_exports(tmp_path):
    model = DualChannelsDeepModel(8, 8, tf.keras.initializers.RandomNormal(0.0, 0.5))
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-2))
    auc = tf.keras.metrics.AUC(num_thresholds=1000)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.MeanSquaredError(), metrics=[auc])
    history = model.fit(_dataset(), epochs=3, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0]  # it learns
    n_users = int(model.user_embedding.params.size())
    assert 0 < n_users < 200
    path = str(tmp_path / "demo.weights.h5")
    model.save_weights(path)
    probe = {"user_id": tf.constant([3, 5, 1000], tf.int64), "movie_id": tf.constant([7, 7, 1001], tf.int64)}
    expected = model(probe).numpy()

    try:
        served = DualChannelsDeepModel(8, 8, tf.keras.initializers.Zeros(), is_training=False)
        served(probe)  # builds the dense layers (inference mode: nothing inserted)
        de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-2))  # the tables' slots, as the saved ones
        served.load_weights(path)
        assert int(served.user_embedding.params.size()) == n_users
        got = served(probe).numpy()
    finally:
        de.enable_train_mode()
    # Ids 1000 / 1001 were never trained: the saved model reads RandomNormal initial rows, the served one zeros.
    np.testing.assert_allclose(got[:2], expected[:2], rtol=1e-6, atol=1e-7)
