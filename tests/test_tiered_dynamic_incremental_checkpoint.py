"""`te.checkpoint.IncrementalCheckpointManager` over tiered dynamic tables (docs/checkpoints.md,
docs/tiered_tables.md).

Reference: the same chain of saves of the same dynamic table in memory, trained on the same batches, with the same
evictions. A chain's full checkpoint streams the tiered table (its registered saver); a delta holds the keys the
tracker reports changed, their rows read from the tier; a restore merges the keys and metadata in memory and writes
the rows from the full checkpoint one chunk at a time and from the deltas. The restored state (content, policies'
state, step) must be bitwise the in-memory chain's restored state, and training must go on bitwise.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from tiered_support import DYNAMIC_BATCHES, chunked_dynamic_pair, run_json_child, step
from tiered_support import embedding as _embedding

import tf_embed_ops as te
from tf_embed_ops.checkpoint import _format
from tf_embed_ops.checkpoint._format import CheckpointError
from tf_embed_ops.dynamic import tiered_chain_restore

_emb = tf.tpu.experimental.embedding
DIM, CACHE_ROWS, CHUNK_ROWS = 4, 8, 5
_CONTENT = ("keys", "weights", "slots", "counts", "last_steps", "pending_keys", "pending_counts", "pending_last_steps")


def _configs(directory, optimizer, storage_dtype=tf.float32, **options):
    """The same DynamicTableConfig in memory and tiered (a cache of 8 rows, chunks of 5 rows)."""
    return chunked_dynamic_pair(
        directory, optimizer, DIM, CACHE_ROWS, CHUNK_ROWS, storage_dtype=storage_dtype, **options
    )


def _state(emb, table) -> dict:
    t = emb.dynamic_tables[table]
    out = {k: v.numpy() for k, v in t.export().items()}
    out.update({f"policy_{k}": v.numpy() for k, v in t.export_policy_state().items()})
    out["step"] = t.step.numpy()
    return out


def _assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _chains(tmp_path, optimizer, **options):
    memory, tiered = _configs(tmp_path / "rows", optimizer, **options)
    emb_m, emb_t = _embedding(memory), _embedding(tiered)
    mgr_m = te.checkpoint.IncrementalCheckpointManager(tf.train.Checkpoint(embedding=emb_m), str(tmp_path / "m"))
    mgr_t = te.checkpoint.IncrementalCheckpointManager(tf.train.Checkpoint(embedding=emb_t), str(tmp_path / "t"))
    return (emb_m, memory, mgr_m), (emb_t, tiered, mgr_t)


def _round(pairs, batches, evict=()):
    for emb, table in pairs:
        for ids in batches:
            step(emb, {"f": tf.constant(ids, tf.int64)})
        if evict:
            emb.dynamic_tables[table].evict_keys(tf.constant(evict, tf.int64))


@pytest.mark.parametrize(
    "storage_dtype, options",
    [
        (tf.float32, {}),
        pytest.param(tf.bfloat16, {}, marks=pytest.mark.slow),
        (
            tf.float32,
            {
                "admission": te.dynamic.FrequencyAdmission(2, max_pending_keys=64),
                "eviction": te.dynamic.DecayedLFU(14, decay=0.5),
            },
        ),
    ],
    ids=["fp32", "bf16", "admission-decayed-lfu"],
)
def test_a_tiered_dynamic_chain_restores_like_the_in_memory_chain(tmp_path, monkeypatch, storage_dtype, options):
    (emb_m, memory, mgr_m), (emb_t, tiered, mgr_t) = _chains(
        tmp_path, te.optimizers.Adagrad(0.1), storage_dtype=storage_dtype, **options
    )
    pairs = [(emb_m, memory), (emb_t, tiered)]
    _round(pairs, DYNAMIC_BATCHES[:2])
    mgr_m.save()
    mgr_t.save()
    _round(pairs, DYNAMIC_BATCHES[2:4], evict=[3, 12])
    mgr_m.save()
    mgr_t.save()
    _round(pairs, DYNAMIC_BATCHES[4:], evict=[900])
    mgr_m.save()
    mgr_t.save()
    assert [e["kind"] for e in mgr_t.chain] == [e["kind"] for e in mgr_m.chain] == ["full", "delta", "delta"]
    assert int(emb_t.dynamic_tables[tiered].cache_stats()["evictions"]) > 0  # the rows went through the file
    want = _state(emb_m, memory)
    _assert_same(_state(emb_t, tiered), want)
    # The last delta holds the keys its round changed, with their rows as the tier holds them.
    _, arrays = _format.read_delta(os.path.join(mgr_t.directory, "ckpt-3.delta"), mgr_t.chain[-1]["sha256"])
    _, arrays_m = _format.read_delta(os.path.join(mgr_m.directory, "ckpt-3.delta"), mgr_m.chain[-1]["sha256"])
    for key in arrays_m:
        np.testing.assert_array_equal(arrays[key], arrays_m[key], err_msg=key)
    assert 0 < arrays["dynamic/t/keys"].size < want["keys"].size
    assert 900 in arrays["dynamic/t/evicted"].tolist()
    # Train on, then restore both chains: bitwise the state saved, and training goes on bitwise.
    _round(pairs, DYNAMIC_BATCHES[:3], evict=[5, 13])
    # The tiered table's deltas are applied chunk by chunk, never through its whole export.
    applied = []
    apply = tiered_chain_restore.TieredDynamicRestore.apply
    monkeypatch.setattr(tiered_chain_restore.TieredDynamicRestore, "apply", lambda self: applied.append(apply(self)))
    monkeypatch.setattr(emb_t.dynamic_tables[tiered], "export", lambda: pytest.fail("the whole table was read"))
    assert mgr_m.restore() == mgr_t.restore() == 3
    assert len(applied) == 1
    monkeypatch.undo()
    _assert_same(_state(emb_t, tiered), want)
    _assert_same(_state(emb_m, memory), want)
    for ids in DYNAMIC_BATCHES[1:4]:
        ids = tf.constant(ids, tf.int64)
        np.testing.assert_array_equal(step(emb_t, {"f": ids})["f"].numpy(), step(emb_m, {"f": ids})["f"].numpy())
    _assert_same(_state(emb_t, tiered), _state(emb_m, memory))


def test_a_fresh_tiered_table_restores_the_chain_and_its_next_save_is_a_delta(tmp_path):
    (emb_m, memory, mgr_m), (emb_t, tiered, mgr_t) = _chains(tmp_path, te.optimizers.Adagrad(0.1))
    pairs = [(emb_m, memory), (emb_t, tiered)]
    _round(pairs, DYNAMIC_BATCHES[:3])
    mgr_t.save()
    _round(pairs, DYNAMIC_BATCHES[3:], evict=[7, 40])
    mgr_t.save()
    want = _state(emb_m, memory)
    _, tiered2 = _configs(tmp_path / "rows2", te.optimizers.Adagrad(0.1))
    emb2 = _embedding(tiered2)
    mgr2 = te.checkpoint.IncrementalCheckpointManager(tf.train.Checkpoint(embedding=emb2), str(tmp_path / "t"))
    assert mgr2.restore() == 2
    _assert_same(_state(emb2, tiered2), want)
    _round([(emb2, tiered2)], DYNAMIC_BATCHES[:1])
    mgr2.save()
    assert mgr2.chain[-1]["kind"] == "delta"
    _, arrays = _format.read_delta(os.path.join(mgr2.directory, "ckpt-3.delta"), mgr2.chain[-1]["sha256"])
    np.testing.assert_array_equal(arrays["dynamic/t/keys"], np.unique(DYNAMIC_BATCHES[0]))


def test_a_tiered_dynamic_table_changed_whole_gets_a_full_checkpoint(tmp_path):
    _, (emb_t, tiered, mgr_t) = _chains(tmp_path, te.optimizers.Adagrad(0.1))
    _round([(emb_t, tiered)], DYNAMIC_BATCHES[:2])
    mgr_t.save()
    _round([(emb_t, tiered)], DYNAMIC_BATCHES[2:3])
    te.tracking.Tracker(emb_t).mark_all()  # as after a restore by other means
    mgr_t.save()
    assert [e["kind"] for e in mgr_t.chain] == ["full", "full"]


def test_a_corrupted_delta_is_refused_and_changes_nothing(tmp_path):
    _, (emb_t, tiered, mgr_t) = _chains(tmp_path, te.optimizers.Adagrad(0.1))
    _round([(emb_t, tiered)], DYNAMIC_BATCHES[:2])
    mgr_t.save()
    _round([(emb_t, tiered)], DYNAMIC_BATCHES[2:4], evict=[3])
    mgr_t.save()
    _round([(emb_t, tiered)], DYNAMIC_BATCHES[4:])
    before = _state(emb_t, tiered)
    path = os.path.join(mgr_t.directory, "ckpt-2.delta")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 1
    open(path, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match=r"ckpt-2\.delta"):
        mgr_t.restore()
    _assert_same(_state(emb_t, tiered), before)


def test_a_delta_of_the_wrong_dim_is_refused_before_any_change(tmp_path):
    _, (emb_t, tiered, mgr_t) = _chains(tmp_path, te.optimizers.Adagrad(0.1))
    _round([(emb_t, tiered)], DYNAMIC_BATCHES[:2])
    mgr_t.save()
    _round([(emb_t, tiered)], DYNAMIC_BATCHES[2:3])
    mgr_t.save()
    _round([(emb_t, tiered)], DYNAMIC_BATCHES[3:])
    before = _state(emb_t, tiered)
    # Rewrite the delta with rows of another width (a valid file: its checksum and the manifest's agree).
    path = os.path.join(mgr_t.directory, "ckpt-2.delta")
    header, arrays = _format.read_delta(path, mgr_t.chain[-1]["sha256"])
    arrays["dynamic/t/weights"] = np.zeros([arrays["dynamic/t/keys"].size, DIM + 1], np.float32)
    digest, size = _format.write_delta(path, header, arrays)
    manifest = _format.read_manifest(mgr_t.directory)
    manifest["chain"][-1].update(sha256=digest, bytes=size)
    _format.write_manifest(mgr_t.directory, manifest)
    with pytest.raises(CheckpointError, match=r"ckpt-2\.delta: table 't'.*do not fit the table's dim 4"):
        mgr_t.restore()
    _assert_same(_state(emb_t, tiered), before)


def test_a_tiered_dynamic_table_left_out_of_embeddings_is_refused(tmp_path):
    _, tiered = _configs(tmp_path / "rows", te.optimizers.Adagrad(0.1))
    emb = _embedding(tiered)
    other = _embedding(te.TableConfig(8, DIM, name="small", optimizer=te.optimizers.Adagrad(0.1)))
    with pytest.raises(
        ValueError, match=r"IncrementalCheckpointManager: table\(s\) 't' are tiered.*not in `embeddings`"
    ):
        te.checkpoint.IncrementalCheckpointManager(
            tf.train.Checkpoint(embedding=emb, other=other), str(tmp_path / "chain"), embeddings=[other]
        )
    assert not os.path.exists(tmp_path / "chain")


@pytest.mark.slow
def test_a_chain_of_a_large_tiered_dynamic_table_saves_and_restores_a_chunk_at_a_time(tmp_path):
    """65,536 keys x 256 (64 MiB of rows) in chunks of 2 MiB: the full save, the delta and the restore of the chain
    raise the process's peak RSS by a small fraction of the table, where the same table in memory is exported
    (the full save) and merged whole (the restore)."""
    tiered = run_json_child("tiered_dynamic_incremental_memory_child.py", str(tmp_path), "tiered")
    memory = run_json_child("tiered_dynamic_incremental_memory_child.py", str(tmp_path), "memory")
    print(tiered, memory)
    table = tiered["table_bytes"]
    assert table == 65536 * 256 * 4
    assert tiered["kinds"] == memory["kinds"] == ["full", "delta"]
    assert tiered["restored_equal"] and memory["restored_equal"]
    for what in ("save_full", "save_delta", "restore"):
        assert tiered[what] < table / 4, (what, tiered)
    assert memory["restore"] > 2 * table, memory  # the measure sees the whole merge
