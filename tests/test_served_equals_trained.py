"""A model exported for serving answers bit for bit what the trained layer answers.

The layer's training-side lookup is the `EmbeddingActivations` op (C++); the served model is the SavedModel that
`te.keras.export_for_serving` writes, a graph of stock TensorFlow ops loaded without the plugin. They must agree
with `assert_array_equal` (not to a tolerance) for every combiner (sum, mean, sqrtn), weighted ids (zeros,
negatives, awkward magnitudes), empty rows, dense / ragged / sparse / sequence inputs, simulated quantization
(`QuantizationConfig`), 16-bit tables (bfloat16, float16 storage), every quantized export, and dynamic tables
(frozen at export; unseen keys read the default row of zeros, as the trained table reads them).

What is exactly comparable for a quantized export ("int8", "int4", "float16", "bfloat16"): the served table holds
encoded rows, so the served model answers what the layer answers from the *dequantized* rows. The reference is
therefore the op (the layer's own lookup) over a table holding `decode_numpy(encode(rows))`, the dequantized rows
computed by the independent numpy decoder (two float32 roundings, code * scale then + bias, as the serving graph
decodes). The rows are assigned into the layer's float32 tables for that call only. A 16-bit table is compared
with an export in its own 16-bit mode (whose dequantized rows are the rows themselves) and unquantized.

The fast tier loads each export in-process (`tf.saved_model.load`, which needs no plugin op); the slow tier serves
all of them from one fresh interpreter in which `tf_embed_ops` cannot be imported, as TensorFlow Serving loads them.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tests.serving_support import serve_many_without_plugin
from tf_embed_ops import keras as te_keras
from tf_embed_ops.serving import quantization

emb = tf.tpu.experimental.embedding
VOCAB, BATCH = 40, 64
FEATURES = ("user", "bag_sum", "bag_mean", "bag_sqrtn", "weighted", "sparse", "seq", "matrix", "simulated")
RAGGED = ("bag_sum", "bag_mean", "bag_sqrtn", "weighted", "seq", "simulated")


def _feature_config(storage: str) -> dict:
    init = tf.random_uniform_initializer(-1.0, 1.0, seed=11)

    def table(name, dim, combiner, quantization_config=None):
        return te.TableConfig(
            VOCAB, dim, init, emb.Adagrad(0.1), combiner, name, quantization_config, storage_dtype=storage
        )

    t_sum, t_mean, t_sqrtn = table("t_sum", 5, "sum"), table("t_mean", 3, "mean"), table("t_sqrtn", 4, "sqrtn")
    t_sim = table("t_sim", 3, "sqrtn", emb.QuantizationConfig(num_buckets=255, lower=-0.75, upper=0.75))
    return {
        "user": emb.FeatureConfig(t_sum),
        "bag_sum": emb.FeatureConfig(t_sum),
        "bag_mean": emb.FeatureConfig(t_mean),
        "bag_sqrtn": emb.FeatureConfig(t_sqrtn),
        "weighted": emb.FeatureConfig(t_sqrtn),
        "sparse": emb.FeatureConfig(t_mean),
        "seq": emb.FeatureConfig(t_mean, max_sequence_length=3),
        "matrix": emb.FeatureConfig(t_sqrtn),
        "simulated": emb.FeatureConfig(t_sim),
    }


class _Served(keras.Model):
    """The layer's activations, flattened per sample and concatenated (exact), as output_0; weights are inputs."""

    def __init__(self, layer):
        super().__init__(name="served")
        self.embedding = layer

    def call(self, inputs, training=False):
        features = {k: inputs[k] for k in FEATURES}
        weights = {k: inputs.get(f"{k}_w") for k in FEATURES}
        acts = self.embedding(features, weights, training=training)
        return tf.concat([tf.reshape(acts[k], [tf.shape(acts[k])[0], -1]) for k in FEATURES], axis=1)


def _ragged_spec(dtype=tf.int64):
    return tf.RaggedTensorSpec([None, None], dtype, ragged_rank=1, row_splits_dtype=tf.int64)


SIGNATURE = {
    "user": tf.TensorSpec([None], tf.int64),
    **{k: _ragged_spec() for k in RAGGED},
    "weighted_w": _ragged_spec(tf.float32),
    "sparse": tf.SparseTensorSpec([None, 4], tf.int64),
    "sparse_w": tf.SparseTensorSpec([None, 4], tf.float32),
    "matrix": tf.TensorSpec([None, 2, 1], tf.int64),
}


