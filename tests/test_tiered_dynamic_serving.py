"""The streamed serving export of tiered dynamic tables (tf_embed_ops/dynamic/streamed_serving.py through
tf_embed_ops/serving/streamed.py).

Reference: the same dynamic table trained in memory on the same batches (a tiered dynamic table trains bitwise like
it), frozen by `te.dynamic.serving.freeze` (the in-memory servable) and saved by `tf.saved_model.save`. The tiered
table's servable (`freeze_streamed`, saved by `te.serving.save_streamed`, rows written chunk by chunk) must serve
bitwise what that serves, for the trained keys, unknown keys and pruned keys; in this process and (slow tier) in an
interpreter in which `tf_embed_ops` cannot be imported, as TensorFlow Serving loads a SavedModel. The `values`
tensor of its checkpoint is checked against numpy's encoding of the in-memory table's rows (`quantization.encode`),
and a failed export (a row a mode cannot encode, a corrupted record in the tier) must leave the export path as it
was.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from tiered_support import (
    DYNAMIC_BATCHES,
    chunked_dynamic_pair,
    corrupt_every_record,
    kill_child_after_lines,
    record_bytes,
    run_json_child,
    step,
)

import tf_embed_ops as te
from tests.serving_support import serve_many_without_plugin
from tf_embed_ops.dynamic import ops as dynamic_ops
from tf_embed_ops.dynamic import serving as dynamic_serving
from tf_embed_ops.serving import quantization

_emb = tf.tpu.experimental.embedding
DIM, CACHE_ROWS, CHUNK_ROWS = 4, 8, 5
MODES = [None, "int8", "int4", "float16", "bfloat16"]
# The trained keys (21 of them), keys never seen (0, 5 is trained, 1 << 50, negative) and repeats.
TRAINED = sorted({k for batch in DYNAMIC_BATCHES for k in batch})
IDS = np.array([*TRAINED, 0, 1 << 50, -9, 999, *TRAINED[::-3]], np.int64)
_EMBEDDINGS: dict = {}


def _configs(directory, optimizer=None, storage_dtype=tf.float32, **options):
    """The same DynamicTableConfig in memory and tiered (a cache of CACHE_ROWS rows, chunks of CHUNK_ROWS rows)."""
    optimizer = optimizer or te.optimizers.Adagrad(0.1)
    return chunked_dynamic_pair(
        directory, optimizer, DIM, CACHE_ROWS, CHUNK_ROWS, storage_dtype=storage_dtype, **options
    )


def _trained(tmp_path, batches=DYNAMIC_BATCHES, **options):
    """(in-memory DynamicTable, tiered DynamicTable), trained on the same batches; their contents are equal. The
    embeddings that own them are kept in `_EMBEDDINGS` (by table) for tests that train on."""
    tables = []
    for config in _configs(tmp_path / "rows", **options):
        emb = te.TPUEmbedding({"f": _emb.FeatureConfig(config, name="f")})
        emb.build()
        for ids in batches:
            step(emb, {"f": tf.constant(ids, tf.int64)})
        tables.append((emb, emb.dynamic_tables[config]))
    (emb_m, memory), (emb_t, tiered) = tables
    _EMBEDDINGS.clear()
    _EMBEDDINGS.update({id(memory): emb_m, id(tiered): emb_t})
    a, b = memory.export(), tiered.export()
    for name in ("keys", "weights", "counts", "last_steps"):
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy(), err_msg=name)
    return memory, tiered


def _save(form, path, streamed: bool):
    """A SavedModel whose serving_default(ids) returns {"output_0": form.lookup(ids)}."""
    root = tf.Module()
    root.table = form
    root.serve = tf.function(
        lambda ids: {"output_0": form.lookup(ids)}, input_signature=[tf.TensorSpec([None], tf.int64, name="ids")]
    )
    if streamed:
        return te.serving.save_streamed(root, path, signatures={"serving_default": root.serve})
    tf.saved_model.save(root, path, signatures={"serving_default": root.serve})
    return None


def _serve_here(path, ids=IDS):
    fn = tf.saved_model.load(path).signatures["serving_default"]
    return fn(ids=tf.constant(np.asarray(ids, np.int64)))["output_0"].numpy()


def _values_in_checkpoint(path):
    """The servable's `values` tensor, read from the SavedModel's checkpoint (float16 from its int16 bits)."""
    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    (key,) = [k for k in reader.get_variable_to_shape_map() if k.startswith("table/values/")]
    values = reader.get_tensor(key)
    return values.view(np.float16) if values.dtype == np.int16 else values


def _export_pair(tmp_path, memory, tiered, mode=None, prune=None, tag=""):
    """Exports the in-memory table (freeze) and the tiered one (freeze_streamed); returns their directories."""
    dirs = {k: str(tmp_path / f"{k}{tag}") for k in ("memory", "tiered")}
    _save(dynamic_serving.freeze(memory, mode, prune), dirs["memory"], streamed=False)
    form = dynamic_serving.freeze_streamed(tiered, mode, prune)
    assert _save(form, dirs["tiered"], streamed=True) == [form]
    return dirs, form


def _expected_values(memory, mode, kept=None):
    contents = memory.export()
    weights = contents["weights"].numpy()
    if kept is not None:
        weights = weights[kept]
    return quantization.encode(np.concatenate([weights, np.zeros([1, DIM], np.float32)]), mode, "t")


@pytest.mark.parametrize("mode", [pytest.param(None, marks=pytest.mark.slow), "int8"])  # slow: every mode below
def test_the_streamed_servable_serves_what_the_frozen_in_memory_table_serves(tmp_path, mode):
    memory, tiered = _trained(tmp_path)
    stats = tiered.cache_stats()
    assert int(stats["evictions"]) > 0 and int(stats["resident_rows"]) > 0  # rows in the file and dirty in the cache
    dirs, form = _export_pair(tmp_path, memory, tiered, mode)
    after = tiered.cache_stats()
    assert int(after["resident_rows"]) == int(stats["resident_rows"])  # the export did not fill the cache
    assert int(after["misses"]) == int(stats["misses"])
    np.testing.assert_array_equal(_serve_here(dirs["tiered"]), _serve_here(dirs["memory"]))
    # Unknown keys read the default row (zeros), as from the in-memory table.
    np.testing.assert_array_equal(_serve_here(dirs["tiered"], [0, 1 << 50]), np.zeros([2, DIM], np.float32))

    # The checkpoint holds the encoded rows in key order and the default row, written as row slices.
    np.testing.assert_array_equal(_values_in_checkpoint(dirs["tiered"]), _expected_values(memory, mode))
    np.testing.assert_array_equal(_values_in_checkpoint(dirs["tiered"]), _values_in_checkpoint(dirs["memory"]))
    data = [f for f in os.listdir(os.path.join(dirs["tiered"], "variables")) if ".data-" in f]
    assert len(data) == 1 + -(-len(TRAINED) // CHUNK_ROWS) + 1  # the SavedModel's own, one per chunk, the default
    meta = form.metadata
    assert (meta["kind"], meta["rows_trained"], meta["rows_exported"], meta["quantization"]) == (
        "dynamic",
        len(TRAINED),
        len(TRAINED),
        mode or "none",
    )
    assert meta == dynamic_serving.freeze(memory, mode).metadata


def test_freeze_refuses_a_tiered_table_and_points_to_the_streamed_export(tmp_path):
    memory, tiered = _trained(tmp_path, DYNAMIC_BATCHES[:2])
    before = tiered.cache_stats()
    with pytest.raises(ValueError, match=r"DynamicTable 't' is tiered.*freeze_streamed.*save_streamed"):
        dynamic_serving.freeze(tiered)
    assert {k: int(v) for k, v in tiered.cache_stats().items() if k != "hit_rate"} == {
        k: int(v) for k, v in before.items() if k != "hit_rate"
    }
    with pytest.raises(ValueError, match=r"DynamicTable 't' is kept in memory.*te\.dynamic\.serving\.freeze"):
        dynamic_serving.freeze_streamed(memory)
    with pytest.raises(ValueError, match=r"quantization for table 't': unknown mode 'int3'"):
        dynamic_serving.freeze_streamed(tiered, "int3")


def test_an_empty_table_serves_zeros(tmp_path):
    memory, tiered = _trained(tmp_path, batches=[])
    dirs, form = _export_pair(tmp_path, memory, tiered, "int8")
    assert form.size == 0
    np.testing.assert_array_equal(_values_in_checkpoint(dirs["tiered"]), _values_in_checkpoint(dirs["memory"]))
    served = _serve_here(dirs["tiered"])
    np.testing.assert_array_equal(served, np.zeros([IDS.shape[0], DIM], np.float32))
    np.testing.assert_array_equal(served, _serve_here(dirs["memory"]))


@pytest.mark.parametrize(
    "make_prune",
    [
        # The fast tier keeps one criterion of the metadata and one of the rows' norms.
        lambda norm: te.serving.Prune(min_count=2),
        pytest.param(lambda norm: te.serving.Prune(max_age_steps=2), marks=pytest.mark.slow),
        pytest.param(lambda norm: te.serving.Prune(max_rows=6, score="count"), marks=pytest.mark.slow),
        pytest.param(lambda norm: te.serving.Prune(max_rows=7, score="recency"), marks=pytest.mark.slow),
        lambda norm: te.serving.Prune(min_l2_norm=norm),  # reads the rows once more for their norms
        pytest.param(lambda norm: te.serving.Prune(min_count=2, max_rows=4), marks=pytest.mark.slow),  # by L2 norm
    ],
    ids=["count", "age", "cap-count", "cap-recency", "l2", "count-cap-l2"],
)
def test_pruning_keeps_the_rows_the_in_memory_freeze_keeps(tmp_path, make_prune):
    memory, tiered = _trained(tmp_path)
    norms = np.linalg.norm(memory.export()["weights"].numpy(), axis=1)
    prune = make_prune(float(np.median(norms)))  # an L2 threshold that keeps about half the rows
    dirs, form = _export_pair(tmp_path, memory, tiered, "int8", prune)
    frozen = dynamic_serving.freeze(memory, "int8", prune)
    assert 0 < form.size == frozen.size < len(TRAINED)  # some rows kept, some pruned
    np.testing.assert_array_equal(form.keys.numpy(), frozen.keys.numpy())
    np.testing.assert_array_equal(_values_in_checkpoint(dirs["tiered"]), frozen.values.numpy())
    np.testing.assert_array_equal(_serve_here(dirs["tiered"]), _serve_here(dirs["memory"]))
    assert form.metadata == frozen.metadata


def _an_export_at(path):
    """A SavedModel at `path` (of another table) that a failed export must leave as it was."""
    config = te.DynamicTableConfig("other", DIM, optimizer=te.optimizers.SGD(0.1))
    table = te.dynamic.DynamicTable(config)
    table.import_(np.array([1, 2], np.int64), np.ones([2, DIM], np.float32))
    _save(dynamic_serving.freeze(table), path, streamed=False)
    return {f: os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs}


def test_a_row_the_mode_cannot_encode_writes_nothing_and_names_its_key(tmp_path):
    memory, tiered = _trained(tmp_path)
    key = TRAINED[7]
    big = np.full([1, DIM], 1e6, np.float32)  # beyond float16's range: int8 stores its scale and bias in float16
    slots = [np.zeros([1, DIM], np.float32)]
    dynamic_ops.dynamic_table_tiered_write_rows(tiered.handle, np.array([key], np.int64), big, slots)
    target = str(tmp_path / "export")
    files = _an_export_at(target)
    form = dynamic_serving.freeze_streamed(tiered, "int8")
    with pytest.raises(ValueError, match=rf"save_streamed to .*'t'.*float16's range.*key {key}, row 7 .*nothing was"):
        _save(form, target, streamed=True)
    assert {f: os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(target) for f in fs} == files
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("export")) == ["export"]  # no temporary left
    _save(dynamic_serving.freeze_streamed(tiered), str(tmp_path / "fp32"), streamed=True)
    np.testing.assert_array_equal(_serve_here(str(tmp_path / "fp32"), [key])[0], big[0])  # float32 takes it


def test_a_corrupted_record_in_the_tier_writes_nothing_and_names_the_row(tmp_path):
    memory, tiered = _trained(tmp_path)
    corrupt_every_record(str(tmp_path / "rows" / "t.rows"), record_bytes(te.optimizers.Adagrad(0.1), DIM))
    target = str(tmp_path / "export")
    files = _an_export_at(target)
    form = dynamic_serving.freeze_streamed(tiered)  # the keys are in memory: this reads no row
    with pytest.raises(
        tf.errors.DataLossError,
        match=r"save_streamed to .*export.*t\.rows.*row \d+ is corrupted.*\[key \d+ \(row \d+\)\].*nothing was",
    ):
        _save(form, target, streamed=True)
    assert {f: os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(target) for f in fs} == files
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("export")) == ["export"]
    # L2-norm pruning reads the rows when the servable is made: the same error, before anything is written.
    with pytest.raises(tf.errors.DataLossError, match=r"row \d+ is corrupted"):
        dynamic_serving.freeze_streamed(tiered, prune=te.serving.Prune(min_l2_norm=1.0))


def test_string_keyed_tables_serve_string_ids(tmp_path):
    memory, tiered = _trained(tmp_path, batches=[], key_dtype=tf.string)
    words = tf.constant(["a", "bb", "ccc", "a", "dddd", "e", "ff", "g"])
    for table in (memory, tiered):
        emb = _EMBEDDINGS[id(table)]
        for i in range(2):
            step(emb, {"f": words[i : i + 6]})
    forms = [dynamic_serving.freeze(memory), dynamic_serving.freeze_streamed(tiered)]
    dirs = [str(tmp_path / "m"), str(tmp_path / "t")]
    served = []
    for form, path, streamed in zip(forms, dirs, (False, True), strict=True):
        root = tf.Module()
        root.table = form
        root.serve = tf.function(form.lookup, input_signature=[tf.TensorSpec([None], tf.string, name="ids")])
        (te.serving.save_streamed if streamed else tf.saved_model.save)(
            root, path, signatures={"serving_default": root.serve}
        )
        fn = tf.saved_model.load(path).signatures["serving_default"]
        served.append(fn(ids=tf.constant(["a", "ccc", "zzz", "g"]))["output_0"].numpy())
    np.testing.assert_array_equal(served[1], served[0])
    assert np.any(served[0] != 0)


# ------------------------------------------------------------------------ slow: as TensorFlow Serving loads it


@pytest.mark.slow
@pytest.mark.parametrize(
    ("storage_dtype", "options"),
    [(tf.float32, {}), (tf.bfloat16, {}), (tf.float16, {"rounding": "nearest"})],
    ids=["float32", "bfloat16", "float16"],
)
def test_every_mode_serves_bitwise_in_plain_tensorflow(tmp_path, storage_dtype, options):
    memory, tiered = _trained(tmp_path, storage_dtype=storage_dtype, **options)
    dirs = []
    for mode in MODES:
        pair, _ = _export_pair(tmp_path, memory, tiered, mode, tag=f"_{mode}")
        np.testing.assert_array_equal(
            _values_in_checkpoint(pair["tiered"]), _values_in_checkpoint(pair["memory"]), err_msg=str(mode)
        )
        dirs += [pair["tiered"], pair["memory"]]
    served = serve_many_without_plugin(dirs, {"ids": tf.constant(IDS)}, cwd=str(tmp_path))
    for i, mode in enumerate(MODES):
        np.testing.assert_array_equal(served[2 * i], served[2 * i + 1], err_msg=str(mode))
        np.testing.assert_array_equal(served[2 * i], _serve_here(dirs[2 * i]), err_msg=str(mode))
    assert np.any(served[0] != 0)


@pytest.mark.slow
def test_the_streamed_export_holds_one_chunk_not_the_table(tmp_path):
    """A tiered dynamic table of 65,536 keys x 512 (128 MiB of rows) exported in chunks of 2 MiB: the exporting
    process's peak RSS grows by a small fraction of the table (the in-memory freeze reads the whole table), and the
    servable serves the rows written."""
    report = run_json_child("tiered_dynamic_serving_memory_child.py", str(tmp_path))
    print(report)
    assert report["table_bytes"] == 65536 * 512 * 4 and report["served_equal"], report
    for mode in ("none", "int8"):
        assert report[f"streamed_{mode}"] < report["table_bytes"] / 4, report
    assert report["export_whole"] > report["table_bytes"] / 2, report  # the measure sees a whole-table copy


@pytest.mark.slow
def test_a_process_killed_while_it_writes_the_rows_leaves_the_previous_export_serving(tmp_path):
    """The export is written into a temporary sibling and renamed into place: a SIGKILL in the middle of its rows
    leaves the previous export at the path, which a plain TensorFlow interpreter still serves."""
    target = str(tmp_path / "export")
    kill_child_after_lines("tiered_dynamic_serving_kill_child.py", [str(tmp_path), target], ["exported", "writing"])
    leftovers = [p for p in os.listdir(tmp_path) if p.startswith("export.tmp-")]
    assert len(leftovers) == 1  # the killed export's temporary directory, never renamed into place
    assert [f for f in os.listdir(os.path.join(tmp_path, leftovers[0], "variables")) if "tf_embed_ops_tiered" in f]
    keys = np.array([3, 10, 6996, 4], np.int64)  # three keys of the table, one unknown
    served = serve_many_without_plugin([target], {"ids": tf.constant(keys)}, cwd=str(tmp_path))[0]
    np.testing.assert_array_equal(served, np.array([[1.0] * 8] * 3 + [[0.0] * 8], np.float32))
