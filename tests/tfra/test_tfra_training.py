"""`de.keras.layers.Embedding` + `de.DynamicEmbeddingOptimizer` train as TFRA does (numpy reference), in custom
loops (eager and `tf.function`) and in `model.fit`, for SGD, Adagrad and Adam, int64 and string keys.

The reference (`tfra_reference.py`) is TFRA's semantics written from Keras' formulas: the batch's rows (duplicate
ids summed) get the Keras optimizer's update, Adam with its bias correction at the optimizer's step; other rows and
their slots stay. Initial rows are set with `upsert`, so both sides start from the same values.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops.tfra as de
from tests.tfra import tfra_reference as ref

DIM = 3
KINDS = ("sgd", "adagrad", "adam")


def _keys(string: bool, n: int):
    return np.array([f"k{i}".encode() for i in range(n)]) if string else np.arange(n, dtype=np.int64) * 7 + 2**40


def _slots_of(layer, kind: str) -> list[np.ndarray]:
    c = layer.params.table.export()
    slots = c["slots"].numpy()
    return [slots[:, i * DIM : (i + 1) * DIM] for i in range(ref.slot_count(kind))], c["keys"].numpy()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("string", [False, True])
@pytest.mark.parametrize("graph", [False, True])
def test_custom_loop_matches_reference(kind, string, graph):
    rng = np.random.default_rng(1)
    n = 6
    keys = _keys(string, n)
    init = rng.uniform(-0.5, 0.5, [n, DIM]).astype(np.float32)
    layer = de.keras.layers.Embedding(DIM, key_dtype=tf.string if string else tf.int64, name=f"t_{kind}")
    opt = de.DynamicEmbeddingOptimizer(ref.keras_optimizer(kind, keras))
    layer.params.upsert(keys, init)
    upstream = [rng.standard_normal([4, 2, DIM]).astype(np.float32) for _ in range(3)]
    batches = [rng.integers(0, n - 1, [4, 2]) for _ in range(3)]  # key n-1 is never in a batch

    def step(ids, up):
        with tf.GradientTape() as tape:
            out = layer(ids)
            loss = tf.reduce_sum(out * up)
        variables = layer.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return out

    step_fn = tf.function(step) if graph else step
    w = init.astype(np.float64)
    slots = ref.initial_slots(kind, n, DIM)
    for t, (batch, up) in enumerate(zip(batches, upstream, strict=True)):
        out = step_fn(tf.constant(keys[batch]), tf.constant(up))
        np.testing.assert_allclose(out.numpy(), w[batch], rtol=1e-5, atol=1e-6)  # lookup before the step
        rows = np.unique(batch)
        g = np.zeros([n, DIM])
        np.add.at(g, batch.reshape(-1), up.reshape(-1, DIM))
        touched_slots = [s[rows] for s in slots]
        touched_w = w[rows]
        ref.apply(kind, touched_w, touched_slots, g[rows], t)
        w[rows] = touched_w
        for s, ts in zip(slots, touched_slots, strict=True):
            s[rows] = ts
    got_slots, got_keys = _slots_of(layer, kind)
    # The table is sorted by key (a string's key: its fingerprint).
    order = np.argsort(tf.bitcast(tf.fingerprint(keys, "farmhash64"), tf.int64).numpy() if string else keys)
    np.testing.assert_allclose(layer.params.table.export()["weights"].numpy(), w[order], rtol=1e-5, atol=1e-6)
    for got, want in zip(got_slots, slots, strict=True):
        np.testing.assert_allclose(got, want[order], rtol=1e-5, atol=2e-7)  # Adagrad's: + epsilon
    assert int(opt.iterations.numpy()) == 3
    # The row never looked up kept its value exactly.
    assert np.array_equal(layer.params.lookup(keys[n - 1 :]).numpy(), init[n - 1 :])


@pytest.mark.parametrize("kind", KINDS)
def test_fit_trains_table_and_dense(kind):
    inputs = keras.Input(shape=(2,), dtype="int64")
    emb = de.keras.layers.Embedding(4, initializer=keras.initializers.RandomNormal(0.0, 0.1, seed=2), name="fit")
    model = keras.Sequential([inputs, emb, keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(ref.keras_optimizer(kind, keras)), loss="mse")
    x = np.arange(40, dtype=np.int64).reshape(20, 2)
    y = np.ones([20, 1], np.float32)
    model.fit(x, y, batch_size=5, epochs=1, verbose=0)
    assert int(emb.params.size()) == 40
    before = emb.params.export()[1].numpy()
    model.fit(x, y, batch_size=5, epochs=1, verbose=0)
    after = emb.params.export()[1].numpy()
    assert not np.array_equal(before, after)  # the fused update ran inside fit
    loss = model.evaluate(x, y, verbose=0)
    assert int(emb.params.size()) == 40 and np.isfinite(loss)
    # predict / evaluate are training=False: they insert nothing.
    model.predict(np.array([[10**9, 10**9 + 1]], np.int64), verbose=0)
    assert int(emb.params.size()) == 40


def test_squashed_and_fieldwise_shapes_and_gradients():
    sq = de.keras.layers.SquashedEmbedding(2, initializer=1.0, combiner="mean", name="sq")
    fw = de.keras.layers.FieldWiseEmbedding(
        2, 3, slot_map_fn=lambda ids: tf.math.mod(ids, 3), initializer=1.0, name="fw"
    )
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(1.0))
    ids = tf.constant([[1, 4, 2], [5, 6, 9]], tf.int64)
    with tf.GradientTape() as tape:
        a = sq(ids)
        b = fw(ids)
        loss = tf.reduce_sum(a) + tf.reduce_sum(b)
    assert a.shape == (2, 2) and b.shape == (2, 3, 2)
    np.testing.assert_array_equal(b.numpy()[0], [[0, 0], [2, 2], [1, 1]])  # fields of 1, 4, 2: 1, 1, 2
    variables = sq.trainable_variables + fw.trainable_variables
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
    # mean over 3 ids: each row's gradient is 1/3; SGD(1.0).
    np.testing.assert_allclose(sq.params.lookup(tf.constant([1], tf.int64)).numpy(), [[1 - 1 / 3] * 2], rtol=1e-6)
    np.testing.assert_allclose(fw.params.lookup(tf.constant([9], tf.int64)).numpy(), [[0.0, 0.0]], atol=1e-7)


def test_inference_mode_never_inserts():
    layer = de.keras.layers.Embedding(2, initializer=1.0, name="inf")
    de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1))
    de.enable_inference_mode()
    try:
        assert de.get_model_mode() == de.ModelMode.INFERENCE
        out = layer(tf.constant([1, 2], tf.int64))
        np.testing.assert_array_equal(out.numpy(), np.ones([2, 2]))  # the initial rows, not inserted
        assert int(layer.params.size()) == 0
    finally:
        de.enable_train_mode()
    layer(tf.constant([1, 2], tf.int64))
    assert int(layer.params.size()) == 2


def test_embedding_lookup_return_trainable_and_sparse():
    var = de.get_variable("lk", dim=2, initializer=0.0)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.5))
    var.upsert(tf.constant([1, 2, 3], tf.int64), tf.constant([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]))
    sp = tf.SparseTensor([[0, 0], [0, 1], [2, 0]], tf.constant([1, 2, 3], tf.int64), [3, 2])
    with tf.GradientTape() as tape:
        dense, trainable = de.embedding_lookup(var, tf.constant([1, 1], tf.int64), return_trainable=True)
        summed = de.embedding_lookup_sparse(var, sp, None, combiner="sum")
        mean = de.embedding_lookup_sparse(var, sp, None, combiner="mean")
        loss = tf.reduce_sum(dense) + tf.reduce_sum(summed)
    np.testing.assert_array_equal(summed.numpy(), [[3, 3], [0, 0], [3, 3]])
    np.testing.assert_array_equal(mean.numpy(), [[1.5, 1.5], [0, 0], [3, 3]])
    opt.apply_gradients(zip(tape.gradient(loss, [trainable]), [trainable], strict=True))
    # key 1: 2 (dense) + 1 (sparse) -> 1 - 0.5 * 3; key 2: 2 - 0.5; key 3: 3 - 0.5
    np.testing.assert_allclose(
        var.lookup(tf.constant([1, 2, 3], tf.int64)).numpy(), [[-0.5, -0.5], [1.5, 1.5], [2.5, 2.5]]
    )
    safe = de.safe_embedding_lookup_sparse(var, sp, None, combiner="sum", default_id=3)
    np.testing.assert_allclose(safe.numpy()[1], [2.5, 2.5])


def test_keras_file_round_trip(tmp_path):
    inputs = keras.Input((2,), dtype="int64")
    emb = de.keras.layers.Embedding(3, initializer=keras.initializers.RandomNormal(0, 0.1, seed=1), name="e")
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(emb(inputs))))
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01)), "mse")
    x, y = np.arange(20).reshape(10, 2), np.ones([10, 1])
    model.fit(x, y, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    # The table's slots follow the optimizer: wrap it first, load without Keras' own compile, then compile.
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01))
    loaded = keras.models.load_model(path, compile=False)
    loaded.compile(optimizer, "mse")
    table, original = loaded.layers[1].params.table.export(), emb.params.table.export()
    for name in ("keys", "weights", "slots"):
        assert np.array_equal(table[name].numpy(), original[name].numpy()), name
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    loaded.fit(x, y, verbose=0)


@pytest.mark.parametrize("combiner", ["max", "min", "mean", "sum"])
def test_fieldwise_empty_field_is_zero(combiner):
    fw = de.keras.layers.FieldWiseEmbedding(
        1, 3, slot_map_fn=lambda ids: tf.math.mod(ids, 3), initializer=2.0, combiner=combiner, name=f"fw_{combiner}"
    )
    out = fw(tf.constant([[3, 6]], tf.int64), training=False).numpy()  # both ids in field 0; fields 1, 2 empty
    np.testing.assert_array_equal(out[0, 1:], np.zeros([2, 1]))
    assert out[0, 0, 0] == (4.0 if combiner == "sum" else 2.0)
