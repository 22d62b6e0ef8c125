"""The tiered-table ops (cc/ops/tiered_table_ops.cc) through the raw ops: rows written and read back, the fused
lookup and update bitwise equal to the in-memory table with a cache much smaller than the table, and the
refusals (bad ids, a step larger than the cache, a mismatched or corrupted row file) that change no row."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from embedding_test_util import initial_slots, make_config

import tf_embed_ops
from tf_embed_ops import embedding_ops as eo
from tf_embed_ops.dynamic.op_inputs import feature_arguments

ops = tf_embed_ops.ops
STATS = ("hits", "misses", "rows_read", "rows_written", "bytes_read", "bytes_written", "evictions", "resident",
         "capacity", "pinned")  # fmt: skip


def _record_bytes(dim, widths, dtype):
    elem = 4 if dtype == "float32" else 2
    return sum((w * elem + 3) // 4 * 4 for w in [dim, *widths]) + 4


def _handle(path, name, vocab, dim, widths, dtype, cache_rows, mode="create"):
    return ops.tf_embed_tiered_table_handle(
        table_name=name,
        path=str(path),
        num_rows=vocab,
        dim=dim,
        slot_widths=widths,
        storage_types=[dtype] * (1 + len(widths)),
        cache_bytes=cache_rows * (_record_bytes(dim, widths, dtype) + 34),
        mode=mode,
        shared_name=f"{name}@{path}",
    )


def _stats(table):
    return dict(zip(STATS, ops.tf_embed_tiered_table_stats(table).numpy().tolist(), strict=True))


def _read(table, vocab, num_slots):
    values, slots = ops.tf_embed_tiered_table_read_rows(table, 0, vocab, S=num_slots)
    return [values.numpy()] + [s.numpy() for s in slots]


def _stored(x, dtype):
    """x as the table stores it (16-bit: round to nearest), widened to float32."""
    if dtype == "float32":
        return np.asarray(x, np.float32)
    storage = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    return np.asarray(x, np.float32).astype(storage).astype(np.float32)


def _feature(ids):
    """A feature from dense ids, or one already normalized (passed through)."""
    if hasattr(ids, "sample_indices_or_row_splits"):
        return ids
    return eo.normalize_feature(tf.constant(ids, tf.int64))


def _lookup(config, tables, ids_per_feature):
    feats = [_feature(ids) for ids in ids_per_feature]
    return ops.tf_embed_tiered_embedding_activations(**feature_arguments(feats), tables=tables, config=config)


def _send(config, tables, ids_per_feature, grads, step, rounding=("stochastic",), seed=0, **kwargs):
    feats = [_feature(ids) for ids in ids_per_feature]
    ops.tf_embed_tiered_send_tpu_embedding_gradients(
        inputs=[tf.constant(g) for g in grads],
        learning_rates=[],
        **feature_arguments(feats),
        tables=tables,
        step=tf.constant(step, tf.int64),
        config=config,
        rounding=list(rounding),
        rounding_seed=seed,
        **kwargs,
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_rows_written_are_read_back_as_stored(tmp_path, dtype):
    rng = np.random.default_rng(0)
    vocab, dim = 40, 6
    table = _handle(tmp_path / "t.rows", "t", vocab, dim, [dim, 1], dtype, cache_rows=5)
    values = rng.normal(size=(vocab, dim)).astype(np.float32)
    slots = [rng.uniform(size=(vocab, dim)).astype(np.float32), rng.uniform(size=(vocab, 1)).astype(np.float32)]
    for first in range(0, vocab, 16):  # in chunks, as a restore writes them
        end = min(vocab, first + 16)
        ops.tf_embed_tiered_table_write_rows(table, first, values[first:end], [s[first:end] for s in slots])
    got = _read(table, vocab, 2)
    for g, want in zip(got, [values, *slots], strict=True):
        np.testing.assert_array_equal(g, _stored(want, dtype))
    assert _stats(table)["rows_written"] == vocab


def test_a_row_never_written_and_bad_write_shapes_are_refused(tmp_path):
    table = _handle(tmp_path / "t.rows", "t", 10, 4, [], "float32", cache_rows=3)
    with pytest.raises(tf.errors.FailedPreconditionError, match="row 0 was never written"):
        ops.tf_embed_tiered_table_read_rows(table, 0, 2, S=0)
    ops.tf_embed_tiered_table_write_rows(table, 0, np.ones((10, 4), np.float32), [])
    before = _read(table, 10, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rows \[8, 8 \+ 3\) are outside"):
        ops.tf_embed_tiered_table_write_rows(table, 8, np.zeros((3, 4), np.float32), [])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"values must be \[n, 4\]"):
        ops.tf_embed_tiered_table_write_rows(table, 0, np.zeros((3, 5), np.float32), [])
    with pytest.raises(tf.errors.InvalidArgumentError, match="has 0 slots but the op gives 1"):
        ops.tf_embed_tiered_table_write_rows(table, 0, np.zeros((3, 4), np.float32), [np.zeros((3, 4), np.float32)])
    np.testing.assert_array_equal(_read(table, 10, 0)[0], before[0])


def _in_memory_and_tiered(tmp_path, opt, dtype, vocab, dim, cache_rows, rng):
    """A table as variables (the in-memory engine) and as a tiered table, holding the same stored rows."""
    start = _stored(rng.normal(size=(vocab, dim)), dtype)
    start_slots = [_stored(s, dtype) for s in initial_slots(opt, vocab, dim, rng)]
    tf_dtype = getattr(tf, dtype)
    variables = [tf.Variable(tf.constant(x, tf_dtype)) for x in [start, *start_slots]]
    widths = [s.shape[1] for s in start_slots]
    tiered = _handle(tmp_path / "t.rows", "t", vocab, dim, widths, dtype, cache_rows)
    ops.tf_embed_tiered_table_write_rows(tiered, 0, start, start_slots)
    return variables, tiered


@pytest.mark.parametrize(
    "opt", [{"name": "adagrad"}, {"name": "adam", "use_non_lazy_adam": True}, {"name": "ftrl", "l1": 0.01}]
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_training_is_bitwise_the_in_memory_tables(tmp_path, opt, dtype):
    rng = np.random.default_rng(1)
    vocab, dim, batch = 64, 4, 12
    config = make_config(
        [{"name": "t", "vocab": vocab, "dim": dim, "opt": opt, "lr": 0.1}], [("a", 0, [batch]), ("b", 0, [batch])]
    ).SerializeToString()
    variables, tiered = _in_memory_and_tiered(tmp_path, opt, dtype, vocab, dim, cache_rows=24, rng=rng)
    for step in range(5):
        ids = [np.minimum(vocab - 1, (vocab * rng.uniform(size=batch) ** 3).astype(np.int64)) for _ in range(2)]
        grads = [rng.normal(size=(batch, dim)).astype(np.float32) for _ in range(2)]
        want = eo.embedding_activations([_feature(i) for i in ids], [variables[0]], config)
        got = _lookup(config, [tiered], ids)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.numpy(), w.numpy())
        eo.send_tpu_embedding_gradients(
            grads, [], [_feature(i) for i in ids], [variables[0]], [variables[1:]], config, rounding_step=step
        )
        _send(config, [tiered], ids, grads, step)
    for got, want in zip(_read(tiered, vocab, len(variables) - 1), variables, strict=True):
        np.testing.assert_array_equal(got, tf.cast(want, tf.float32).numpy())
    stats = _stats(tiered)
    assert stats["capacity"] == 24 and stats["pinned"] == 0
    assert stats["evictions"] > 0  # the steps' rows did not fit in the cache together
    # After a flush the file alone holds the table: a new handle on it reads the same rows.
    ops.tf_embed_tiered_table_flush(tiered)
    widths = [v.shape[1] for v in variables[1:]]
    reopened = _handle(tmp_path / "t.rows", "t2", vocab, dim, widths, dtype, cache_rows=3, mode="open")
    for got, want in zip(_read(reopened, vocab, len(widths)), variables, strict=True):
        np.testing.assert_array_equal(got, tf.cast(want, tf.float32).numpy())


def test_ragged_and_empty_batches_train_bitwise_as_in_memory(tmp_path):
    # Samples with repeated ids, empty samples, a feature without any id, a step without any id: the lookup and
    # the update address the pinned records by each id's position among the step's distinct rows.
    rng = np.random.default_rng(5)
    vocab, dim, batch = 40, 4, 6
    opt = {"name": "adagrad"}
    config = make_config(
        [{"name": "t", "vocab": vocab, "dim": dim, "opt": opt, "lr": 0.1}], [("a", 0, [batch]), ("b", 0, [batch])]
    ).SerializeToString()
    variables, tiered = _in_memory_and_tiered(tmp_path, opt, "float32", vocab, dim, cache_rows=24, rng=rng)
    empty = [[] for _ in range(batch)]
    steps = [
        [[[3, 3, 7], [], [39, 0], [], [5], [3]], empty],
        [empty, empty],
        [[[1, 2, 3, 4], [5, 6, 7, 8], [9], [10, 11], [12], [13, 14, 15]], [[16], [17], [18], [19], [20], [3, 3]]],
        [[[39], [39], [0], [0], [39], [0]], [[39, 0], [], [], [], [], [0]]],
    ]
    for step, ids in enumerate(steps):
        feats = [eo.normalize_feature(tf.ragged.constant(i, dtype=tf.int64, ragged_rank=1)) for i in ids]
        grads = [rng.normal(size=(batch, dim)).astype(np.float32) for _ in range(2)]
        want = eo.embedding_activations(feats, [variables[0]], config)
        for got, w in zip(_lookup(config, [tiered], feats), want, strict=True):
            np.testing.assert_array_equal(got.numpy(), w.numpy())
        eo.send_tpu_embedding_gradients(grads, [], feats, [variables[0]], [variables[1:]], config, rounding_step=step)
        _send(config, [tiered], feats, grads, step)
    for got, want in zip(_read(tiered, vocab, len(variables) - 1), variables, strict=True):
        np.testing.assert_array_equal(got, want.numpy())
    assert _stats(tiered)["pinned"] == 0


def test_refused_steps_change_no_row_and_no_counter(tmp_path):
    rng = np.random.default_rng(2)
    vocab, dim = 50, 3
    opt = {"name": "adagrad"}
    config = make_config(
        [{"name": "t", "vocab": vocab, "dim": dim, "opt": opt, "lr": 0.1}], [("f", 0, [6])]
    ).SerializeToString()
    _, tiered = _in_memory_and_tiered(tmp_path, opt, "float32", vocab, dim, cache_rows=4, rng=rng)
    _send(config, [tiered], [[1, 2, 2, 3, 1, 1]], [np.ones((6, dim), np.float32)], 0)
    rows, stats = _read(tiered, vocab, 1), _stats(tiered)
    grads = [np.ones((6, dim), np.float32)]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids\[3\] = 50 is not in \[0, 50\).*table 't'"):
        _send(config, [tiered], [[1, 2, 3, 50, 1, 1]], grads, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="needs 5 distinct rows resident at once"):
        _send(config, [tiered], [[1, 2, 3, 4, 5, 5]], grads, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="lookup of table 't': needs 5 distinct rows"):
        _lookup(config, [tiered], [[1, 2, 3, 4, 5, 5]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids\[3\] = -1 is not in"):
        _lookup(config, [tiered], [[1, 2, 3, -1, 1, 1]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
        ops.tf_embed_tiered_table_prefetch(tiered, tf.constant([[3, 50]], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="gradient"):
        _send(config, [tiered], [[1, 2, 3, 3, 1, 1]], [np.ones((5, dim), np.float32)], 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="check_numerics: table 't', row 1"):
        bad = [np.full((6, dim), 3e38, np.float32)]
        _send(config, [tiered], [[1, 1, 1, 1, 1, 1]], bad, 1, check_numerics=True)
    # The rounding ids are checked as the in-memory op checks them (one helper, cc/lib/rounding_table_ids.h).
    for ids, pattern in (([0, 1], r"rounding_table_ids has 2 entries"), ([-1], r"rounding_table_ids\[0\] is -1")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
            _send(config, [tiered], [[1, 2, 2, 3, 1, 1]], grads, 1, rounding_table_ids=ids)
    # Only the numerics dry run reached the cache: its one row was a hit.  Nothing was read, written or evicted.
    after = _stats(tiered)
    assert after == {**stats, "hits": stats["hits"] + 1}
    for got, want in zip(_read(tiered, vocab, 1), rows, strict=True):
        np.testing.assert_array_equal(got, want)


def test_prefetch_makes_the_next_step_hit(tmp_path):
    rng = np.random.default_rng(3)
    vocab, dim = 80, 2
    opt = {"name": "sgd"}
    config = make_config([{"name": "t", "vocab": vocab, "dim": dim, "opt": opt}], [("f", 0, [4])]).SerializeToString()
    _, tiered = _in_memory_and_tiered(tmp_path, opt, "float32", vocab, dim, cache_rows=8, rng=rng)
    ops.tf_embed_tiered_table_prefetch(tiered, tf.constant([10, 11, 12, 13, 13], tf.int64))
    before = _stats(tiered)
    assert before["rows_read"] == 4 and before["misses"] == 0 and before["resident"] == 4
    _lookup(config, [tiered], [[13, 12, 11, 10]])
    after = _stats(tiered)
    assert after["hits"] - before["hits"] == 4 and after["misses"] == before["misses"]
    assert after["rows_read"] == before["rows_read"]


def test_the_row_file_is_checked_when_opened_and_read(tmp_path):
    path = tmp_path / "t.rows"
    table = _handle(path, "t", 20, 4, [4], "float32", cache_rows=2)
    ops.tf_embed_tiered_table_write_rows(table, 0, np.ones((20, 4), np.float32), [np.ones((20, 4), np.float32)])
    ops.tf_embed_tiered_table_flush(table)
    with pytest.raises(tf.errors.AlreadyExistsError, match="already exists"):
        _handle(path, "again", 20, 4, [4], "float32", cache_rows=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_rows is 20 but the table has 21"):
        _handle(path, "other", 21, 4, [4], "float32", cache_rows=2, mode="open")
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="buffer 0 storage type is float32 but the table has bfloat16"
    ):
        _handle(path, "other16", 20, 4, [4], "bfloat16", cache_rows=2, mode="open")
    # A flipped byte in row 7's record: reading it names the row and the file; the other rows still read.
    record = _record_bytes(4, [4], "float32")
    with open(path, "r+b") as f:
        f.seek(4096 + 7 * record + 5)
        byte = f.read(1)
        f.seek(4096 + 7 * record + 5)
        f.write(bytes([byte[0] ^ 0xFF]))
    reopened = _handle(path, "reopened", 20, 4, [4], "float32", cache_rows=2, mode="open")
    with pytest.raises(tf.errors.DataLossError, match="row 7 is corrupted") as error:
        ops.tf_embed_tiered_table_read_rows(reopened, 0, 20, S=1)
    assert os.fspath(path) in str(error.value)
    np.testing.assert_array_equal(ops.tf_embed_tiered_table_read_rows(reopened, 8, 12, S=1)[0].numpy(), 1.0)
    # A prefetch reads on the cache's thread: its op returns, the batch with the corrupted row is not made resident,
    # and the table's next prefetch reports the error, once.
    before = _stats(reopened)
    ops.tf_embed_tiered_table_prefetch(reopened, tf.constant([9, 7, 9], tf.int64))
    assert _stats(reopened) == before  # (the counters wait for the prefetch)
    with pytest.raises(tf.errors.DataLossError, match="an earlier prefetch failed: .*row 7 is corrupted"):
        ops.tf_embed_tiered_table_prefetch(reopened, tf.constant([9], tf.int64))
    ops.tf_embed_tiered_table_prefetch(reopened, tf.constant([9], tf.int64))
    after = _stats(reopened)
    assert after["resident"] == before["resident"] + 1 and after["rows_read"] == before["rows_read"] + 1


def test_handle_attrs_are_validated(tmp_path):
    with pytest.raises(tf.errors.InvalidArgumentError, match="holds no row"):
        ops.tf_embed_tiered_table_handle(
            table_name="t", path=str(tmp_path / "a"), num_rows=5, dim=4, storage_types=["float32"],
            cache_bytes=10, mode="create",
        )  # fmt: skip
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"storage_types\[1\] is 'int8'"):
        ops.tf_embed_tiered_table_handle(
            table_name="t", path=str(tmp_path / "b"), num_rows=5, dim=4, storage_types=["float32", "int8"],
            cache_bytes=10000, mode="create",
        )  # fmt: skip
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


def test_read_rows_shape_function():
    seen = {}

    @tf.function(input_signature=[tf.TensorSpec([], tf.resource), tf.TensorSpec([], tf.int64)])
    def trace(table, first):
        values, slots = ops.tf_embed_tiered_table_read_rows(table, first, 7, S=1)
        seen["shapes"] = (values.shape.as_list(), slots[0].shape.as_list())
        return 0

    trace.get_concrete_function()
    assert seen["shapes"] == ([7, None], [7, None])
