"""The plain-TensorFlow serving form of a dynamic table (tf_embed_ops/dynamic/serving.py).

Checked against numpy (a dict from key to row), and in a SavedModel loaded by a fresh interpreter that never imports
tf_embed_ops (slow tier). The equality with the training side's own lookup is in test_state_serving_ops.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tf_embed_ops.dynamic import serving


def _reference(keys, weights, query):
    rows = {int(k): weights[i] for i, k in enumerate(keys)}
    zeros = np.zeros(weights.shape[1], np.float32)
    return np.stack([rows.get(int(q), zeros) for q in np.ravel(query)]).reshape(np.shape(query) + (weights.shape[1],))


def _data(rng, n, dim):
    keys = rng.choice(np.array([-(2**63), 2**63 - 1, 0, -1], np.int64), 4, replace=False)
    keys = np.unique(np.concatenate([keys, rng.integers(-(2**62), 2**62, n, dtype=np.int64)]))
    rng.shuffle(keys)  # freeze sorts them
    return keys, rng.standard_normal([keys.shape[0], dim]).astype(np.float32)


@pytest.mark.parametrize("n, dim", [(0, 3), (1, 1), (50, 8)])
def test_lookup_matches_a_dict_and_reads_zeros_for_missing_keys(n, dim):
    rng = np.random.default_rng(0)
    keys, weights = _data(rng, n, dim)
    frozen = serving.freeze_arrays(keys, weights)
    query = np.concatenate([keys, rng.integers(-(2**62), 2**62, 20, dtype=np.int64), [-(2**63), 2**63 - 1]])
    rng.shuffle(query)
    query = query[: (query.shape[0] // 2) * 2].reshape(-1, 2)  # rank 2: the output is query.shape + [dim]
    got = frozen.lookup(tf.constant(query, tf.int64)).numpy()
    np.testing.assert_array_equal(got, _reference(keys, weights, query))
    assert frozen.values.shape == (keys.shape[0] + 1, dim)
    np.testing.assert_array_equal(frozen.values.numpy()[-1], np.zeros(dim, np.float32))
    np.testing.assert_array_equal(frozen.keys.numpy(), np.sort(keys))


def test_empty_query():
    keys, weights = _data(np.random.default_rng(1), 5, 4)
    frozen = serving.freeze_arrays(keys, weights)
    assert frozen.lookup(tf.zeros([0], tf.int64)).shape == (0, 4)


def test_string_keys_are_the_fingerprint_read_little_endian():
    ids = tf.constant([["a", "bc"], ["", "user_17"]])
    got = serving.string_keys(ids).numpy()
    # Independent of tf.bitcast: each string's 8 fingerprint bytes read as a little-endian int64.
    fp = tf.fingerprint(tf.reshape(ids, [-1]), method="farmhash64").numpy()
    want = np.array([int.from_bytes(bytes(row), "little", signed=True) for row in fp], np.int64).reshape(2, 2)
    np.testing.assert_array_equal(got, want)
    assert len(set(got.ravel().tolist())) == 4


def test_string_table_looks_up_by_fingerprint():
    strings = np.array([b"alpha", b"beta", b"gamma"])
    keys = serving.string_keys(tf.constant(strings)).numpy()
    weights = np.arange(6, dtype=np.float32).reshape(3, 2)
    frozen = serving.freeze_arrays(keys, weights, key_dtype=tf.string, name="words")
    got = frozen.lookup(tf.constant(["gamma", "delta", "alpha"])).numpy()
    np.testing.assert_array_equal(got, [[4, 5], [0, 0], [0, 1]])


def test_wrong_id_dtype_is_refused_naming_both_dtypes():
    frozen = serving.freeze_arrays(np.array([1], np.int64), np.ones([1, 2], np.float32), key_dtype=tf.string)
    with pytest.raises(ValueError, match="int64.*string"):
        frozen.lookup(tf.constant([1], tf.int64))


@pytest.mark.parametrize(
    "keys, weights, match",
    [
        (np.array([1, 1], np.int64), np.ones([2, 2], np.float32), "unique"),
        (np.array([1, 2], np.int64), np.ones([3, 2], np.float32), r"\[n, dim\]"),
        (np.array([1, 2], np.int64), np.ones([2], np.float32), r"\[n, dim\]"),
    ],
)
def test_bad_arrays_are_refused_naming_the_table(keys, weights, match):
    with pytest.raises(ValueError, match=f"table 'tbl'.*{match}"):
        serving.freeze_arrays(keys, weights, name="tbl")


@pytest.mark.slow
def test_saved_model_loads_and_looks_up_without_tf_embed_ops(tmp_path):
    keys, weights = _data(np.random.default_rng(2), 30, 5)
    frozen = serving.freeze_arrays(keys, weights)
    root = tf.Module()
    root.table = frozen

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def serve(ids):
        return {"rows": frozen.lookup(ids)}

    path = str(tmp_path / "model")
    tf.saved_model.save(root, path, signatures={"serving_default": serve})
    query = np.concatenate([keys[:10], np.array([12345, -7], np.int64)])
    np.save(tmp_path / "query.npy", query)
    code = textwrap.dedent(
        f"""
        import sys, numpy as np, tensorflow as tf
        m = tf.saved_model.load({path!r})
        out = m.signatures["serving_default"](ids=tf.constant(np.load({str(tmp_path / "query.npy")!r})))
        np.save({str(tmp_path / "out.npy")!r}, out["rows"].numpy())
        assert not any(name.startswith("tf_embed_ops") for name in sys.modules), "tf_embed_ops was imported"
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), _reference(keys, weights, query))
