"""Quantized and pruned serving exports (te.keras.export_for_serving(..., quantization=, prune=)): the served model
equals the trained model run on the decoded (and pruned) tables, the training tables stay bitwise unchanged, bad
arguments write nothing, `inspect-export` reports the tables, and the export serves in an interpreter that cannot
import tf_embed_ops (slow tier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tests.keras_test_util import VOCAB, _data, _dataset, _model
from tests.serving_support import serve_without_plugin
from tf_embed_ops import keras as te_keras
from tf_embed_ops.serving import quantization as q

SIGNATURE = {
    "user": tf.TensorSpec([None], tf.int64),
    "items": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64),
    "history": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64),
}


@pytest.fixture(scope="module")
def trained():
    model, layer = _model()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    x, y, _ = _data(32)
    model.fit(_dataset(x, y, 16), epochs=2, verbose=0)
    return model, layer


def _tables(layer) -> dict:
    return {t.name: v for t, v in layer.embedding_tables.items()}


def _feed(x) -> dict:
    return {
        "user": x["user"],
        "items_values": x["items"].values,
        "items_row_splits": x["items"].row_splits,
        "history_values": x["history"].values,
        "history_row_splits": x["history"].row_splits,
    }


def _reference(model, layer, x, replace: dict) -> np.ndarray:
    """The trained model (custom ops) with some tables' values replaced, then restored bitwise."""
    tables = _tables(layer)
    saved = {name: tables[name].numpy() for name in replace}
    try:
        for name, value in replace.items():
            tables[name].assign(value)
        return model(x, training=False).numpy()
    finally:
        for name, value in saved.items():
            tables[name].assign(value)


@pytest.mark.parametrize(
    "quantization", ["int8", "int4", "float16", "bfloat16", {"user": "int4", "item": None}, {"item": "int8"}]
)
def test_quantized_export_equals_the_model_on_decoded_tables(trained, tmp_path, quantization):
    model, layer = trained
    before = {n: v.numpy() for n, v in _tables(layer).items()}
    x, _, _ = _data(24, seed=3, vocab_max=VOCAB)
    export = str(tmp_path / "served")
    te_keras.export_for_serving(model, export, SIGNATURE, quantization=quantization)
    modes = quantization if isinstance(quantization, dict) else dict.fromkeys(before, quantization)
    decoded = {
        n: q.decode_numpy(q.encode(before[n], m), m, before[n].shape[1]) for n, m in modes.items() if m is not None
    }
    want = _reference(model, layer, x, decoded)
    got = tf.saved_model.load(export).signatures["serving_default"](**_feed(x))["output_0"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    for n, v in _tables(layer).items():  # the training tables are untouched
        np.testing.assert_array_equal(v.numpy(), before[n])
    if any(m is not None for m in modes.values()):  # the export differs from float32 where a table is quantized
        assert not np.allclose(got, model(x, training=False).numpy(), rtol=0, atol=1e-7)


def test_pruned_export_reads_zeros_for_pruned_ids_and_keeps_the_training_table(trained, tmp_path):
    model, layer = trained
    before = {n: v.numpy() for n, v in _tables(layer).items()}
    norms = np.linalg.norm(before["user"].astype(np.float64), axis=1)
    threshold = float(np.median(norms))
    export = str(tmp_path / "served")
    prune = {"user": te.serving.Prune(min_l2_norm=threshold), "item": te.serving.Prune(max_rows=7)}
    te_keras.export_for_serving(model, export, SIGNATURE, quantization={"user": "int8"}, prune=prune)
    user = before["user"].copy()
    user[norms < threshold] = 0.0
    user = q.decode_numpy(q.encode(user, "int8"), "int8", 4)  # a zero row stays exactly zero
    item = np.zeros_like(before["item"])
    item_norms = np.linalg.norm(before["item"].astype(np.float64), axis=1)
    top = sorted(range(VOCAB), key=lambda i: (-item_norms[i], i))[:7]
    item[top] = before["item"][top]
    x, _, _ = _data(24, seed=4, vocab_max=VOCAB)
    want = _reference(model, layer, x, {"user": user, "item": item})
    got = tf.saved_model.load(export).signatures["serving_default"](**_feed(x))["output_0"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    for n, v in _tables(layer).items():
        np.testing.assert_array_equal(v.numpy(), before[n])
    meta = te.serving.read_export_metadata(export)
    assert meta["user"]["rows_exported"] == int((norms >= threshold).sum()) and meta["user"]["quantization"] == "int8"
    assert meta["item"]["rows_exported"] == 7 and meta["item"]["prune"] == {"max_rows": 7, "score": "l2_norm"}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"quantization": "int3"}, r"every table.*'int3'"),
        ({"quantization": {"user": "int2"}}, r"'user'.*'int2'"),
        ({"quantization": {"usr": "int8"}}, r"unknown table 'usr'"),
        ({"quantization": 8}, r"unknown mode 8"),
        ({"prune": {"usr": te.serving.Prune(max_rows=1)}}, r"unknown table 'usr'"),
        ({"prune": {"user": te.serving.Prune(min_count=2)}}, r"'user'.*min_count=2.*dynamic"),
        ({"prune": {"user": te.serving.Prune(max_age_steps=0)}}, r"'user'.*max_age_steps=0"),
        ({"prune": {"user": te.serving.Prune(max_rows=3, score="count")}}, r"'user'.*score='count'"),
        ({"prune": {"user": 3}}, r"'user'.*expected a te.serving.Prune"),
        ({"prune": [te.serving.Prune(max_rows=3)]}, r"prune: expected a dict"),
    ],
)
def test_bad_arguments_name_the_table_and_write_nothing(trained, tmp_path, kwargs, match):
    model, layer = trained
    before = {n: v.numpy() for n, v in _tables(layer).items()}
    export = tmp_path / "served"
    with pytest.raises(ValueError, match=match):
        te_keras.export_for_serving(model, str(export), SIGNATURE, **kwargs)
    assert os.listdir(tmp_path) == []
    for n, v in _tables(layer).items():
        np.testing.assert_array_equal(v.numpy(), before[n])