def _inputs(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def ragged(lengths, values=None):
        values = rng.integers(VOCAB, size=int(sum(lengths))) if values is None else values
        return tf.RaggedTensor.from_row_lengths(tf.constant(values), tf.constant(lengths, tf.int64))

    x = {"user": tf.constant(rng.integers(VOCAB, size=BATCH), tf.int64)}
    for k in ("bag_sum", "bag_mean", "bag_sqrtn", "simulated"):
        x[k] = ragged(rng.integers(0, 7, size=BATCH))  # empty rows included
    lengths = rng.integers(0, 6, size=BATCH)
    x["weighted"] = ragged(lengths)
    # Zeros (a zero norm: a zero activation), negatives, awkward magnitudes, and sums that are not exact in float32.
    choices = np.array([0.0, -1.5, 0.3, 7.25, 1e-3, 2.0, 0.1, -0.7], np.float32)
    x["weighted_w"] = ragged(lengths, rng.choice(choices, size=int(lengths.sum())).astype(np.float32))
    x["seq"] = ragged(rng.integers(0, 5, size=BATCH))  # longer than max_sequence_length=3: truncated
    rows, cols = rng.integers(BATCH, size=90), rng.integers(4, size=90)
    cells = sorted({(int(r), int(c)) for r, c in zip(rows, cols, strict=True)})
    indices = tf.constant(cells, tf.int64)
    x["sparse"] = tf.SparseTensor(indices, tf.constant(rng.integers(VOCAB, size=len(cells))), [BATCH, 4])
    x["sparse_w"] = tf.SparseTensor(indices, tf.constant(rng.choice(choices, size=len(cells))), [BATCH, 4])
    x["matrix"] = tf.constant(rng.integers(VOCAB, size=(BATCH, 2, 1)), tf.int64)
    return x


def _trained_model(storage: str) -> _Served:
    layer = te_keras.TPUEmbedding(_feature_config(storage), name="embedding")
    model = _Served(layer)
    # One training step, so the tables (and the rounding of 16-bit ones) are the trained ones.
    x = _inputs(1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(model(x, training=True)))
    grads = tape.gradient(loss, model.trainable_variables)
    keras.optimizers.SGD(0.1).apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return model


def _feed(x: dict) -> dict:
    """The signature's component tensors of `x`, by their argument names (export_for_serving's naming)."""
    feed = {}
    for k, v in x.items():
        if isinstance(v, tf.RaggedTensor):
            feed[f"{k}_values"], feed[f"{k}_row_splits"] = v.values, v.row_splits
        elif isinstance(v, tf.SparseTensor):
            feed[f"{k}_indices"], feed[f"{k}_values"], feed[f"{k}_dense_shape"] = v.indices, v.values, v.dense_shape
        else:
            feed[k] = v
    return feed


def _expected(model: _Served, x: dict, mode: str | None) -> np.ndarray:
    """The trained layer's answer (the op) from the rows the export serves: the dequantized rows for `mode`."""
    layer = model.embedding
    saved = {t: v.numpy() for t, v in layer.embedding_tables.items()}
    try:
        for table, variable in layer.embedding_tables.items():
            rows = np.asarray(saved[table], np.float32)
            served = quantization.decode_numpy(quantization.encode(rows, mode, table.name), mode, table.dim)
            variable.assign(tf.cast(served, variable.dtype))
            # Exactly comparable only when the table's storage holds the dequantized rows exactly.
            assert np.array_equal(np.asarray(variable.numpy(), np.float32), served), (table.name, mode)
        return model(x, training=False).numpy()
    finally:
        for table, variable in layer.embedding_tables.items():
            variable.assign(saved[table])


# (table storage, export quantization): every mode over float32 tables; a 16-bit table unquantized and in its own mode.
CASES = [("float32", m) for m in (None, "float16", "bfloat16", "int8", "int4")]
CASES += [("bfloat16", None), ("bfloat16", "bfloat16"), ("float16", None), ("float16", "float16")]


def _export_all(tmp_path) -> tuple[dict, dict]:
    """({case: export dir}, {case: expected output}) for every case of CASES, one trained model per storage."""
    x = _inputs()
    dirs, expected = {}, {}
    for storage in ("float32", "bfloat16", "float16"):
        model = _trained_model(storage)
        for case in [c for c in CASES if c[0] == storage]:
            path = str(tmp_path / f"{storage}_{case[1] or 'none'}")
            te_keras.export_for_serving(model, path, SIGNATURE, quantization=case[1])
            dirs[case], expected[case] = path, _expected(model, x, case[1])
    return dirs, expected


@pytest.mark.parametrize("storage", ["float32", "bfloat16", "float16"])
def test_served_equals_trained_in_process(tmp_path, storage):
    x = _inputs()
    model = _trained_model(storage)
    trained = model(x, training=False).numpy()
    for _, mode in [c for c in CASES if c[0] == storage]:
        path = str(tmp_path / f"{mode or 'none'}")
        te_keras.export_for_serving(model, path, SIGNATURE, quantization=mode)
        served = tf.saved_model.load(path).signatures["serving_default"](**_feed(x))["output_0"].numpy()
        expected = _expected(model, x, mode)
        if mode is None or mode == storage:
            np.testing.assert_array_equal(expected, trained)  # the rows served are the trained rows themselves
        assert served.shape == expected.shape
        differ = int(np.sum(served != expected))
        assert differ == 0, f"{storage} table, quantization={mode}: {differ} of {served.size} outputs differ"


@pytest.mark.slow
def test_served_without_the_plugin_equals_trained(tmp_path):
    dirs, expected = _export_all(tmp_path)
    cases = list(dirs)
    served = serve_many_without_plugin([dirs[c] for c in cases], _feed(_inputs()), cwd=str(tmp_path))
    for case, out in zip(cases, served, strict=True):
        differ = int(np.sum(out != expected[case]))
        assert differ == 0, f"{case}: {differ} of {out.size} outputs differ"


def test_served_dynamic_tables_equal_trained(tmp_path):
    """Dynamic tables (frozen at export into a hash table and rows with a default row of zeros): every combiner,
    weights, ids never seen (the default row, as the trained table reads them), bitwise."""
    tables = {
        c: te.DynamicTableConfig(f"d_{c}", 4, optimizer=te.optimizers.Adagrad(learning_rate=0.1), combiner=c, seed=7)
        for c in ("sum", "mean", "sqrtn")
    }
    features = {c: emb.FeatureConfig(t) for c, t in tables.items()}
    layer = te_keras.TPUEmbedding(features, name="embedding")
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 6, size=BATCH)
    n = int(lengths.sum())

    def ragged(values):
        return tf.RaggedTensor.from_row_lengths(tf.constant(values), tf.constant(lengths, tf.int64))

    seen = rng.integers(0, 2**40, size=60)
    x = {c: ragged(rng.choice(seen, size=n)) for c in tables}
    w = {c: ragged(rng.choice([0.0, -1.5, 0.3, 7.25, 1e-3, 0.1], size=n).astype(np.float32)) for c in tables}
    layer(x, w, training=True)  # rows for the seen keys
    x = {
        c: ragged(np.where(rng.random(n) < 0.2, rng.integers(2**41, 2**42, size=n), rng.choice(seen, size=n)))
        for c in tables
    }  # some keys never seen
    trained = tf.concat([layer(x, w, training=False)[c] for c in tables], axis=1).numpy()

    class Served(keras.Model):
        def __init__(self):
            super().__init__(name="served")
            self.embedding = layer

        def call(self, inputs, training=False):
            acts = self.embedding(inputs["x"], inputs["w"], training=training)
            return tf.concat([acts[c] for c in tables], axis=1)

    spec = {"x": {c: _ragged_spec() for c in tables}, "w": {c: _ragged_spec(tf.float32) for c in tables}}
    path = str(tmp_path / "dynamic")
    te_keras.export_for_serving(Served(), path, spec)
    feed = {}
    for c in tables:
        feed |= {f"x_{c}_values": x[c].values, f"x_{c}_row_splits": x[c].row_splits}
        feed |= {f"w_{c}_values": w[c].values, f"w_{c}_row_splits": w[c].row_splits}
    served = tf.saved_model.load(path).signatures["serving_default"](**feed)["output_0"].numpy()
    assert int(np.sum(served != trained)) == 0, f"{int(np.sum(served != trained))} of {served.size} outputs differ"
