"""What an export changes about the tables belongs to that export alone (`ExportContext`), never to the process.

Two exports of one model with different quantization run on two threads whose traces are interleaved (each trace
waits for the others at a barrier inside the model's call, so all of them are in progress at once), next to a
third thread that traces the model for inference without exporting. Each export must serve what the same export
made alone serves (bitwise, static and dynamic tables), record its own modes, and the third trace must keep the
custom op (it is not an export, so it is not served).
"""

from __future__ import annotations

import json
import os
import threading

import keras
import numpy as np
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops import keras as te_keras
from tf_embed_ops.keras import export_context

emb = tf.tpu.experimental.embedding
SIGNATURE = {
    "f": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64),
    "d": tf.TensorSpec([None], tf.int64),
}


class _Paused(keras.Model):
    """The layer's activations; the first traced (not eager) call of each thread first waits at `barrier`, if set
    (an export may trace its function twice: a trace that creates variables is traced again)."""

    def __init__(self, layer):
        super().__init__(name="paused")
        self.embedding = layer
        self.barrier = None
        self.waited = threading.local()

    def call(self, inputs, training=False):
        if self.barrier is not None and not tf.executing_eagerly() and not getattr(self.waited, "done", False):
            self.waited.done = True
            self.barrier.wait(timeout=300)
        acts = self.embedding(inputs, training=training)
        return tf.concat([acts["f"], acts["d"]], axis=1)


def _model() -> _Paused:
    init = tf.random_uniform_initializer(-1.0, 1.0, seed=5)
    static = emb.TableConfig(30, 4, init, emb.Adagrad(0.1), combiner="sqrtn", name="static")
    dynamic = te.DynamicTableConfig("dyn", 4, optimizer=te.optimizers.SGD(learning_rate=0.1), combiner="sum", seed=2)
    layer = te_keras.TPUEmbedding({"f": emb.FeatureConfig(static), "d": emb.FeatureConfig(dynamic)}, name="emb")
    model = _Paused(layer)
    model(_inputs(), training=True)  # rows for the dynamic table's keys
    return model


def _inputs() -> dict:
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 5, size=32)
    ids = tf.RaggedTensor.from_row_lengths(rng.integers(30, size=int(lengths.sum())), lengths)
    return {"f": ids, "d": tf.constant(rng.integers(0, 50, size=32), tf.int64)}


def _serve(path: str) -> np.ndarray:
    x = _inputs()
    fn = tf.saved_model.load(path).signatures["serving_default"]
    return fn(f_values=x["f"].values, f_row_splits=x["f"].row_splits, d=x["d"])["output_0"].numpy()


def _modes(path: str) -> dict:
    with open(os.path.join(path, "assets.extra", "tf_embed_ops_export.json")) as f:
        tables = json.load(f)["tables"]
    return {name: meta["quantization"] for name, meta in tables.items()}


def _custom_ops(concrete) -> set:
    graph = concrete.graph.as_graph_def()
    ops = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
    return {op for op in ops if op.startswith("TfEmbed")}


def test_two_exports_on_two_threads_with_different_quantization_keep_their_own_context(tmp_path):
    model = _model()
    modes = {"a": "int8", "b": "float16"}
    alone = {}
    for key, mode in modes.items():  # each export made alone: the reference
        path = str(tmp_path / f"alone_{key}")
        te_keras.export_for_serving(model, path, SIGNATURE, quantization=mode)
        alone[key] = _serve(path)
    assert not np.array_equal(alone["a"], alone["b"])  # the modes serve different values

    model.barrier = threading.Barrier(3)
    errors, traced = [], {}

    def export(key):
        try:
            te_keras.export_for_serving(model, str(tmp_path / key), SIGNATURE, quantization=modes[key])
        except BaseException as e:
            errors.append(e)
            model.barrier.abort()

    def infer():
        try:
            fn = tf.function(lambda f, d: model({"f": f, "d": d}, training=False), autograph=False)
            traced["plain"] = fn.get_concrete_function(SIGNATURE["f"], SIGNATURE["d"])
        except BaseException as e:
            errors.append(e)
            model.barrier.abort()

    threads = [threading.Thread(target=export, args=(k,)) for k in modes] + [threading.Thread(target=infer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    model.barrier = None
    assert not errors, errors
    for key, mode in modes.items():
        path = str(tmp_path / key)
        assert _modes(path) == {"static": mode, "dyn": mode}
        np.testing.assert_array_equal(_serve(path), alone[key])
    # The inference trace ran while both exports traced: it is no export, so the layer kept its custom ops.
    assert "TfEmbed>EmbeddingActivations" in _custom_ops(traced["plain"])


def test_serving_mode_serves_the_calling_thread_only():
    model = _model()
    x = _inputs()
    seen = {}

    def trace_elsewhere():
        fn = tf.function(lambda f, d: model({"f": f, "d": d}, training=False), autograph=False)
        seen["other thread"] = _custom_ops(fn.get_concrete_function(SIGNATURE["f"], SIGNATURE["d"]))

    with te_keras.serving_mode() as context:
        assert export_context.current() is context
        fn = tf.function(lambda f, d: model({"f": f, "d": d}, training=False), autograph=False)
        seen["this thread"] = _custom_ops(fn.get_concrete_function(SIGNATURE["f"], SIGNATURE["d"]))
        served = model(x, training=False).numpy()
        thread = threading.Thread(target=trace_elsewhere)
        thread.start()
        thread.join(timeout=300)
    assert export_context.current() is None
    assert seen["this thread"] == set()
    assert "TfEmbed>EmbeddingActivations" in seen["other thread"]
    np.testing.assert_array_equal(served, model(x, training=False).numpy())  # the plain lookup is the op's