def test_unencodable_rows_write_nothing(tmp_path):
    model, layer = _model()
    _tables(layer)["item"].assign(np.full([VOCAB, 4], 1e5, np.float32))
    with pytest.raises(ValueError, match=r"table 'item': row 0 holds 100000\.0"):
        te_keras.export_for_serving(model, str(tmp_path / "served"), SIGNATURE, quantization="int8")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"min_count": -1}, r"min_count must be >= 0; got -1"),
        ({"max_age_steps": 1.5}, r"max_age_steps must be an integer"),
        ({"max_rows": -3}, r"max_rows must be >= 0; got -3"),
        ({"min_l2_norm": -0.5}, r"min_l2_norm must be finite and >= 0; got -0.5"),
        ({"min_l2_norm": float("nan")}, r"min_l2_norm must be finite"),
        ({"score": "norm"}, r"score must be one of"),
    ],
)
def test_prune_refuses_bad_thresholds(kwargs, match):
    with pytest.raises(ValueError, match=match):
        te.serving.Prune(**kwargs)


def test_inspect_export_reports_rows_bytes_quantization_and_pruning(trained, tmp_path):
    model, _ = trained
    export = str(tmp_path / "served")
    te_keras.export_for_serving(
        model, export, SIGNATURE, quantization={"user": "int4"}, prune={"item": te.serving.Prune(max_rows=5)}
    )
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    run = [sys.executable, "-m", "tf_embed_ops", "inspect-export", export]
    out = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    user, item = report["tables"]["user"], report["tables"]["item"]
    assert (user["quantization"], user["rows_exported"], user["bytes"]) == ("int4", VOCAB, VOCAB * (2 + 4))
    assert (item["quantization"], item["rows_exported"], item["rows_pruned"]) == ("none", 5, VOCAB - 5)
    assert item["bytes"] == 6 * 4 * 4 + VOCAB * 4  # 5 kept rows + the default row, float32; the int32 remap
    assert report["saved_model_bytes"] > user["bytes"] + item["bytes"]
    text = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env)
    assert text.returncode == 0 and "max_rows=5" in text.stdout and "int4" in text.stdout
    # A corrupted metadata file is refused, with the reason.
    path = os.path.join(export, "assets.extra", "tf_embed_ops_export.json")
    body = json.load(open(path))
    body["tables"]["user"]["rows_exported"] = 1
    json.dump(body, open(path, "w"))
    bad = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 1 and "checksum" in bad.stderr


