"""Checkpoints of tiered tables (`te.TableConfig(storage=te.Tiered(...))`) trained by `te.TPUEmbeddingV2`: the
tiered table streamed and restored, restores across the tiered and in-memory kinds and from `te.TPUEmbedding`, and
refused restores that change no table. The embedding (a tiered "t" beside an in-memory "u") and the in-memory
reference are those of test_tiered_v2.py (tiered_v2_support.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tiered_v2_support import (
    DIM,
    OPTIMIZERS,
    V,
    _apart,
    _assert_same,
    _assert_same_acts,
    _assert_same_tables,
    _batches,
    _changes_nothing,
    _embedding,
    _feature_config,
    _read,
    _state,
    _states,
    _stats,
    _step,
    _write,
)

import tf_embed_ops as te
from tf_embed_ops.sparse_core import checkpoint as sc_checkpoint


def test_checkpoint_streams_the_tiered_table_and_restores_it(tmp_path):
    emb = _embedding(tmp_path / "rows", OPTIMIZERS["adam"](), True)
    batches = _batches(4)
    for features in batches[:2]:
        _step(emb, features)
    saved = _states(emb)
    path = _write(emb, tmp_path / "ckpt")
    keys = {k for k, _ in tf.train.list_variables(path)}
    assert {"embedding/t/manifest", "embedding/t/part-0", "embedding/t/momenta/part-0"} <= keys  # streamed
    assert "embedding/u/.ATTRIBUTES/VARIABLE_VALUE" in keys  # the in-memory stack, as before
    layouts = sc_checkpoint.read_layouts(path)
    assert sorted(layouts) == ["u"]  # the layouts proto lists the stacked (in-memory) tables only
    for features in batches[2:]:
        _step(emb, features)
    _read(emb, path)
    _assert_same_tables(emb, saved)
    # Training on from the restored state is the training that followed the save.
    again = _embedding(tmp_path / "rows2", OPTIMIZERS["adam"](), True)
    for features in batches[:2]:
        _step(again, features)
    for features in batches[2:]:
        _step(emb, features), _step(again, features)
    _assert_same_tables(emb, _states(again))


def test_a_table_made_with_mode_restore_is_written_once_by_the_restore(tmp_path):
    emb = _embedding(tmp_path / "rows", OPTIMIZERS["adagrad"](), True)
    batches = _batches(4)
    for features in batches[:2]:
        _step(emb, features)
    path = _write(emb, tmp_path / "ckpt")
    restored = _embedding(tmp_path / "rows2", OPTIMIZERS["adagrad"](), True, mode="restore")
    assert _stats(restored)["rows_written"] == 0  # no initial rows
    _read(restored, path)
    assert _stats(restored)["rows_written"] == V
    _assert_same_tables(restored, _states(emb))
    for features in batches[2:]:
        acts, restored_acts = _step(emb, features), _step(restored, features)
        _assert_same_acts(restored_acts, acts)
    _assert_same_tables(restored, _states(emb))


@pytest.mark.parametrize("storage_dtype", [tf.float32, tf.bfloat16], ids=["fp32", "bf16"])
def test_restores_across_the_tiered_and_in_memory_kinds(tmp_path, storage_dtype):
    options = {"storage_dtype": storage_dtype}
    tiered = _apart(tmp_path, "a", True, **options)
    for features in _batches(2):
        _step(tiered, features)
    saved = _states(tiered)
    streamed = _write(tiered, tmp_path / "from_tiered")

    memory = _apart(tmp_path, "b", False, **options)
    _read(memory, streamed)
    _assert_same_tables(memory, saved)

    # And an in-memory checkpoint (the stacked layout) into a new tiered table.
    for features in _batches(2, seed=7):
        _step(memory, features)
    saved = _states(memory)
    stacked = _write(memory, tmp_path / "from_memory")
    assert "embedding/t/.ATTRIBUTES/VARIABLE_VALUE" in {k for k, _ in tf.train.list_variables(stacked)}
    fresh = _apart(tmp_path, "c", True, **options)
    _read(fresh, stacked)
    _assert_same_tables(fresh, saved)
    # Both keep training alike.
    for features in _batches(2, seed=9):
        acts_f, acts_m = _step(fresh, features), _step(memory, features)
        np.testing.assert_array_equal(acts_f["f"].numpy(), acts_m["f"].numpy())
    _assert_same(_state(fresh, "t"), _state(memory, "t"))


def test_an_in_memory_16_bit_v2_restores_its_rounding_step(tmp_path):
    def make():
        return _embedding(tmp_path, OPTIMIZERS["adam"](), False, storage_dtype=tf.bfloat16)

    saved_run, batches = make(), _batches(4, seed=11)
    for features in batches[:2]:
        _step(saved_run, features)
    path = _write(saved_run, tmp_path / "ckpt")
    assert "embedding/rounding_step/.ATTRIBUTES/VARIABLE_VALUE" in {k for k, _ in tf.train.list_variables(path)}
    restored = make()
    _read(restored, path)
    assert restored.variables["t"]["parameters"].dtype == tf.bfloat16
    for features in batches[2:]:
        _step(saved_run, features), _step(restored, features)
    _assert_same_tables(restored, _states(saved_run))


def _tiered_te_tpu_embedding(directory, seed: int, accumulator: float, **kwargs):
    """A `te.TPUEmbedding` of "u" and a tiered "t" (Adagrad) whose rows are drawn from `seed` and accumulators all
    `accumulator`; and those rows."""
    config = _feature_config(directory, OPTIMIZERS["adagrad"](), True, **kwargs)
    source = te.TPUEmbedding({"a": config["a"], "f": config["f"]})
    source.build()
    [table] = source.tiered_tables.values()
    rows = np.random.default_rng(seed).normal(size=(V, DIM)).astype(np.float32)
    table.write_rows(0, rows, {"accumulators": np.full((V, DIM), accumulator, np.float32)})
    return source, rows


def _assert_restored_t(target, rows, accumulator: float) -> None:
    state = _state(target, "t")
    np.testing.assert_array_equal(state["parameters"], rows)
    np.testing.assert_array_equal(state["accumulators"], np.full((V, DIM), accumulator, np.float32))


def test_restores_a_per_table_checkpoint_of_te_tpu_embedding(tmp_path):
    # te.TPUEmbedding's checkpoint (per table, the tiered table streamed) restores into the V2's tiered table.
    source, rows = _tiered_te_tpu_embedding(tmp_path / "a", seed=4, accumulator=0.5)
    path = _write(source, tmp_path / "ckpt")
    target = _embedding(tmp_path / "b", OPTIMIZERS["adagrad"](), True)
    _read(target, path)
    _assert_restored_t(target, rows, 0.5)


def test_a_tiered_checkpoint_of_te_tpu_embedding_restores_into_the_table_in_memory(tmp_path):
    source, rows = _tiered_te_tpu_embedding(tmp_path / "a", seed=8, accumulator=0.25, u_dim=16)
    path = _write(source, tmp_path / "ckpt")
    target = _apart(tmp_path, "b", False)  # "t" in memory, alone in its stack
    _read(target, path)
    _assert_restored_t(target, rows, 0.25)
    _assert_same(_state(target, "u"), {k: v.numpy() for k, v in source.variables["u"].items()})


def test_restores_a_checkpoint_of_te_tpu_embedding_with_the_table_in_memory(tmp_path):
    config = _feature_config(tmp_path, OPTIMIZERS["adagrad"](), False)
    source = te.TPUEmbedding({"a": config["a"], "f": config["f"]})
    source.build()
    rows = np.random.default_rng(6).normal(size=(V, DIM)).astype(np.float32)
    source.variables["t"]["parameters"].assign(rows)
    path = _write(source, tmp_path / "ckpt")
    target = _embedding(tmp_path / "b", OPTIMIZERS["adagrad"](), True)
    _read(target, path)  # per table: the tiered table's saver reads the variable's rows, chunk by chunk
    np.testing.assert_array_equal(_state(target, "t")["parameters"], rows)
    _assert_same(_state(target, "u"), {k: v.numpy() for k, v in source.variables["u"].items()})


def test_the_tracker_tracks_the_tiered_table_of_a_v2(tmp_path):
    emb = _embedding(tmp_path, OPTIMIZERS["sgd"](), True)
    tracker = te.tracking.Tracker(emb)
    cursor = tracker.cursor()
    features = _batches(1)[0]
    _step(emb, features)
    changes = tracker.changed_since(cursor)
    want = np.unique(np.concatenate([features["f"].flat_values.numpy(), features["h"].numpy()]))
    np.testing.assert_array_equal(changes.tables["t"].rows, want)
    np.testing.assert_array_equal(changes.tables["u"].rows, np.unique(features["a"].numpy()))


def test_refused_restores_change_no_table(tmp_path):
    # Saved tiered, restored into an in-memory table that shares its stack with "u": refused, naming both.
    tiered = _embedding(tmp_path / "a", OPTIMIZERS["adagrad"](), True)
    _step(tiered, _batches(1)[0])
    streamed = _write(tiered, tmp_path / "streamed")
    stacked_memory = _embedding(tmp_path / "b", OPTIMIZERS["adagrad"](), False)
    _changes_nothing(stacked_memory, lambda: _read(stacked_memory, streamed), r"table 't'.*stacked table 't_u'")

    # Saved in memory with "t" stacked with "u", restored into a tiered "t": refused.
    _step(stacked_memory, _batches(1)[0])
    stacked = _write(stacked_memory, tmp_path / "stacked")
    _changes_nothing(tiered, lambda: _read(tiered, stacked), r"stacks table 't' \(tiered here\) with \['u'\]")

    # A tiered table of another size: its check fails before "u" (which matches) is written.
    other = _embedding(tmp_path / "c", OPTIMIZERS["adagrad"](), True, vocab=V + 8)
    _step(other, _batches(1)[0])
    _changes_nothing(other, lambda: _read(other, streamed), r"TieredTable 't'.*72 rows")
