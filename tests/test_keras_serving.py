"""Serving export: a SavedModel with no tf_embed_ops op, loaded by a process that never imports the plugin."""

from __future__ import annotations

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.keras_test_util import _data, _dataset, _model
from tf_embed_ops import keras as te_keras


@pytest.mark.slow
def test_export_runs_without_the_plugin_and_matches_the_trained_model(tmp_path):
    model, _ = _model()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    x, y, _ = _data(32)
    model.fit(_dataset(x, y, 16), epochs=2, verbose=0)
    expected = model.predict(x, verbose=0)

    signature = {
        "user": tf.TensorSpec([None], tf.int64),
        "items": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64),
        "history": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64),
    }
    export_dir = str(tmp_path / "served")
    inputs = te_keras.export_for_serving(model, export_dir, signature)
    assert set(inputs) == {"user", "items_values", "items_row_splits", "history_values", "history_row_splits"}

    feed = {
        "user": x["user"].numpy().tolist(),
        "items_values": x["items"].values.numpy().tolist(),
        "items_row_splits": x["items"].row_splits.numpy().tolist(),
        "history_values": x["history"].values.numpy().tolist(),
        "history_row_splits": x["history"].row_splits.numpy().tolist(),
    }
    code = f"""
import json, sys
import tensorflow as tf
fn = tf.saved_model.load({export_dir!r}).signatures["serving_default"]
feed = json.loads(sys.stdin.read())
out = fn(**{{k: tf.constant(v, tf.int64) for k, v in feed.items()}})
assert not any(m.startswith("tf_embed_ops") for m in sys.modules), "the plugin was imported"
print(json.dumps({{k: v.numpy().tolist() for k, v in out.items()}}))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(feed), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(np.array(served["output_0"]), expected, rtol=1e-5, atol=1e-6)


def test_plain_lookup_equals_the_custom_op_for_every_input_kind_and_combiner():
    """The serving composite must compute bitwise what the kernel computes (including sequences and quantization)."""
    from tf_embed_ops import embedding_ops

    rng = np.random.default_rng(0)
    table = tf.Variable(rng.normal(size=(9, 3)).astype(np.float32))
    emb_api = tf.tpu.experimental.embedding
    ragged = tf.ragged.constant([[1, 1, 4], [], [8, 0, 2, 5]], dtype=tf.int64)
    weights = tf.ragged.constant([[0.5, 1.0, 2.0], [], [1.0, 0.0, 3.0, 1.5]], dtype=tf.float32)
    cases = [
        (tf.constant([[3], [0]], tf.int64), None, 0, True),
        (ragged, weights, 0, False),
        (ragged.to_sparse(), weights.to_sparse(), 0, False),
        (ragged, None, 2, False),
        (ragged.to_sparse(), None, 2, False),
    ]
    for quant in (None, emb_api.QuantizationConfig(num_buckets=5, lower=-1.0, upper=1.0)):
        for combiner in ("sum", "mean", "sqrtn"):
            tc = emb_api.TableConfig(9, 3, name="t", combiner=combiner, quantization_config=quant)
            for ids, w, seq, dense in cases:
                fc = emb_api.FeatureConfig(table=tc, max_sequence_length=seq)
                from tf_embed_ops import config

                proto = config.from_feature_config([fc], emb_api.SGD(0.1)).SerializeToString()
                fi = embedding_ops.normalize_feature(ids, w, max_sequence_length=seq)
                want = embedding_ops.embedding_activations([fi], [table], proto, [combiner])[0]
                got = te_keras.plain_lookup(fi, dense, table, 3, combiner, quant)
                np.testing.assert_array_equal(got.numpy().view(np.uint32), want.numpy().view(np.uint32))
