"""Tiered tables (`te.TableConfig(storage=te.Tiered(...))`) trained by `te.TPUEmbedding`.

The reference is the same table kept in memory: the same initial rows and the same batches, in its own
`te.TPUEmbedding`, must give bitwise the same activations, rows and slots, for every optimizer of the schema, in
float32 and in bfloat16 (stochastic rounding), with a cache of a tenth of the rows (so rows are evicted, written
back and read again). The in-memory path itself is checked against numpy and TensorFlow elsewhere.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from tiered_support import (
    assert_same_state,
    cache_bytes_for,
    embedding,
    make_optimizer,
    memory_state,
    schemas,
    step,
    table_pair,
    tiered_state,
)

import tf_embed_ops as te

_emb = tf.tpu.experimental.embedding
V, DIM, CACHE_ROWS = 80, 4, 8
# Four batches of at most CACHE_ROWS distinct ids (duplicates inside a batch, rows shared across batches, the
# first and last row), spread over the table so rows are evicted and read back.
BATCHES = [[0, 5, 5, 79, 40, 12], [12, 13, 40, 41, 0, 66], [70, 71, 72, 5, 79, 79, 3], [5, 12, 40, 79, 0, 33]]


def _train_pair(tmp_path, optimizer, batches=BATCHES, **options):
    memory, tiered = table_pair(tmp_path, optimizer, V, DIM, CACHE_ROWS, **options)
    emb_m, emb_t = embedding(memory), embedding(tiered)
    for ids in batches:
        ids = tf.constant(ids, tf.int64)
        acts_m, acts_t = step(emb_m, {"f": ids}), step(emb_t, {"f": ids})
        np.testing.assert_array_equal(acts_t["f"].numpy(), acts_m["f"].numpy())
    return emb_m, emb_t, memory, tiered


@pytest.mark.parametrize("storage_dtype", [tf.float32, tf.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("schema", schemas(), ids=lambda s: s.kind)
def test_every_optimizer_trains_bitwise_as_in_memory(tmp_path, schema, storage_dtype):
    emb_m, emb_t, memory, tiered = _train_pair(tmp_path, make_optimizer(schema), storage_dtype=storage_dtype)
    assert_same_state(tiered_state(emb_t, tiered), memory_state(emb_m, memory))
    stats = emb_t.tiered_tables[tiered].stats()
    assert int(stats["capacity_rows"]) == CACHE_ROWS
    assert int(stats["evictions"]) > 0  # 20 distinct rows through an 8-row cache: rows were written back
    assert os.path.exists(os.path.join(str(tmp_path), "t.rows"))


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: te.optimizers.Adam(0.05, lazy_adam=False),  # updates every row: the table in cache-sized windows
        lambda: te.optimizers.Adagrad(0.1, initial_accumulator_value=0.2, clipvalue=0.5, weight_decay_factor=0.01),
        lambda: te.optimizers.RowWiseAdagrad(0.1),  # a per-row slot
    ],
    ids=["adam_non_lazy", "adagrad_clipped_decay", "rowwise_adagrad"],
)
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"storage_dtype": tf.float16, "rounding": "nearest"},
        {"storage_dtype": tf.bfloat16, "slot_storage_dtype": tf.float32},
    ],
    ids=["fp32", "fp16_nearest", "bf16_fp32_slots"],
)
def test_option_variants_train_bitwise_as_in_memory(tmp_path, optimizer, options):
    emb_m, emb_t, memory, tiered = _train_pair(tmp_path, optimizer(), **options)
    assert_same_state(tiered_state(emb_t, tiered), memory_state(emb_m, memory))


def _inputs(kind, rng):
    if kind == "ragged":
        lengths = rng.integers(0, 3, size=3)
        values = rng.integers(0, V, size=int(lengths.sum()))
        ids = tf.RaggedTensor.from_row_lengths(tf.constant(values, tf.int64), lengths)
        weights = tf.RaggedTensor.from_row_lengths(tf.constant(rng.uniform(0.5, 2, values.size), tf.float32), lengths)
        return ids, weights
    dense = rng.integers(-1, V, size=[3, 2])
    idx = np.argwhere(dense >= 0)
    ids = tf.SparseTensor(idx, tf.constant(dense[dense >= 0], tf.int64), [3, 2])
    weights = tf.SparseTensor(idx, tf.constant(rng.uniform(0.5, 2, len(idx)), tf.float32), [3, 2])
    return ids, weights


@pytest.mark.parametrize(("kind", "combiner"), [("ragged", "mean"), ("sparse", "sqrtn")])
def test_weighted_inputs_in_a_function_with_prefetch(tmp_path, kind, combiner):
    """A `tf.function` step that prefetches the next batch, with weighted ragged/sparse inputs."""
    memory, tiered = table_pair(tmp_path, te.optimizers.Adagrad(0.1), V, DIM, CACHE_ROWS, combiner=combiner)
    emb_m, emb_t = embedding(memory), embedding(tiered)

    def make_step(emb):
        @tf.function(reduce_retracing=True)  # ragged batches of other lengths: one trace
        def run(ids, weights, next_ids):
            emb.prefetch({"f": next_ids})
            return step(emb, {"f": ids}, {"f": weights})["f"]

        return run

    run_m, run_t = make_step(emb_m), make_step(emb_t)
    rng = np.random.default_rng(3)
    batches = [_inputs(kind, rng) for _ in range(4)]
    for (ids, weights), (next_ids, _) in zip(batches, batches[1:] + batches[:1], strict=True):
        np.testing.assert_array_equal(run_t(ids, weights, next_ids).numpy(), run_m(ids, weights, next_ids).numpy())
    assert_same_state(tiered_state(emb_t, tiered), memory_state(emb_m, memory))


def test_prefetched_rows_hit_the_cache(tmp_path):
    """Rows prefetched before a step are read by the prefetch (rows_read), and the step then misses none."""
    _, tiered = table_pair(tmp_path, te.optimizers.SGD(0.1), V, DIM, CACHE_ROWS)
    emb = embedding(tiered)
    table = emb.tiered_tables[tiered]
    ids = tf.constant([3, 9, 9, 27], tf.int64)
    before = {k: int(v) for k, v in table.stats().items() if k != "hit_rate"}
    emb.prefetch({"f": ids})
    after_prefetch = {k: int(v) for k, v in table.stats().items() if k != "hit_rate"}
    assert after_prefetch["rows_read"] - before["rows_read"] == 3
    assert after_prefetch["misses"] == before["misses"]
    step(emb, {"f": ids})
    after = table.stats()
    assert int(after["misses"]) == before["misses"]  # every row of the lookup and the update was resident
    assert int(after["hits"]) - before["hits"] > 0


def test_a_mixed_embedding_trains_each_kind_as_in_memory(tmp_path):
    """Static, tiered and dynamic tables in one `te.TPUEmbedding`: the tiered table trains as the same table does
    in memory at the same place (its position in the table order keys its stochastic rounding)."""
    opt = te.optimizers.Adagrad(0.1)
    rows = np.random.default_rng(1).normal(size=(V, DIM)).astype(np.float32)
    cache = cache_bytes_for(CACHE_ROWS, opt, DIM, tf.bfloat16)

    def features(storage):
        static = te.TableConfig(V, DIM, name="s", optimizer=opt, initializer=tf.constant_initializer(rows))
        middle = te.TableConfig(
            V,
            DIM,
            name="m",
            optimizer=opt,
            storage_dtype=tf.bfloat16,
            initializer=tf.constant_initializer(rows),
            storage=storage,
        )
        dynamic = te.DynamicTableConfig("d", DIM, optimizer=opt)
        return {
            "a": _emb.FeatureConfig(static),
            "b": _emb.FeatureConfig(middle),
            "c": _emb.FeatureConfig(dynamic),
            "e": _emb.FeatureConfig(middle),
        }

    emb_m = te.TPUEmbedding(features(None))
    emb_t = te.TPUEmbedding(features(te.Tiered(cache_bytes=cache, directory=str(tmp_path))))
    for ids in BATCHES:
        batch = {k: tf.constant(ids[: 3 + i], tf.int64) for i, k in enumerate("abce")}
        acts_m, acts_t = step(emb_m, batch), step(emb_t, batch)
        for k in "abce":
            np.testing.assert_array_equal(acts_t[k].numpy(), acts_m[k].numpy(), err_msg=k)
    (middle_m,) = [t for t in emb_m.embedding_tables if t.name == "m"]
    (middle_t,) = emb_t.tiered_tables
    assert_same_state(emb_t.tiered_tables[middle_t].read_all(), memory_state(emb_m, middle_m))
    assert [t.name for t in emb_t.embedding_tables] == ["s"]


def _snapshot(emb, table):
    return tiered_state(emb, table)


def test_an_id_out_of_range_is_refused_and_changes_nothing(tmp_path):
    memory, tiered = table_pair(tmp_path, te.optimizers.Adagrad(0.1), V, DIM, CACHE_ROWS)
    static = te.TableConfig(V, DIM, name="s", optimizer=te.optimizers.SGD(0.1))
    emb = te.TPUEmbedding({"f": _emb.FeatureConfig(tiered), "g": _emb.FeatureConfig(static)})
    emb.build()
    step(emb, {"f": tf.constant([1, 2], tf.int64), "g": tf.constant([1], tf.int64)})
    before, static_before = _snapshot(emb, tiered), emb.embedding_tables[static].numpy()
    for bad in (V, -1):
        with pytest.raises(tf.errors.InvalidArgumentError, match="'t'"):
            step(emb, {"f": tf.constant([3, bad], tf.int64), "g": tf.constant([1], tf.int64)})
        assert_same_state(_snapshot(emb, tiered), before)
        np.testing.assert_array_equal(emb.embedding_tables[static].numpy(), static_before)
    del memory


def test_a_step_with_more_distinct_rows_than_the_cache_holds_is_refused(tmp_path):
    _, tiered = table_pair(tmp_path, te.optimizers.Adagrad(0.1), V, DIM, CACHE_ROWS)
    emb = embedding(tiered)
    step(emb, {"f": tf.constant([1, 2], tf.int64)})
    before = _snapshot(emb, tiered)
    too_many = tf.constant(list(range(CACHE_ROWS + 1)), tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'t'[\s\S]*cache_bytes"):
        step(emb, {"f": too_many})
    assert_same_state(_snapshot(emb, tiered), before)
    step(emb, {"f": too_many[:CACHE_ROWS]})  # a step that fits still trains


def test_stats_count_the_rows_of_lookups_and_updates(tmp_path):
    """From the counters' definitions: a fresh cache misses each distinct row of the first lookup once (one read
    each), the update of the same step finds them resident; a repeated batch hits everywhere."""
    opt = te.optimizers.Adagrad(0.1)
    _, tiered = table_pair(tmp_path, opt, V, DIM, CACHE_ROWS)
    emb = embedding(tiered)
    table = emb.tiered_tables[tiered]
    record = DIM * 4 * 2 + 4  # row + accumulator in float32, and the CRC
    start = {k: int(v) for k, v in table.stats().items() if k != "hit_rate"}
    assert start["resident_rows"] == 0 and start["capacity_rows"] == CACHE_ROWS and start["pinned_rows"] == 0
    ids = tf.constant([4, 7, 7, 30], tf.int64)
    step(emb, {"f": ids})
    s = {k: int(v) for k, v in table.stats().items() if k != "hit_rate"}
    assert s["misses"] - start["misses"] == 3
    assert s["rows_read"] - start["rows_read"] == 3
    assert s["bytes_read"] - start["bytes_read"] == 3 * record
    assert s["hits"] - start["hits"] == 3  # the update's rows
    assert s["resident_rows"] == 3 and s["pinned_rows"] == 0
    step(emb, {"f": ids})
    s2 = table.stats()
    assert int(s2["misses"]) == s["misses"] and int(s2["hits"]) == s["hits"] + 6
    hits, misses = int(s2["hits"]), int(s2["misses"])
    assert float(s2["hit_rate"]) == pytest.approx(hits / (hits + misses))
    table.flush()
    flushed = table.stats()
    assert int(flushed["rows_written"]) - start["rows_written"] == 3  # the three dirty rows, once
    assert int(flushed["bytes_written"]) - start["bytes_written"] == 3 * record


def test_summaries_report_per_step_deltas(tmp_path):
    _, tiered = table_pair(tmp_path / "rows", te.optimizers.SGD(0.1), V, DIM, CACHE_ROWS)
    emb = embedding(tiered)
    table = emb.tiered_tables[tiered]
    writer = tf.summary.create_file_writer(str(tmp_path / "logs"))
    ids = tf.constant([4, 7, 30], tf.int64)
    with writer.as_default():
        table.write_summaries(step=0)
        step(emb, {"f": ids})
        table.write_summaries(step=1)
        step(emb, {"f": ids})
        table.write_summaries(step=2)
    writer.flush()
    seen = {}
    for path in tf.io.gfile.glob(str(tmp_path / "logs" / "*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                seen[(value.tag, event.step)] = float(tf.make_ndarray(value.tensor))
    prefix = "tiered_tables/t"
    assert seen[(f"{prefix}/misses", 1)] == 3 and seen[(f"{prefix}/misses", 2)] == 0
    assert seen[(f"{prefix}/hits", 1)] == 3 and seen[(f"{prefix}/hits", 2)] == 6
    assert seen[(f"{prefix}/hit_rate", 1)] == pytest.approx(0.5) and seen[(f"{prefix}/hit_rate", 2)] == 1.0
    assert seen[(f"{prefix}/hit_rate_total", 2)] == pytest.approx(9 / 12)
    assert seen[(f"{prefix}/resident_rows", 2)] == 3 and seen[(f"{prefix}/capacity_rows", 2)] == CACHE_ROWS


# ------------------------------------------------------------------------------------------ the table object


def _tiered_config(tmp_path, vocab=V, **kwargs):
    storage = kwargs.pop("storage", None) or te.Tiered(cache_bytes=1 << 16, directory=str(tmp_path))
    return te.TableConfig(vocab, DIM, name=kwargs.pop("name", "t"), storage=storage, **kwargs)


def test_initialisation_in_chunks(tmp_path):
    """A table of several chunks: the seeded initializer draws each chunk from (seed, first row), so the values
    are reproducible, differ between chunks, and follow the distribution; the slots start at their value."""
    storage = te.Tiered(cache_bytes=1 << 16, directory=str(tmp_path), chunk_bytes=10 * DIM * 4 * 2)
    init = tf.random_uniform_initializer(-1.0, 1.0, seed=11)
    config = _tiered_config(
        tmp_path, vocab=95, storage=storage, initializer=init, optimizer=te.optimizers.Adagrad(0.1, 0.25)
    )
    table = te.tiered.TieredTable(config)
    assert table.chunk_rows == 10 and len(table.chunks()) == 10 and table.chunks()[-1] == (90, 5)
    values, slots = table.read_all()
    assert values.shape == (95, DIM) and np.all(np.abs(values) <= 1.0)
    assert not np.array_equal(values[:10], values[10:20])
    np.testing.assert_array_equal(slots["accumulators"], np.full((95, DIM), 0.25, np.float32))
    again = te.tiered.TieredTable(
        _tiered_config(
            tmp_path, vocab=95, storage=storage, initializer=init, optimizer=te.optimizers.Adagrad(0.1), name="u"
        )
    )
    np.testing.assert_array_equal(again.read_all()[0], values)


def test_a_one_chunk_table_gets_the_whole_table_draw(tmp_path):
    init = tf.random_normal_initializer(0.0, 1.0, seed=4)
    table = te.tiered.TieredTable(_tiered_config(tmp_path, initializer=init))
    np.testing.assert_array_equal(table.read_all()[0], init((V, DIM), dtype=tf.float32).numpy())


def test_write_and_read_rows_round_trip_and_refuse_bad_rows(tmp_path):
    table = te.tiered.TieredTable(_tiered_config(tmp_path, optimizer=te.optimizers.Adam(0.1)))
    rng = np.random.default_rng(0)
    values = rng.normal(size=(3, DIM)).astype(np.float32)
    slots = {"momenta": rng.normal(size=(3, DIM)).astype(np.float32), "velocities": np.ones((3, DIM), np.float32)}
    table.write_rows(V - 3, values, slots)
    got, got_slots = table.read_rows(V - 3, 3)
    np.testing.assert_array_equal(got.numpy(), values)
    for name in slots:
        np.testing.assert_array_equal(got_slots[name].numpy(), slots[name])
    before = table.read_all()
    with pytest.raises(tf.errors.InvalidArgumentError, match="'t'"):
        table.write_rows(V - 2, values, slots)  # one row past the end
    with pytest.raises(ValueError, match="slots"):
        table.write_rows(0, values, {"momenta": slots["momenta"]})
    assert_same_state(table.read_all(), before)


def test_every_row_error_names_the_table(tmp_path):
    """Negative or non-scalar row arguments (refused in Python, or by the op for a tensor of unknown rank) name
    the table, and change nothing."""
    table = te.tiered.TieredTable(_tiered_config(tmp_path, name="clicks"))
    before = table.read_all()
    one = np.ones((1, DIM), np.float32)
    calls = [
        (lambda: table.write_rows(-1, one), ValueError, r"tiered table 'clicks': first_row: must be in \[0, .*got -1"),
        (lambda: table.read_rows(0, -1), ValueError, r"tiered table 'clicks': num_rows: must be in \[0, .*got -1"),
        (lambda: table.read_rows(-3, 1), ValueError, r"tiered table 'clicks': first_row"),
        (lambda: table.read_rows([0, 1], 1), ValueError, r"tiered table 'clicks': first_row: must be a scalar"),
        (lambda: table.write_rows(0.5, one), ValueError, r"tiered table 'clicks': first_row: must be an integer"),
        (lambda: table.gather_rows([0.5]), ValueError, r"tiered table 'clicks': rows: must be integers"),
        (lambda: table.gather_rows([[0]]), ValueError, r"tiered table 'clicks': rows: must be a vector"),
    ]
    for call, error, match in calls:
        with pytest.raises(error, match=match):
            call()

    @tf.function(input_signature=[tf.TensorSpec(None, tf.int64)])
    def read_from(first):
        return table.read_rows(first, 1)[0]

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tiered table 'clicks': first_row must be a scalar"):
        read_from(tf.constant([0, 1], tf.int64))
    assert_same_state(table.read_all(), before)


def test_the_row_file_modes(tmp_path):
    config = _tiered_config(tmp_path)
    table = te.tiered.TieredTable(config)
    table.write_rows(0, np.full((1, DIM), 7.0, np.float32))
    table.flush()
    with pytest.raises(ValueError, match=r"'t'.*already exists"):
        te.tiered.TieredTable(config)
    opened = te.tiered.TieredTable(
        _tiered_config(tmp_path, storage=te.Tiered(cache_bytes=1 << 16, directory=str(tmp_path), mode="open"))
    )
    np.testing.assert_array_equal(opened.read_rows(0, 1)[0].numpy(), np.full((1, DIM), 7.0, np.float32))
    replaced = te.tiered.TieredTable(
        _tiered_config(
            tmp_path,
            storage=te.Tiered(cache_bytes=1 << 16, directory=str(tmp_path), mode="overwrite"),
            initializer=tf.zeros_initializer(),
        )
    )
    np.testing.assert_array_equal(replaced.read_rows(0, 1)[0].numpy(), np.zeros((1, DIM), np.float32))
    with pytest.raises(ValueError, match="does not exist"):
        te.tiered.TieredTable(
            _tiered_config(tmp_path, storage=te.Tiered(cache_bytes=1 << 16, directory=str(tmp_path / "e"), mode="open"))
        )


# ------------------------------------------------------------------------------------------ configuration


def test_tiered_option_checks():
    with pytest.raises(ValueError, match="cache_bytes"):
        te.Tiered(cache_bytes=0, directory="/tmp/x")
    with pytest.raises(ValueError, match="directory"):
        te.Tiered(cache_bytes=1, directory="")
    with pytest.raises(ValueError, match="mode"):
        te.Tiered(cache_bytes=1, directory="/tmp/x", mode="append")
    with pytest.raises(ValueError, match=r"'t'.*storage"):
        te.TableConfig(10, 4, name="t", storage="disk")
    # Dynamic tables take te.Tiered (test_tiered_dynamic.py) but cannot reopen a row file.
    with pytest.raises(ValueError, match=r"'u'.*mode='open'"):
        te.DynamicTableConfig("u", 4, storage=te.Tiered(cache_bytes=1, directory="/tmp/x", mode="open"))
    assert te.TableConfig(10, 4, name="t").storage is None


def test_tpu_embedding_v2_creates_the_row_file_when_built(tmp_path):
    # TPUEmbeddingV2 trains static tiered tables (tests/test_tiered_v2.py); the sharded classes refuse them
    # (tests/test_tiered_serving.py). The row file is made by build, not by the constructor.
    table = _tiered_config(tmp_path, name="big")
    features = {"f": _emb.FeatureConfig(table, output_shape=[4])}
    emb = te.TPUEmbeddingV2(features, te.optimizers.SGD(0.1))
    assert not os.path.exists(os.path.join(str(tmp_path), "big.rows"))
    emb.build()
    assert os.path.exists(os.path.join(str(tmp_path), "big.rows"))
    assert [t.name for t in emb.tiered_tables] == ["big"]


def test_the_storage_option_survives_a_saved_config(tmp_path):
    import json  # pylint: disable=import-outside-toplevel

    from tf_embed_ops.keras import serialization  # pylint: disable=import-outside-toplevel

    storage = te.Tiered(cache_bytes=12345, directory=str(tmp_path), mode="open", chunk_bytes=999)
    table = te.TableConfig(10, 4, name="t", storage=storage, storage_dtype=tf.bfloat16)
    rebuilt = serialization.table_from_dict(json.loads(json.dumps(serialization.table_to_dict(table))))
    assert isinstance(rebuilt.storage, te.Tiered)
    assert rebuilt.storage.get_config() == {
        "cache_bytes": 12345,
        "directory": str(tmp_path),
        "mode": "open",
        "chunk_bytes": 999,
    }
    assert rebuilt.storage_dtype == tf.bfloat16
