"""Dynamic tables frozen for serving with quantization and publish-time pruning (tf_embed_ops/dynamic/serving.py,
tf_embed_ops/serving/prune.py): the kept keys per criterion from the table's own counts and steps, per shard for
a sharded table, decoded rows against the numpy reference, and the training table unchanged bitwise."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.dynamic.state_util import (
    SERVING_SIGNATURE,
    DynamicTable,
    config,
    content,
    random_content,
    random_sharded_table,
    serving_data,
    trained_serving_model,
)
from tests.serving_support import serve_without_plugin
from tf_embed_ops.dynamic import serving
from tf_embed_ops.dynamic.sharding import shard_of_keys
from tf_embed_ops.serving import Prune
from tf_embed_ops.serving import quantization as q


def _table(n=60, dim=6, step=30, seed=0):
    table = DynamicTable(config(dim=dim))
    c = random_content(np.random.default_rng(seed), n, dim, table.num_slots)
    table.import_(**c)
    table.step.assign(step)
    return table, c


def _served(frozen, keys):
    return frozen.lookup(tf.constant(keys, tf.int64)).numpy()


def _expect(frozen, c, kept_mask, mode):
    weights = np.where(kept_mask[:, None], c["weights"], 0.0).astype(np.float32)
    want = q.decode_numpy(q.encode(weights, mode), mode, weights.shape[1])
    np.testing.assert_array_equal(_served(frozen, c["keys"]), want)
    np.testing.assert_array_equal(np.sort(frozen.keys.numpy()), c["keys"][kept_mask])


@pytest.mark.parametrize("mode", [None, "int8", "int4", "float16"])
def test_each_criterion_keeps_the_rows_it_should(mode):
    table, c = _table()
    before = content(table)
    norms = np.sqrt((c["weights"].astype(np.float64) ** 2).sum(1))
    cases = [
        (Prune(min_count=25), c["counts"] >= 25),
        (Prune(max_age_steps=15), 30 - c["last_steps"] <= 15),
        (Prune(min_l2_norm=2.0), norms >= 2.0),
        (Prune(min_count=10, max_age_steps=20), (c["counts"] >= 10) & (30 - c["last_steps"] <= 20)),
    ]
    for prune, mask in cases:
        assert 0 < mask.sum() < mask.shape[0]  # each case keeps some rows and drops some
        frozen = serving.freeze(table, mode, prune)
        _expect(frozen, c, mask, mode)
        meta = frozen.metadata
        assert (meta["rows_trained"], meta["rows_exported"]) == (60, int(mask.sum()))
    for name, value in content(table).items():  # the training table is untouched
        np.testing.assert_array_equal(value, before[name])


@pytest.mark.parametrize("score", ["l2_norm", "count", "recency"])
def test_max_rows_keeps_the_top_scores_smaller_key_first_on_ties(score):
    table, c = _table(n=40)
    c_scores = {
        "l2_norm": np.sqrt((c["weights"].astype(np.float64) ** 2).sum(1)),
        "count": c["counts"],
        "recency": c["last_steps"],
    }[score]
    ranked = sorted(range(40), key=lambda i: (-c_scores[i], c["keys"][i]))[:9]
    mask = np.zeros(40, bool)
    mask[ranked] = True
    _expect(serving.freeze(table, "int8", Prune(max_rows=9, score=score)), c, mask, "int8")
    # max_rows above the row count keeps everything; 0 keeps nothing (every key reads the default row)
    _expect(serving.freeze(table, None, Prune(max_rows=100, score=score)), c, np.ones(40, bool), None)
    _expect(serving.freeze(table, None, Prune(max_rows=0, score=score)), c, np.zeros(40, bool), None)


def test_max_rows_caps_each_shard_of_a_sharded_table(tmp_path):
    cfg = config(dim=4)
    sharded, c = random_sharded_table(cfg, np.random.default_rng(3), 50, tmp_path)
    frozen = serving.freeze(sharded, "int4", Prune(max_rows=6))
    shard = shard_of_keys(tf.constant(c["keys"]), 2).numpy()
    norms = np.sqrt((c["weights"].astype(np.float64) ** 2).sum(1))
    mask = np.zeros(50, bool)
    for s in (0, 1):
        rows = np.flatnonzero(shard == s)
        mask[sorted(rows, key=lambda i: (-norms[i], c["keys"][i]))[:6]] = True
    assert mask.sum() == 12
    _expect(frozen, c, mask, "int4")


def test_string_keys_quantized_lookup():
    table = DynamicTable(config(dim=5, key_dtype=tf.string))
    keys = serving.string_keys(tf.constant([b"a", b"bb", b"ccc"])).numpy()
    weights = np.random.default_rng(4).normal(size=(3, 5)).astype(np.float32)
    order = np.argsort(keys)
    table.import_(keys[order], weights[order])
    frozen = serving.freeze(table, "int8")
    got = frozen.lookup(tf.constant([b"bb", b"zz", b"a"])).numpy()
    want = q.decode_numpy(q.encode(weights, "int8"), "int8", 5)
    np.testing.assert_array_equal(got, np.stack([want[1], np.zeros(5, np.float32), want[0]]))


def test_freeze_refuses_bad_arguments_naming_the_table():
    table, _ = _table()
    with pytest.raises(ValueError, match=r"'t'.*'int16'"):
        serving.freeze(table, "int16")
    with pytest.raises(ValueError, match=r"'t'.*expected a te.serving.Prune"):
        serving.freeze(table, None, {"min_count": 3})


def test_keras_export_quantizes_and_prunes_dynamic_tables(tmp_path):
    from tf_embed_ops import keras as te_keras
    from tf_embed_ops.serving import read_export_metadata

    model = trained_serving_model()
    layer = next(x for x in model.layers if hasattr(x, "dynamic_tables"))
    tables = {cfg.name: t for cfg, t in layer.dynamic_tables.items()}
    before = {name: content(t) for name, t in tables.items()}
    export = str(tmp_path / "served")
    quantization = {"users": "int4", "words": "int8", "static": "bfloat16"}
    prune = {"users": Prune(max_rows=5, score="count")}
    te_keras.export_for_serving(model, export, SERVING_SIGNATURE, quantization=quantization, prune=prune)
    for name, t in tables.items():  # the training tables are untouched
        for key, value in content(t).items():
            np.testing.assert_array_equal(value, before[name][key])

    x, _ = serving_data(16, 0)
    feed = {"user": x["user"], "words_values": x["words"].values, "words_row_splits": x["words"].row_splits}
    got = tf.saved_model.load(export).signatures["serving_default"](**feed, slot=x["slot"])["output_0"].numpy()

    # Reference: the training side's own lookup over decoded (and pruned) rows, then the tables restored.
    users = before["users"]
    top = sorted(range(users["keys"].shape[0]), key=lambda i: (-users["counts"][i], users["keys"][i]))[:5]
    static_var = next(v for cfg, v in layer.embedding_tables.items() if cfg.name == "static")
    static_before = static_var.numpy()
    try:
        tables["users"].import_(
            users["keys"][np.sort(top)], q.decode_numpy(q.encode(users["weights"], "int4"), "int4", 4)[np.sort(top)]
        )
        words = before["words"]
        tables["words"].import_(words["keys"], q.decode_numpy(q.encode(words["weights"], "int8"), "int8", 3))
        static_var.assign(q.decode_numpy(q.encode(static_before, "bfloat16"), "bfloat16", 2))
        want = model(x, training=False).numpy()
    finally:
        for name, t in tables.items():
            t.import_(**{k: v for k, v in before[name].items()})
        static_var.assign(static_before)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    meta = read_export_metadata(export)
    assert meta["users"]["kind"] == "dynamic" and meta["users"]["rows_exported"] == 5
    assert meta["users"]["quantization"] == "int4" and meta["words"]["quantization"] == "int8"
    assert meta["static"]["quantization"] == "bfloat16" and meta["static"]["kind"] == "static"


@pytest.mark.slow
def test_quantized_pruned_dynamic_export_serves_without_the_plugin(tmp_path):
    from tf_embed_ops import keras as te_keras

    model = trained_serving_model()
    export = str(tmp_path / "served")
    te_keras.export_for_serving(
        model, export, SERVING_SIGNATURE, quantization="int4", prune={"users": Prune(max_rows=4, score="recency")}
    )
    x, _ = serving_data(16, 0)
    feed = {
        "user": x["user"],
        "words_values": x["words"].values,
        "words_row_splits": x["words"].row_splits,
        "slot": x["slot"],
    }
    expected = tf.saved_model.load(export).signatures["serving_default"](**feed)["output_0"].numpy()
    served = serve_without_plugin(export, feed, cwd=str(tmp_path), string_inputs=("words_values",))
    np.testing.assert_array_equal(served, expected)
