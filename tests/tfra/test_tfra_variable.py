"""`de.Variable` / `de.get_variable`: TFRA's table methods, restrict policies, and every refusal (with the
state unchanged)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops.tfra as de


def _content(var) -> dict:
    return {k: v.numpy() for k, v in var.table.export().items()}


def _assert_unchanged(var, before: dict) -> None:
    after = _content(var)
    for k, v in before.items():
        assert np.array_equal(v, after[k]), k


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.int32])
@pytest.mark.parametrize("graph", [False, True])
def test_upsert_lookup_remove_export_clear(key_dtype, graph):
    var = de.get_variable("v", key_dtype=key_dtype, dim=2, initializer=-1.0)

    def run(f):
        if not graph:
            return f

        @tf.function
        def in_graph():  # upsert and clear return an op in a graph, as TFRA's: run it, return nothing
            f()

        return in_graph

    run(lambda: var.upsert(tf.constant([5, 1, 3], key_dtype), tf.constant([[5.0, 5], [1, 1], [3, 3]])))()
    # Repeated key: the last value wins; existing key 3 replaced, 7 new.
    run(lambda: var.upsert(tf.constant([3, 7, 7], key_dtype), tf.constant([[30.0, 30], [7, 7], [70, 70]])))()
    keys, values = var.export()
    assert keys.dtype == key_dtype
    np.testing.assert_array_equal(keys.numpy(), [1, 3, 5, 7])
    np.testing.assert_array_equal(values.numpy(), [[1, 1], [30, 30], [5, 5], [70, 70]])
    got, exists = var.lookup(tf.constant([7, 2], key_dtype), return_exists=True)
    np.testing.assert_array_equal(got.numpy(), [[70, 70], [-1, -1]])  # no row: the initializer's, not inserted
    np.testing.assert_array_equal(exists.numpy(), [True, False])
    assert int(var.size()) == 4
    assert int(var.remove(tf.constant([1, 2], key_dtype))) == 1
    assert int(var.size()) == 3
    run(var.clear)()
    assert int(var.size()) == 0


def test_upsert_keeps_trained_slots_and_starts_new_ones_fresh():
    layer = de.keras.layers.Embedding(2, initializer=0.0, name="slots")
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.25))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant([4], tf.int64)))
    opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables, strict=True))
    layer.params.upsert(tf.constant([4, 9], tf.int64), tf.constant([[1.0, 1], [2, 2]]))
    c = _content(layer.params)
    np.testing.assert_array_equal(c["keys"], [4, 9])
    # TFRA's Adagrad: accumulators start at 0 (+ Keras' epsilon here); 0 + 1^2 kept; fresh 0.
    np.testing.assert_allclose(c["slots"], [[1.0, 1.0], [0.0, 0.0]], atol=2e-7)
    np.testing.assert_array_equal(c["weights"], [[1, 1], [2, 2]])


def test_string_keys():
    var = de.get_variable("s", key_dtype=tf.string, dim=1, initializer=0.0)
    var.upsert(tf.constant(["a", "b"]), tf.constant([[1.0], [2.0]]))
    np.testing.assert_array_equal(var.lookup(tf.constant(["b", "zz"])).numpy(), [[2.0], [0.0]])
    assert int(var.remove(tf.constant(["a"]))) == 1
    with pytest.raises(ValueError, match="fingerprint"):
        var.export()
    with pytest.raises(ValueError, match="must be strings"):
        var.lookup(tf.constant([1], tf.int64))


@pytest.mark.parametrize(
    ("policy", "kept"), [(de.TimestampRestrictPolicy, [3, 4]), (de.FrequencyRestrictPolicy, [1, 2])]
)
def test_restrict(policy, kept):
    layer = de.keras.layers.Embedding(1, initializer=0.0, restrict_policy=policy, name="r")
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1))
    # Keys 1, 2 are seen three times early; 3, 4 once, last.
    for ids in ([1, 2], [1, 2], [1, 2], [3, 4]):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(tf.constant(ids, tf.int64)))
        opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables, strict=True))
    assert int(layer.params.restrict(2, trigger=10)) == 0  # below the trigger: nothing
    assert int(layer.params.restrict(2)) == 2
    np.testing.assert_array_equal(np.sort(layer.params.export()[0].numpy()), kept)


def test_bad_upsert_changes_nothing():
    var = de.get_variable("bad", dim=2)
    var.upsert(tf.constant([1], tf.int64), tf.constant([[1.0, 2.0]]))
    before = _content(var)
    with pytest.raises(ValueError, match="2 columns"):
        var.upsert(tf.constant([2], tf.int64), tf.constant([[1.0, 2.0, 3.0]]))
    with pytest.raises(ValueError, match="must be integers"):
        var.upsert(tf.constant(["x"]), tf.constant([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="must be floats"):
        var.upsert(tf.constant([2], tf.int64), tf.constant([[1, 2]]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="one row of values per key"):
        var.upsert(tf.constant([2, 3], tf.int64), tf.constant([[1.0, 2.0]]))
    _assert_unchanged(var, before)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"value_dtype": tf.float64}, ValueError, "value_dtype must be tf.float32"),
        ({"key_dtype": tf.float32}, ValueError, "key_dtype"),
        ({"devices": ["/GPU:0"]}, NotImplementedError, "run on the CPU"),
        ({"kv_creator": object()}, NotImplementedError, "tiered table"),
        ({"restrict_policy": object}, ValueError, "restrict_policy"),
        ({"initializer": keras.initializers.GlorotUniform()}, ValueError, "not supported"),
        ({"dim": 0}, ValueError, "dim"),
    ],
)
def test_variable_refusals(kwargs, error, match):
    with pytest.raises(error, match=match):
        de.get_variable("x", **kwargs)


@pytest.mark.parametrize("name", ["RedisTable", "RedisTableCreator", "HkvHashTable", "HvdVariable", "ShadowVariable"])
def test_refused_names_name_the_alternative(name):
    with pytest.raises(NotImplementedError, match=f"de.{name}.*(tiered|CPU|te.distribute|fused|trainable)"):
        getattr(de, name)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: tf.compat.v1.train.AdamOptimizer(0.1), "TensorFlow 1"),
        (lambda: keras.optimizers.Adam(0.1, amsgrad=True), "amsgrad"),
        (lambda: keras.optimizers.SGD(0.1, momentum=0.9), "momentum"),
        (lambda: keras.optimizers.RMSprop(0.1), "no TPU equivalent"),
        (lambda: "adam", "expected a Keras optimizer"),
    ],
)
def test_optimizer_refusals(make, match):
    with pytest.raises(ValueError, match=match):
        de.DynamicEmbeddingOptimizer(make())


def test_training_without_a_wrapped_optimizer_is_refused():
    # The binding follows the latest wrapped optimizer: none alive here.
    import gc

    gc.collect()
    layer = de.keras.layers.Embedding(2, name="nobind")
    if layer.params.optimizer is not None:
        pytest.skip("an optimizer wrapped by another test is still alive")
    with tf.GradientTape() as tape:
        out = layer(tf.constant([1], tf.int64))  # the forward pass reads, as TFRA's
    with pytest.raises(ValueError, match="DynamicEmbeddingOptimizer"):
        tape.gradient(out, layer.trainable_variables)
    assert int(layer.params.size()) == 0


def test_apply_with_another_optimizer_is_refused():
    layer = de.keras.layers.Embedding(2, name="two")
    first = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant([1], tf.int64)))
    grads = tape.gradient(loss, layer.trainable_variables)
    second = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="trained by another optimizer"):
        second.apply_gradients(zip(grads, layer.trainable_variables, strict=True))
    first.apply_gradients(zip(grads, layer.trainable_variables, strict=True))


def test_optimizer_wrapped_after_rows_were_upserted_keeps_them():
    layer = de.keras.layers.Embedding(2, name="late")
    layer.params.upsert(tf.constant([3], tf.int64), tf.constant([[1.0, 2.0]]))
    de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    assert layer.params.table.slot_widths == [2, 2]
    np.testing.assert_array_equal(layer.params.lookup(tf.constant([3], tf.int64)).numpy(), [[1.0, 2.0]])


@pytest.mark.parametrize("graph", [False, True])
def test_a_key_without_a_row_reads_as_the_row_training_gives_it(graph):
    init = keras.initializers.RandomNormal(0.0, 0.5, seed=9)
    layer = de.keras.layers.Embedding(3, initializer=init, name="init_rows")
    de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.0))
    keys = tf.constant([[11, 2**50], [11, -4]], tf.int64)
    read = (tf.function(layer.params.lookup) if graph else layer.params.lookup)(keys)
    assert int(layer.params.size()) == 0  # the read inserted nothing
    trained = layer(keys)  # a training lookup: inserts the keys with their initial rows
    assert int(layer.params.size()) == 3
    np.testing.assert_array_equal(read.numpy(), trained.numpy())
    np.testing.assert_array_equal(read.numpy()[0, 0], read.numpy()[1, 0])  # a function of the key
    assert np.std(read.numpy()) > 0.1


def test_a_name_starting_with_an_underscore():
    var = de.get_variable("_devar", dim=1, initializer=2.0)  # TensorFlow refuses such resource names: renamed
    var.upsert(tf.constant([1], tf.int64), tf.constant([[1.0]]))
    assert var.name == "_devar" and int(var.size()) == 1


def test_empty_batches():
    layer = de.keras.layers.Embedding(2, name="empty")
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.1))
    assert layer.params.lookup(tf.zeros([0], tf.int64)).shape == (0, 2)
    with tf.GradientTape() as tape:
        out = layer(tf.zeros([0, 3], tf.int64))
        loss = tf.reduce_sum(out)
    assert out.shape == (0, 3, 2)
    opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables, strict=True))
    layer.params.upsert(tf.zeros([0], tf.int64), tf.zeros([0, 2]))
    assert int(layer.params.size()) == 0
    sp = tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64), [3, 2])
    np.testing.assert_array_equal(de.embedding_lookup_sparse(layer.params, sp, None).numpy(), np.zeros([3, 2]))
