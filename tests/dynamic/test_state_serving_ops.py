"""The frozen serving form against the table's own (custom-op) lookup, string keys as the kernel fingerprints
them, and a Keras model with dynamic tables exported by `export_for_serving` and served without the plugin."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.dynamic.state_util import (
    SERVING_SIGNATURE,
    DynamicTable,
    config,
    random_sharded_table,
    serving_data,
    train_lookup,
    trained_serving_model,
)
from tf_embed_ops import keras as te_keras
from tf_embed_ops.dynamic import serving


def test_frozen_lookup_equals_the_table_lookup():
    table = DynamicTable(config(dim=5))
    keys = np.random.default_rng(0).integers(-(2**62), 2**62, 64, dtype=np.int64)
    train_lookup(table, keys, step=0)  # rows initialised from the keys by the kernel
    frozen = serving.freeze(table)
    query = np.concatenate([keys[::2], [1, 2, 3]]).reshape(-1, 5)
    np.testing.assert_array_equal(frozen.lookup(query).numpy(), table.lookup(query).numpy())
    assert frozen.size == 64


def test_string_keys_are_what_the_kernel_inserts_and_serve_the_same_rows():
    table = DynamicTable(config(dim=3, key_dtype=tf.string))
    words = np.array([b"user_1", b"user_22", b"", b"\xff\x00bytes"])
    train_lookup(table, words, step=0)
    np.testing.assert_array_equal(table.export()["keys"].numpy(), np.sort(serving.string_keys(words).numpy()))
    frozen = serving.freeze(table)
    query = tf.constant([b"user_22", b"unknown", b"user_1"])
    np.testing.assert_array_equal(frozen.lookup(query).numpy(), table.lookup(query).numpy())
    assert np.all(frozen.lookup(query).numpy()[1] == 0)


def test_a_sharded_table_freezes_into_one(tmp_path):
    cfg = config()
    sharded, c = random_sharded_table(cfg, np.random.default_rng(1), 40, tmp_path)
    frozen = serving.freeze(sharded)
    np.testing.assert_array_equal(frozen.keys.numpy(), c["keys"])
    np.testing.assert_array_equal(frozen.lookup(c["keys"]).numpy(), c["weights"])


def test_serving_mode_gives_what_the_trained_model_predicts():
    model = trained_serving_model()
    x, _ = serving_data(16, 0)  # seen ids
    x_new, _ = serving_data(8, 1)  # mostly unseen: the default row
    for feed in (x, x_new):
        expected = model(feed, training=False).numpy()
        with te_keras.serving_mode():
            served = model(feed, training=False).numpy()
        np.testing.assert_allclose(served, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_saved_model_with_dynamic_tables_serves_without_the_plugin(tmp_path):
    model = trained_serving_model()
    x, _ = serving_data(16, 0)
    x_unseen, _ = serving_data(4, 2)
    x = {k: tf.concat([x[k], x_unseen[k]], 0) for k in x}
    expected = model(x, training=False).numpy()
    export_dir = str(tmp_path / "served")
    te_keras.export_for_serving(model, export_dir, SERVING_SIGNATURE)
    feed = {
        "user": x["user"].numpy().tolist(),
        "words_values": [w.decode() for w in x["words"].values.numpy().tolist()],
        "words_row_splits": x["words"].row_splits.numpy().tolist(),
        "slot": x["slot"].numpy().tolist(),
    }
    code = f"""
import json, sys
import tensorflow as tf
fn = tf.saved_model.load({export_dir!r}).signatures["serving_default"]
feed = json.loads(sys.stdin.read())
args = {{k: tf.constant(v, tf.string if k == "words_values" else tf.int64) for k, v in feed.items()}}
out = fn(**args)
assert not any(m.startswith("tf_embed_ops") for m in sys.modules), "the plugin was imported"
print(json.dumps({{k: v.numpy().tolist() for k, v in out.items()}}))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(feed), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = np.array(json.loads(result.stdout.strip().splitlines()[-1])["output_0"])
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
