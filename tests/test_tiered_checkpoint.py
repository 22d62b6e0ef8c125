"""Streaming checkpoints of tiered tables: `tf.train.Checkpoint` of a `te.TPUEmbedding` with a tiered table.

References: the state the table had when it was saved (read back bitwise), the checkpoint's own keys (read with
TensorFlow's checkpoint reader, independently of the saver), and the in-memory twin of the table trained on the
same batches (a restored run must continue exactly as an uninterrupted one).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tiered_support import (
    assert_same_state,
    embedding,
    memory_state,
    step,
    table_pair,
    tiered_state,
)

import tf_embed_ops as te

V, DIM, CACHE_ROWS = 80, 4, 8
BATCHES = [[0, 5, 5, 79, 40, 12], [12, 13, 40, 41, 0, 66], [70, 71, 72, 5, 79, 79, 3], [5, 12, 40, 79, 0, 33]]


def _ids(i):
    return {"f": tf.constant(BATCHES[i % len(BATCHES)], tf.int64)}


def _tiered(tmp_path, sub, optimizer, chunk_bytes=None, **options):
    _, tiered = table_pair(tmp_path / sub, optimizer, V, DIM, CACHE_ROWS, **options)
    if chunk_bytes is not None:
        config = tiered.storage.get_config()
        tiered.storage = te.Tiered(**{**config, "chunk_bytes": chunk_bytes})
    return tiered


@pytest.mark.parametrize(
    "storage_dtype",
    [tf.float32, tf.bfloat16],
    ids=["fp32", "bf16"],
)
def test_save_and_restore_bitwise_and_continue_as_uninterrupted(tmp_path, storage_dtype):
    opt = te.optimizers.Adam(0.05)
    # Chunks of 7 rows: 12 chunks, the last one short.
    chunk = 7 * (DIM * 4 * 3)
    table = _tiered(tmp_path, "a", opt, chunk, storage_dtype=storage_dtype)
    emb = embedding(table)
    for i in range(2):
        step(emb, _ids(i))
    saved = tiered_state(emb, table)
    path = tf.train.Checkpoint(embedding=emb).write(str(tmp_path / "ckpt" / "c"))

    names = dict(tf.train.list_variables(path))
    assert names["embedding/t/manifest"] == [5 + 2]
    assert [k for k in names if k.startswith("embedding/t/part-")] and len(
        [k for k in names if k.startswith("embedding/t/part-")]
    ) == 12
    reader = tf.train.load_checkpoint(path)
    assert reader.get_variable_to_dtype_map()["embedding/t/part-0"] == storage_dtype
    np.testing.assert_array_equal(reader.get_tensor("embedding/t/part-11").astype(np.float32), saved[0][77:])
    np.testing.assert_array_equal(
        reader.get_tensor("embedding/t/momenta/part-1").astype(np.float32), saved[1]["momenta"][7:14]
    )
    assert int(reader.get_tensor("embedding/t/step")) == 2

    # The same object: train on, restore, and the state is the saved one again.
    step(emb, _ids(2))
    tf.train.Checkpoint(embedding=emb).read(path).assert_consumed()
    assert_same_state(tiered_state(emb, table), saved)

    # A new process's view: a new object over a new row file, restored, continues as the uninterrupted run.
    other_table = _tiered(tmp_path, "b", opt, storage_dtype=storage_dtype)
    other = embedding(other_table)
    tf.train.Checkpoint(embedding=other).read(path).assert_consumed()
    assert int(other.tiered_tables[other_table].step.numpy()) == 2
    for i in range(2, 5):
        acts, other_acts = step(emb, _ids(i)), step(other, _ids(i))
        np.testing.assert_array_equal(other_acts["f"].numpy(), acts["f"].numpy())
    assert_same_state(tiered_state(other, other_table), tiered_state(emb, table))


@pytest.mark.parametrize("storage_dtype", [tf.float32, tf.bfloat16], ids=["fp32", "bf16"])
def test_restore_from_a_checkpoint_of_the_table_in_memory(tmp_path, storage_dtype):
    """The in-memory table's checkpoint (its `<table>` and `<table>/<slot>` variables and the `rounding_step`) is
    read into the tiered table as row slices; both then train on identically."""
    opt = te.optimizers.Adagrad(0.1)
    memory, tiered = table_pair(tmp_path, opt, V, DIM, CACHE_ROWS, storage_dtype=storage_dtype)
    tiered.storage = te.Tiered(**{**tiered.storage.get_config(), "chunk_bytes": 9 * DIM * 4 * 2})
    emb_m = embedding(memory)
    for i in range(3):
        step(emb_m, _ids(i))
    path = tf.train.Checkpoint(embedding=emb_m).write(str(tmp_path / "mem" / "c"))
    emb_t = embedding(tiered)
    tf.train.Checkpoint(embedding=emb_t).read(path)
    assert_same_state(tiered_state(emb_t, tiered), memory_state(emb_m, memory))
    rounding = 3 if storage_dtype == tf.bfloat16 else 0  # only a 16-bit in-memory table keeps a rounding step
    assert int(emb_t.tiered_tables[tiered].step.numpy()) == rounding
    for i in range(3, 6):
        np.testing.assert_array_equal(step(emb_t, _ids(i))["f"].numpy(), step(emb_m, _ids(i))["f"].numpy())
    assert_same_state(tiered_state(emb_t, tiered), memory_state(emb_m, memory))


def test_a_checkpoint_of_another_geometry_is_refused_and_changes_nothing(tmp_path):
    opt = te.optimizers.Adagrad(0.1)
    small = te.TableConfig(
        V // 2, DIM, name="t", optimizer=opt, storage=te.Tiered(cache_bytes=1 << 16, directory=str(tmp_path / "s"))
    )
    path = tf.train.Checkpoint(embedding=embedding(small)).write(str(tmp_path / "ckpt" / "c"))
    table = _tiered(tmp_path, "a", opt)
    emb = embedding(table)
    step(emb, _ids(0))
    before = tiered_state(emb, table)
    with pytest.raises(ValueError, match=r"'t'[\s\S]*40 rows[\s\S]*80 rows[\s\S]*no tiered table was changed"):
        tf.train.Checkpoint(embedding=emb).read(path)
    assert_same_state(tiered_state(emb, table), before)
    # An in-memory checkpoint of another dim: refused too, naming the tensor.
    wide = te.TableConfig(V, DIM + 1, name="t", optimizer=opt)
    path = tf.train.Checkpoint(embedding=embedding(wide)).write(str(tmp_path / "ckpt2" / "c"))
    with pytest.raises(ValueError, match=r"'t'[\s\S]*shape \[80, 5\][\s\S]*no tiered table was changed"):
        tf.train.Checkpoint(embedding=emb).read(path)
    assert_same_state(tiered_state(emb, table), before)


def test_a_checkpoint_missing_a_chunk_is_refused_before_any_row_is_written(tmp_path):
    """A checkpoint whose manifest promises a chunk it lacks: every chunk is checked before the first write."""
    opt = te.optimizers.SGD(0.1)
    table = _tiered(tmp_path, "a", opt, chunk_bytes=20 * DIM * 4)
    emb = embedding(table)
    path = tf.train.Checkpoint(embedding=emb).write(str(tmp_path / "ckpt" / "c"))
    reader = tf.train.load_checkpoint(path)
    # Rewrite the checkpoint without the last chunk (TensorFlow's own writer, all other tensors as they were).
    names = [k for k in reader.get_variable_to_shape_map() if k != "embedding/t/part-3"]
    broken = str(tmp_path / "broken" / "c")
    tf.raw_ops.SaveV2(
        prefix=broken,
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.constant(reader.get_tensor(k), reader.get_variable_to_dtype_map()[k]) for k in names],
    )
    step(emb, _ids(0))
    before = tiered_state(emb, table)
    with pytest.raises(ValueError, match=r"'t'[\s\S]*part-3[\s\S]*no tiered table was changed"):
        tf.train.Checkpoint(embedding=emb).read(broken)
    assert_same_state(tiered_state(emb, table), before)


def test_a_refused_tiered_part_changes_no_table_of_the_embedding(tmp_path):
    """An embedding of an in-memory and a tiered table: a checkpoint whose tiered part does not fit is refused
    before TensorFlow restores the in-memory table (the embedding checks every table's part first)."""
    opt = te.optimizers.Adagrad(0.1)
    emb_api = tf.tpu.experimental.embedding

    def make(vocab, sub):
        static = te.TableConfig(V, DIM, name="s", optimizer=opt)
        storage = te.Tiered(cache_bytes=1 << 16, directory=str(tmp_path / sub))
        tiered = te.TableConfig(vocab, DIM, name="t", optimizer=opt, storage=storage)
        emb = te.TPUEmbedding({"a": emb_api.FeatureConfig(static), "b": emb_api.FeatureConfig(tiered)})
        emb.build()
        return emb, static, tiered

    saved, _, _ = make(V // 2, "small")
    path = tf.train.Checkpoint(embedding=saved).write(str(tmp_path / "ckpt" / "c"))
    emb, static, tiered = make(V, "big")
    step(emb, {"a": tf.constant([1, 2], tf.int64), "b": tf.constant([3], tf.int64)})
    static_before = emb.embedding_tables[static].numpy()
    before = tiered_state(emb, tiered)
    with pytest.raises(ValueError, match=r"'t'[\s\S]*40 rows[\s\S]*80 rows"):
        tf.train.Checkpoint(embedding=emb).read(path)
    np.testing.assert_array_equal(emb.embedding_tables[static].numpy(), static_before)
    assert_same_state(tiered_state(emb, tiered), before)


def test_a_saved_model_of_a_tiered_table_is_refused_naming_it(tmp_path):
    _, tiered = table_pair(tmp_path / "rows", te.optimizers.SGD(0.1), V, DIM, CACHE_ROWS, name="big")
    emb = embedding(tiered)
    with pytest.raises(NotImplementedError, match=r"'big'[\s\S]*SavedModel cannot hold them"):
        tf.saved_model.save(emb, str(tmp_path / "saved_model"))


def test_mode_restore_writes_no_row_until_the_checkpoint_restore_writes_them_all(tmp_path):
    """te.Tiered(mode="restore"): the new row file gets no initial rows (a restore would write them all again);
    a read before the restore names the table and the row; after it the table continues bitwise as the saved one.
    """
    opt = te.optimizers.Adagrad(0.1)
    table = _tiered(tmp_path, "a", opt, 9 * DIM * 4 * 2)
    emb = embedding(table)
    for i in range(2):
        step(emb, _ids(i))
    path = tf.train.Checkpoint(embedding=emb).write(str(tmp_path / "ckpt" / "c"))

    # A restarted job: an existing row file is replaced, and no row is written from the initializer.
    stale = tmp_path / "b" / "t.rows"
    stale.parent.mkdir()
    stale.write_bytes(b"a crashed run's rows")
    config = table.storage.get_config()
    restored_table = te.TableConfig(
        V,
        DIM,
        name="t",
        optimizer=opt,
        initializer=table.initializer,
        storage=te.Tiered(**{**config, "directory": str(tmp_path / "b"), "mode": "restore"}),
    )
    restored = embedding(restored_table)
    tiered = restored.tiered_tables[restored_table]
    stats = tiered.stats()
    assert int(stats["rows_written"]) == 0 and int(stats["resident_rows"]) == 0
    with pytest.raises(tf.errors.FailedPreconditionError, match=r"table 't'.*row 0 was never written.*mode='restore'"):
        restored.enqueue(_ids(0))
        restored.dequeue()

    tf.train.Checkpoint(embedding=restored).read(path).assert_consumed()
    assert int(tiered.stats()["rows_written"]) == V  # once each
    assert_same_state(tiered_state(restored, restored_table), tiered_state(emb, table))
    for i in range(2, 5):
        np.testing.assert_array_equal(step(restored, _ids(i))["f"].numpy(), step(emb, _ids(i))["f"].numpy())
    assert_same_state(tiered_state(restored, restored_table), tiered_state(emb, table))


def test_mode_restore_round_trips_and_unknown_modes_are_refused():
    storage = te.Tiered(cache_bytes=1 << 20, directory="/tmp/rows", mode="restore")
    assert te.Tiered.from_config(storage.get_config()) == storage
    with pytest.raises(ValueError, match=r"`mode` must be one of .*'restore'.*got 'restored'"):
        te.Tiered(cache_bytes=1 << 20, directory="/tmp/rows", mode="restored")
