"""Lookups compile under XLA (`jit_compile=True`) and equal the op bit for bit; training under XLA is refused.

The reference is the `EmbeddingActivations` op itself (the same layer called without XLA), whose values the
other tests check against numpy; here every combiner, dense / ragged / sparse / weighted / sequence inputs,
16-bit tables and simulated quantization are compared with `assert_array_equal`.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops import keras as te_keras

emb = tf.tpu.experimental.embedding
VOCAB, DIM = 50, 5


def _feature_config(combiner: str, storage: str = "float32", quantization=None):
    init = tf.random_uniform_initializer(-1.0, 1.0, seed=3)
    a = te.TableConfig(VOCAB, DIM, init, emb.Adagrad(0.1), combiner, "a", quantization, storage_dtype=storage)
    b = te.TableConfig(VOCAB, 3, init, emb.SGD(0.1), combiner, "b", storage_dtype=storage)
    return {
        "dense": emb.FeatureConfig(a),
        "bag": emb.FeatureConfig(a),
        "weighted": emb.FeatureConfig(b),
        "sparse": emb.FeatureConfig(b),
        "seq": emb.FeatureConfig(a, max_sequence_length=3),
        "matrix": emb.FeatureConfig(b),
    }


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    n = 7
    lengths = [0, 1, 3, 2, 5, 1, 4]
    bag = tf.RaggedTensor.from_row_lengths(rng.integers(VOCAB, size=sum(lengths)), lengths)
    wlen = [2, 0, 1, 3, 1, 2, 6]
    wids = tf.RaggedTensor.from_row_lengths(rng.integers(VOCAB, size=sum(wlen)), wlen)
    # Weights with zeros (a zero norm: zero activation), negatives and awkward magnitudes.
    wvals = rng.choice([0.0, -1.5, 0.3, 7.25, 1e-3, 2.0], size=sum(wlen)).astype(np.float32)
    weights = tf.RaggedTensor.from_row_lengths(wvals, wlen)
    sparse = tf.sparse.reorder(
        tf.SparseTensor([[0, 1], [0, 0], [2, 3], [5, 0], [5, 2], [6, 1]], rng.integers(VOCAB, size=6), [n, 4])
    )
    seq = tf.RaggedTensor.from_row_lengths(rng.integers(VOCAB, size=10), [3, 0, 1, 2, 3, 1, 0])
    features = {
        "dense": tf.constant(rng.integers(VOCAB, size=n)),
        "bag": bag,
        "weighted": wids,
        "sparse": sparse,
        "seq": seq,
        "matrix": tf.constant(rng.integers(VOCAB, size=(n, 2, 1))),
    }
    w = {k: None for k in features}
    w["weighted"] = weights
    return features, w


# One case in the fast tier (an XLA compile takes seconds; the mid-level test below runs sqrtn over bfloat16 tables);
# every pair when slow.
_FAST = {("sum", "float32")}


@pytest.mark.parametrize(
    "combiner,storage",
    [
        pytest.param(c, s, marks=[] if (c, s) in _FAST else [pytest.mark.slow])
        for c in ("sum", "mean", "sqrtn")
        for s in ("float32", "bfloat16", "float16")
    ],
)
def test_keras_layer_lookup_under_xla_equals_the_op(combiner, storage):
    layer = te_keras.TPUEmbedding(_feature_config(combiner, storage), name="embedding")
    features, weights = _inputs()
    expected = layer(features, weights)  # the op
    compiled = tf.function(lambda f, w: layer(f, w), jit_compile=True)
    got = compiled(features, weights)
    for k in expected:
        np.testing.assert_array_equal(got[k].numpy(), expected[k].numpy(), err_msg=k)
    assert "TfEmbed" not in str(
        [n.op for n in compiled.get_concrete_function(features, weights).graph.as_graph_def().node]
    )


@pytest.mark.slow  # an XLA compile (seconds)
def test_quantized_table_lookup_under_xla_equals_the_op():
    layer = te_keras.TPUEmbedding(_feature_config("mean", quantization=emb.QuantizationConfig(7, -0.6, 0.45)))
    features, weights = _inputs(1)
    expected = layer(features, weights)
    got = tf.function(lambda f, w: layer(f, w), jit_compile=True)(features, weights)
    for k in expected:
        np.testing.assert_array_equal(got[k].numpy(), expected[k].numpy(), err_msg=k)


def _model(layer):
    inputs = {"user": keras.Input(shape=(), dtype="int64", name="user")}
    out = keras.layers.Dense(1, name="head")(layer(inputs)["user"])
    return keras.Model(inputs, out)


def _user_layer(name="embedding"):
    table = emb.TableConfig(VOCAB, DIM, tf.random_uniform_initializer(-1.0, 1.0, seed=1), emb.Adagrad(0.1), name="u")
    return te_keras.TPUEmbedding({"user": emb.FeatureConfig(table)}, name=name)


def test_a_model_compiles_for_inference_and_a_compiled_train_step_is_refused_naming_the_layer():
    layer = _user_layer("user_embedding")
    model = _model(layer)
    x = {"user": tf.constant([1, 4, 4, 9], tf.int64)}
    # (The Dense head itself rounds differently under XLA: the lookups' bitwise equality is tested above.)
    np.testing.assert_allclose(
        tf.function(lambda v: model(v, training=False), jit_compile=True)(x).numpy(), model(x).numpy(), rtol=1e-6
    )
    table = next(iter(layer.embedding_tables.values()))
    before = table.numpy()

    @tf.function(jit_compile=True)
    def train_step(v):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(v, training=True))
        return tape.gradient(loss, model.trainable_variables)

    with pytest.raises(ValueError, match=r"Layer 'user_embedding' \(TPUEmbedding\): training cannot be compiled"):
        train_step(x)
    np.testing.assert_array_equal(table.numpy(), before)
    # model.compile(jit_compile=True): Keras sees the layer's supports_jit=False, warns and trains without XLA.
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    model.fit(x, tf.ones((4, 1)), epochs=1, verbose=0)
    assert not np.array_equal(table.numpy(), before)


def test_training_call_under_xla_is_refused():
    layer = _user_layer()
    x = {"user": tf.constant([1, 2], tf.int64)}
    with pytest.raises(ValueError, match="training cannot be compiled with XLA"):
        tf.function(lambda f: layer(f, training=True), jit_compile=True)(x)


def test_dynamic_tables_under_xla_are_refused_naming_them():
    table = te.DynamicTableConfig("users", DIM, optimizer=emb.SGD(0.1))
    layer = te_keras.TPUEmbedding({"user": emb.FeatureConfig(table)}, name="dyn")
    with pytest.raises(ValueError, match=r"Layer 'dyn'.*dynamic tables \['users'\].*XLA"):
        tf.function(lambda f: layer(f), jit_compile=True)({"user": tf.constant([1, 2], tf.int64)})


def test_distributed_embedding_lookup_under_xla_equals_the_op_and_training_is_refused():
    from tests import keras_rs_test_util as util  # pylint: disable=import-outside-toplevel

    layer = te_keras.DistributedEmbedding(
        util.configs(te_keras.TableConfig, te_keras.FeatureConfig), name="dist_embedding"
    )
    x, w, _ = util.inputs(seed=2)
    expected = layer(x, w)
    got = tf.function(lambda a, b: layer(a, b), jit_compile=True)(x, w)
    for k in expected:
        np.testing.assert_array_equal(got[k].numpy(), expected[k].numpy(), err_msg=k)
    before = {k: v.numpy() for k, v in layer.get_embedding_tables().items()}
    with pytest.raises(ValueError, match=r"Layer 'dist_embedding' \(DistributedEmbedding\): training cannot"):
        tf.function(lambda a, b: layer(a, b, training=True), jit_compile=True)(x, w)
    for k, v in layer.get_embedding_tables().items():
        np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)


def test_mid_level_lookup_under_xla_equals_the_op_and_apply_gradients_is_refused():
    keep = ("weighted", "seq")  # two features keep the XLA compile short; the layer tests cover every kind
    fc = {k: v for k, v in _feature_config("sqrtn", "bfloat16", None).items() if k in keep}
    mid = te.TPUEmbedding(fc, emb.SGD(0.1))
    mid.build()
    features, weights = ({k: v for k, v in nest.items() if k in keep} for nest in _inputs(3))
    expected = mid(features, weights)
    got = tf.function(lambda f, w: mid(f, w), jit_compile=True)(features, weights)
    for k in expected:
        np.testing.assert_array_equal(got[k].numpy(), expected[k].numpy(), err_msg=k)
    tables = [v.numpy() for v in mid.embedding_tables.values()]

    @tf.function(jit_compile=True)
    def step(f, w):
        mid.enqueue(f, w, training=True)
        acts = mid.dequeue()
        mid.apply_gradients(tf.nest.map_structure(tf.ones_like, acts))

    with pytest.raises(ValueError, match=r"TPUEmbedding\.apply_gradients: training cannot be compiled with XLA"):
        step(features, weights)
    for before, after in zip(tables, mid.embedding_tables.values(), strict=True):
        np.testing.assert_array_equal(after.numpy(), before)