def test_export_holds_no_training_state(trained, tmp_path):
    """Only what the serving function reads: no optimizer slot, no float32 copy of a quantized table."""
    model, _ = trained
    export = str(tmp_path / "served")
    te_keras.export_for_serving(model, export, SIGNATURE, quantization="int8")
    reader = tf.train.load_checkpoint(os.path.join(export, "variables", "variables"))
    dtypes = reader.get_variable_to_dtype_map()
    shapes = reader.get_variable_to_shape_map()
    tables = [k for k, d in dtypes.items() if d == tf.uint8]
    assert len(tables) == 2 and all(shapes[k] == [VOCAB, 8] for k in tables)
    assert not [k for k, s in shapes.items() if s == [VOCAB, 4]]  # no float32 table, no slot


@pytest.mark.slow
@pytest.mark.parametrize("quantization", ["int8", "int4", "bfloat16"])
def test_quantized_pruned_export_serves_without_the_plugin(trained, tmp_path, quantization):
    model, layer = trained
    export = str(tmp_path / "served")
    prune = {"user": te.serving.Prune(max_rows=10)}
    te_keras.export_for_serving(model, export, SIGNATURE, quantization=quantization, prune=prune)
    x, _, _ = _data(24, seed=5, vocab_max=VOCAB)
    expected = tf.saved_model.load(export).signatures["serving_default"](**_feed(x))["output_0"].numpy()
    served = serve_without_plugin(export, _feed(x), cwd=str(tmp_path))
    np.testing.assert_array_equal(served, expected)


def test_an_export_replaces_an_older_one_at_the_same_path(trained, tmp_path):
    model, _ = trained
    export = str(tmp_path / "served")
    te_keras.export_for_serving(model, export, SIGNATURE, quantization="int4")
    te_keras.export_for_serving(model, export, SIGNATURE)
    assert os.listdir(tmp_path) == ["served"]  # no temporary or old directory left behind
    meta = te.serving.read_export_metadata(export)
    assert {t["quantization"] for t in meta.values()} == {"none"}


def test_16_bit_storage_tables_quantize_from_their_stored_values(tmp_path):
    from tests.keras_test_util import _feature_config

    fc = _feature_config()
    user = te.TableConfig(VOCAB, 4, name="user", combiner="sum", storage_dtype=tf.bfloat16)
    fc["user"] = tf.tpu.experimental.embedding.FeatureConfig(table=user)
    model, layer = _model(fc)
    stored = _tables(layer)["user"].numpy().astype(np.float32)
    export = str(tmp_path / "served")
    te_keras.export_for_serving(model, export, SIGNATURE, quantization={"user": "int8"})
    meta = te.serving.read_export_metadata(export)["user"]
    assert (meta["trained_dtype"], meta["quantization"]) == ("bfloat16", "int8")
    # The served table holds the stored (bfloat16) values encoded, byte for byte.
    loaded = tf.saved_model.load(export)
    (rows,) = [t.rows.numpy() for t in loaded.served_tables]
    np.testing.assert_array_equal(rows, q.encode(stored, "int8"))
    x, _, _ = _data(8, seed=6, vocab_max=VOCAB)
    assert np.isfinite(loaded.signatures["serving_default"](**_feed(x))["output_0"].numpy()).all()


def test_two_tables_of_one_name_are_refused_by_name(tmp_path):
    emb = tf.tpu.experimental.embedding
    layers = [
        te_keras.TPUEmbedding({"u": emb.FeatureConfig(emb.TableConfig(5, 2, name="user"))}, emb.SGD(0.1), name=n)
        for n in ("a", "b")
    ]
    inputs = {"u": keras.Input(shape=(), dtype="int64", name="u")}
    out = keras.layers.Concatenate()([layers[0](inputs)["u"], layers[1](inputs)["u"]])
    model = keras.Model(inputs, out)
    signature = {"u": tf.TensorSpec([None], tf.int64)}
    for kwargs in ({"quantization": "int8"}, {"prune": {"user": te.serving.Prune(max_rows=1)}}):
        with pytest.raises(ValueError, match=r"two embedding tables named 'user'"):
            te_keras.export_for_serving(model, str(tmp_path / "served"), signature, **kwargs)
        assert os.listdir(tmp_path) == []
