"""Serving export of tiered tables (streamed from the tier into the SavedModel's checkpoint), and the APIs that walk
an embedding's tables: each handles a tiered table or refuses it by name, never skips it silently.

Reference: the same model with the table in memory, exported by the same exporter (in-memory tables are exported
from their variables); outputs are compared bitwise, in this process and (slow tier) in an interpreter in which
`tf_embed_ops` cannot be imported, as TensorFlow Serving loads a SavedModel.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from tiered_support import embedding, run_json_child, table_pair
from tiered_support import keras_model as _keras_model

import tf_embed_ops as te
import tf_embed_ops.distribute as ted
from tests.serving_support import serve_without_plugin
from tf_embed_ops import keras as te_keras

_emb = tf.tpu.experimental.embedding
V, DIM, CACHE_ROWS, BATCH = 64, 5, 8, 8
SIGNATURE = {"f": tf.TensorSpec([None], tf.int64)}
# Every id, twice over in another order: the first and last ids included.
IDS = np.concatenate([np.arange(V), np.arange(V)[::-1]]).astype(np.int64)


def _configs(tmp_path, **options):
    """(in-memory, tiered) table configs: the tiered one read in chunks of 7 rows (10 slices), its cache holding 8
    of its 64 rows."""
    memory, tiered = table_pair(tmp_path / "rows", te.optimizers.Adagrad(0.1), V, DIM, CACHE_ROWS, **options)
    tiered.storage = te.Tiered(**{**tiered.storage.get_config(), "chunk_bytes": 7 * 4 * 2 * DIM})
    return memory, tiered


def _pair(tmp_path, **options):
    """(in-memory model, tiered model, tiered table), trained on the same batches: their tables are equal."""
    models = [_keras_model(table) for table in _configs(tmp_path, **options)]
    rng = np.random.default_rng(1)
    x = {"f": rng.integers(0, V, size=40).astype(np.int64)}
    y = rng.normal(size=(40, 2)).astype(np.float32)
    for model in models:
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    return models[0], models[1], next(iter(models[1].get_layer("embedding").tiered_tables.values()))


def _serve_here(export_dir):
    fn = tf.saved_model.load(export_dir).signatures["serving_default"]
    return fn(f=tf.constant(IDS))["output_0"].numpy()


@pytest.mark.parametrize(
    "mode, options",
    [
        (None, {}),
        ("int8", {}),
        pytest.param("float16", {}, marks=pytest.mark.slow),  # the fast tier keeps one float and one integer mode
        pytest.param(None, {"storage_dtype": tf.bfloat16}, marks=pytest.mark.slow),
    ],
    ids=["fp32", "int8", "fp16", "bf16-table"],
)
def test_export_streams_the_rows_and_serves_what_the_in_memory_export_serves(tmp_path, mode, options):
    model_m, model_t, table = _pair(tmp_path, **options)
    values, _ = table.read_all()
    assert int(table.stats()["resident_rows"]) > 0  # dirty rows in the cache: the export reads through them
    dirs = {k: str(tmp_path / k) for k in ("memory", "tiered")}
    te_keras.export_for_serving(model_m, dirs["memory"], SIGNATURE, quantization=mode)
    te_keras.export_for_serving(model_t, dirs["tiered"], SIGNATURE, quantization=mode)
    np.testing.assert_array_equal(_serve_here(dirs["tiered"]), _serve_here(dirs["memory"]))

    # The servable's table is one tensor of the checkpoint, written as ten row slices, holding the table's rows.
    reader = tf.train.load_checkpoint(os.path.join(dirs["tiered"], "variables", "variables"))
    shapes = reader.get_variable_to_shape_map()
    width = te.serving.quantization.encoded_width(mode, DIM)
    (key,) = [k for k, s in shapes.items() if s == [V, width]]
    stored = reader.get_tensor(key)
    if mode == "float16":  # kept as its int16 bits: TensorFlow restores no float16 tensor saved as slices
        assert stored.dtype == np.int16
        stored = stored.view(np.float16)
    if mode is None:
        np.testing.assert_array_equal(stored.astype(np.float32), values)
        assert stored.dtype == np.dtype(table.dtypes[0].as_numpy_dtype)
    else:
        np.testing.assert_array_equal(stored, te.serving.quantization.encode(values, mode, "t"))
    assert len([f for f in os.listdir(os.path.join(dirs["tiered"], "variables")) if ".data-" in f]) == 11
    meta = te.serving.read_export_metadata(dirs["tiered"])["t"]
    assert (meta["kind"], meta["rows_exported"], meta["quantization"]) == ("tiered", V, mode or "none")


def test_export_refuses_pruning_a_tiered_table_and_writes_nothing(tmp_path):
    model_t = _keras_model(_configs(tmp_path)[1])
    table = next(iter(model_t.get_layer("embedding").tiered_tables.values()))
    before = table.read_all()
    target = str(tmp_path / "export")
    with pytest.raises(ValueError, match=r"prune: table 't' is tiered"):
        te_keras.export_for_serving(model_t, target, SIGNATURE, prune={"t": te.serving.Prune(max_rows=3)})
    assert not os.path.exists(target)
    np.testing.assert_array_equal(table.read_all()[0], before[0])


def test_export_refuses_rows_a_mode_cannot_encode_and_leaves_no_export(tmp_path):
    model_t = _keras_model(_configs(tmp_path)[1])
    table = next(iter(model_t.get_layer("embedding").tiered_tables.values()))
    row = np.full([1, DIM], 1e6, np.float32)  # beyond float16's range: int8 stores its scale and bias in float16
    table.write_rows(60, row, [np.zeros([1, DIM], np.float32)])
    target = str(tmp_path / "export")
    with pytest.raises(ValueError, match=r"table 't'.*float16's range.*from row 56"):
        te_keras.export_for_serving(model_t, target, SIGNATURE, quantization="int8")
    assert not os.path.exists(target)
    assert [p for p in os.listdir(tmp_path) if p.startswith("export")] == []


# ------------------------------------------------------------------------ APIs that walk the tables


def _tiered_embedding(tmp_path):
    _, tiered = table_pair(tmp_path / "rows", te.optimizers.Adagrad(0.1), V, DIM, CACHE_ROWS, name="big")
    emb = embedding(tiered)
    return emb, emb.tiered_tables[tiered]


def test_incremental_checkpoints_refuse_an_untracked_tiered_table_and_create_nothing(tmp_path):
    emb, _ = _tiered_embedding(tmp_path)
    directory = str(tmp_path / "chain")
    # Tracking only the in-memory embedding of a checkpoint that also holds the tiered one: a delta would lack the
    # tiered table's changes (tests/test_tiered_incremental_checkpoint.py: tracked, it is checkpointed).
    other = embedding(te.TableConfig(V, DIM, name="small", optimizer=te.optimizers.Adagrad(0.1)))
    with pytest.raises(
        ValueError, match=r"IncrementalCheckpointManager: table\(s\) 'big' are tiered.*not in `embeddings`"
    ):
        te.checkpoint.IncrementalCheckpointManager(
            tf.train.Checkpoint(embedding=emb, other=other), directory, embeddings=[other]
        )
    assert not os.path.exists(directory)


def test_the_sharded_classes_refuse_tiered_tables_by_name(tmp_path):
    _, tiered = table_pair(tmp_path, te.optimizers.Adagrad(0.1), V, DIM, CACHE_ROWS, name="big")
    features = {"f": _emb.FeatureConfig(tiered, name="f")}
    with pytest.raises(ValueError, match=r"te\.distribute\.ShardedTPUEmbedding does not train tiered.*'big'"):
        ted.ShardedTPUEmbedding(features, num_shards=2)
    assert not os.path.exists(os.path.join(str(tmp_path), "big.rows"))


# ------------------------------------------------------------------------ slow: as TensorFlow Serving loads it


@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, "int8", "int4", "float16", "bfloat16"])
def test_the_streamed_export_serves_bitwise_in_plain_tensorflow(tmp_path, mode):
    model_m, model_t, _ = _pair(tmp_path)
    dirs = {k: str(tmp_path / k) for k in ("memory", "tiered")}
    te_keras.export_for_serving(model_m, dirs["memory"], SIGNATURE, quantization=mode)
    te_keras.export_for_serving(model_t, dirs["tiered"], SIGNATURE, quantization=mode)
    feed = {"f": tf.constant(IDS)}
    served = serve_without_plugin(dirs["tiered"], feed, cwd=str(tmp_path))
    np.testing.assert_array_equal(served, serve_without_plugin(dirs["memory"], feed, cwd=str(tmp_path)))
    np.testing.assert_array_equal(served, _serve_here(dirs["tiered"]))


@pytest.mark.slow
def test_the_export_holds_one_chunk_not_the_table(tmp_path):
    """A 96 MiB table exported in chunks of 2 MiB: the exporting process's peak RSS grows by a small fraction of
    the table (the in-memory form would need the whole table, twice for a quantized export)."""
    report = run_json_child("tiered_export_memory_child.py", str(tmp_path))
    print(report)
    assert report["table_bytes"] == 393216 * 64 * 4
    for mode in ("none", "int8"):
        assert report[f"tiered_{mode}"] < report["table_bytes"] / 4, report
    assert report["memory_int8"] > report["table_bytes"] / 2, report  # the measure sees a whole-table copy
