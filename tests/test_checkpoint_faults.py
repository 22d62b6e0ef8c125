"""te.checkpoint.IncrementalCheckpointManager under faults: concurrent saves, a full disk, bad arguments, deltas of
another run, chains that do not fit the model, truncated files and broken manifests.

Every refusal is checked for its error (naming the file, the table or the argument) and for what it leaves: the
model's tables, slots and dense variables bitwise as they were, and the directory's files as they were (no
temporary left behind). The reference for a restore is the model's own state captured as numpy at the save.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tests import fault_support as support
from tf_embed_ops.checkpoint import _format

_emb = tf.tpu.experimental.embedding
VS, DIM = 24, 4


class _Model(support.EmbeddingModel):
    """A static table `s` and a dynamic table `d` (optionally with DecayedLFU eviction), SGD, one dense variable."""

    def __init__(self, max_rows=1000, lifecycle=False, seed=0):
        super().__init__()
        extra = {"eviction": te.dynamic.DecayedLFU(max_rows=max_rows, decay=0.5)} if lifecycle else {}
        d = te.DynamicTableConfig(
            "d", DIM, optimizer=_emb.SGD(0.1), combiner="sum", initial_capacity=8, max_rows=max_rows, **extra
        )
        s = _emb.TableConfig(VS, DIM, name="s", optimizer=_emb.Adagrad(0.1), combiner="sum")
        self.emb = te.TPUEmbedding({"d": _emb.FeatureConfig(d), "s": _emb.FeatureConfig(s)})
        self.emb.build(per_replica_batch_size=4)
        self.dense = tf.Variable(np.full([DIM], seed, np.float32))

    def step(self, keys, rng):
        ids = {
            "d": tf.constant(rng.choice(keys, 4), tf.int64),
            "s": tf.constant(rng.integers(0, VS, 4), tf.int64),
        }
        self.train(ids, "s")


def _manager(model, directory, **kwargs):
    return te.checkpoint.IncrementalCheckpointManager(tf.train.Checkpoint(model=model), str(directory), **kwargs)


def _assert_same(got, want):
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def _chain(tmp_path, lifecycle=False, deltas=2, seed=0):
    """A model trained and saved: a full checkpoint, then `deltas` deltas each adding new dynamic keys."""
    rng = np.random.default_rng(seed)
    model = _Model(lifecycle=lifecycle, seed=seed)
    mgr = _manager(model, tmp_path, full_every=0)
    for i in range(deltas + 1):
        keys = np.arange(6) + 100 * i
        for _ in range(3):
            model.step(keys, rng)
        mgr.save()
    return model, mgr


def _rewrite_delta(directory, name, edit):
    """Rewrites delta `name` through `edit(header, arrays)` and lists its new checksum: a valid file and manifest
    entry with the content a crafted (or foreign) delta would have."""
    manifest = _format.read_manifest(str(directory))
    entry = [e for e in manifest["chain"] if e["name"] == name][0]
    path = os.path.join(str(directory), f"{name}.delta")
    header, arrays = _format.read_delta(path, entry["sha256"])
    edit(header, arrays)
    entry["sha256"], entry["bytes"] = _format.write_delta(path, header, arrays)
    _format.write_manifest(str(directory), manifest)


def _fresh(tmp_path, **kwargs):
    """Another model (trained a little, so that its state is not the initial one) and a manager on `tmp_path`."""
    model = _Model(**kwargs)
    model.step(np.arange(3) + 7, np.random.default_rng(9))
    return model, _manager(model, tmp_path)


# ------------------------------------------------------------------------------------------------ threads
def test_the_queued_batch_is_no_child_a_checkpoint_walks():
    """enqueue's batch is replaced every step: were it a tracked child of the embedding object, a save on another
    thread while training replaced it would find it gone mid-walk (a KeyError from TensorFlow's object graph)."""
    model = _Model()
    model.step(np.arange(40), np.random.default_rng(1))
    children = model.emb._trackable_children()
    assert "_pending" not in children, sorted(children)
    for child in children.values():
        assert "Pending" not in type(child).__name__ and "Pending" not in repr(child)[:200], child


def test_concurrent_saves_while_training_make_one_valid_chain(tmp_path):
    """Two threads saving in a loop while a third trains: every save gets its own number, each file's checksum is
    the manifest's, no temporary is left, and the chain restores the last save bit for bit."""
    model = _Model()
    mgr = _manager(model, tmp_path, full_every=3)
    rng = np.random.default_rng(1)
    model.step(np.arange(40), rng)  # every variable created (a first step may build some) before the race
    mgr.save()
    errors = support.race(mgr.save, times=5, threads=2, train=lambda: model.step(np.arange(40), rng))
    assert errors == []
    steps = [e["step"] for e in mgr.chain]
    assert steps == sorted(set(steps)) and steps[-1] == 11  # 1 + 2 x 5 saves, one number each
    assert _format.verify_directory(str(tmp_path))["error"] is None
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    mgr.save()
    saved = model.state()
    other, other_mgr = _fresh(tmp_path)
    assert other_mgr.restore() == 12
    _assert_same(other.state(), saved)


# ------------------------------------------------------------------------------------------------ full disk
@pytest.mark.parametrize("kind", ["delta", "full"])
def test_a_full_disk_names_the_file_and_leaves_nothing(tmp_path, monkeypatch, kind):
    model, mgr = _chain(tmp_path, deltas=1)
    model.step(np.arange(50, 56), np.random.default_rng(3))
    before = support.files(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", support.no_space)
        with pytest.raises(tf.errors.ResourceExhaustedError, match=rf"ckpt-3\.{kind}: .*nothing was written"):
            mgr.save(full=kind == "full")
    assert support.files(tmp_path) == before  # no temporary, the manifest as it was
    assert [e["name"] for e in mgr.chain] == ["ckpt-1", "ckpt-2"]
    # The failed save lost nothing: the next one holds its rows.
    mgr.save()
    saved = model.state()
    other, other_mgr = _fresh(tmp_path)
    assert other_mgr.restore() == 3
    _assert_same(other.state(), saved)


# ------------------------------------------------------------------------------------------------ arguments
@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"full_every": "x"}, "full_every: must be an integer, got 'x'"),
        ({"full_every": 1.5}, "full_every: must be an integer, got 1.5"),
        ({"full_every": True}, "full_every: must be an integer, got True"),
        ({"full_every": -1}, r"full_every: must be in \[0, "),
        ({"max_chains": 0}, r"max_chains: must be in \[1, "),
        ({"max_chains": "2"}, "max_chains: must be an integer, got '2'"),
    ],
)
def test_bad_constructor_arguments_are_refused_naming_them(tmp_path, kwargs, words):
    with pytest.raises(ValueError, match=words):
        _manager(_Model(), tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"checkpoint_number": -5}, r"checkpoint_number: must be in \[3, .*got -5"),
        ({"checkpoint_number": 2}, r"checkpoint_number: must be in \[3, .*got 2"),
        ({"checkpoint_number": 7.0}, "checkpoint_number: must be an integer, got 7.0"),
        ({"checkpoint_number": "7"}, "checkpoint_number: must be an integer, got '7'"),
        ({"full": "yes"}, "full must be True, False or None, got 'yes'"),
    ],
)
def test_bad_save_arguments_are_refused_and_nothing_is_written(tmp_path, kwargs, words):
    model, mgr = _chain(tmp_path, deltas=1)
    before = support.files(tmp_path)
    with pytest.raises(ValueError, match=words):
        mgr.save(**kwargs)
    assert support.files(tmp_path) == before
    assert mgr.restore() == 2


# ------------------------------------------------------------------------------------------------ parents
def test_a_delta_of_another_run_is_refused(tmp_path):
    """Two runs of one model both have a ckpt-2; run B's, copied with its manifest entry into run A's chain, names
    the parent ckpt-1 (by name, as A's does) but B's ckpt-1 by content: refused, nothing changes."""
    _chain(tmp_path / "a", deltas=2, seed=0)
    _chain(tmp_path / "b", deltas=2, seed=1)
    shutil.copy(tmp_path / "b" / "ckpt-2.delta", tmp_path / "a" / "ckpt-2.delta")
    manifest_a = _format.read_manifest(str(tmp_path / "a"))
    manifest_b = _format.read_manifest(str(tmp_path / "b"))
    manifest_a["chain"][1] = manifest_b["chain"][1]
    _format.write_manifest(str(tmp_path / "a"), manifest_a)
    model, mgr = _fresh(tmp_path / "a")
    before = model.state()
    with pytest.raises(te.checkpoint.CheckpointError, match=r"ckpt-2\.delta: follows another 'ckpt-1' .*another run"):
        mgr.restore()
    _assert_same(model.state(), before)
    assert "another run" in _format.verify_directory(str(tmp_path / "a"))["error"]
    # With allow_partial, the valid prefix: A's full checkpoint alone.
    assert mgr.restore(allow_partial=True) == 1


def test_a_chain_written_before_parents_had_digests_still_restores(tmp_path):
    model, _ = _chain(tmp_path, deltas=2)
    saved = model.state()
    for name in ("ckpt-2", "ckpt-3"):
        _rewrite_delta(tmp_path, name, lambda header, _: header.pop("parent_sha256"))
    other, mgr = _fresh(tmp_path)
    assert mgr.restore() == 3
    _assert_same(other.state(), saved)


# ------------------------------------------------------------------------------------------------ validation
def test_a_chain_beyond_the_tables_max_rows_is_refused_before_anything_is_written(tmp_path):
    """The full checkpoint (6 keys) fits max_rows=10, the chain (18 keys) does not: refused before the full
    checkpoint is read into the model."""
    _chain(tmp_path, deltas=2)
    model, mgr = _fresh(tmp_path, max_rows=10)
    before = model.state()
    with pytest.raises(te.checkpoint.CheckpointError, match=r"ckpt-1\.full/ckpt and its deltas: .*'d'.*max_rows=10"):
        mgr.restore()
    _assert_same(model.state(), before)


@pytest.mark.parametrize("array", ["weights", "slots", "counts", "pending_keys"])
def test_a_delta_whose_dynamic_arrays_do_not_fit_is_refused_naming_file_and_table(tmp_path, array):
    _chain(tmp_path, deltas=2)

    def widen(_, arrays):
        value = arrays[f"dynamic/d/{array}"]
        if value.ndim == 2:  # one more column
            arrays[f"dynamic/d/{array}"] = np.concatenate([value, np.zeros([value.shape[0], 1], value.dtype)], 1)
        else:  # one more entry
            arrays[f"dynamic/d/{array}"] = np.concatenate([value, np.zeros([1], value.dtype)])

    _rewrite_delta(tmp_path, "ckpt-3", widen)
    model, mgr = _fresh(tmp_path)
    before = model.state()
    with pytest.raises(te.checkpoint.CheckpointError, match=r"ckpt-3\.delta: table 'd': \w+ has shape"):
        mgr.restore()
    _assert_same(model.state(), before)


def test_a_last_delta_with_short_decayed_lfu_state_is_refused(tmp_path):
    _chain(tmp_path, lifecycle=True, deltas=2)

    def shorten(_, arrays):
        arrays["dynamic/d/policy/decayed_counts"] = arrays["dynamic/d/policy/decayed_counts"][:-1]

    _rewrite_delta(tmp_path, "ckpt-3", shorten)
    model, mgr = _fresh(tmp_path, lifecycle=True)
    before = model.state()
    with pytest.raises(te.checkpoint.CheckpointError, match=r"ckpt-3\.delta: table 'd': decayed_keys .*decayed_counts"):
        mgr.restore()
    _assert_same(model.state(), before)


def test_a_delta_of_another_dtype_is_refused(tmp_path):
    _chain(tmp_path, deltas=2)
    _rewrite_delta(
        tmp_path, "ckpt-2", lambda _, a: a.update({"static/s/parameters": a["static/s/parameters"].astype(np.float64)})
    )
    model, mgr = _fresh(tmp_path)
    before = model.state()
    with pytest.raises(
        te.checkpoint.CheckpointError, match=r"ckpt-2\.delta: table 's' variable 'parameters' is float32 \(float64"
    ):
        mgr.restore()
    _assert_same(model.state(), before)


def test_a_delta_without_a_table_is_refused(tmp_path):
    _chain(tmp_path, deltas=2)
    _rewrite_delta(tmp_path, "ckpt-3", lambda h, _: h["tables"].pop("s"))
    model, mgr = _fresh(tmp_path)
    before = model.state()
    with pytest.raises(te.checkpoint.CheckpointError, match=r"ckpt-3\.delta: holds tables \['d'\], this model has"):
        mgr.restore()
    _assert_same(model.state(), before)


# ------------------------------------------------------------------------------------------------ files
@pytest.mark.parametrize("which", ["data", "delta"])
def test_a_truncated_file_names_the_file_and_the_tables_and_changes_nothing(tmp_path, which):
    _chain(tmp_path, deltas=2)
    if which == "data":
        full = os.path.join(tmp_path, "ckpt-1.full")
        path = [os.path.join(full, n) for n in os.listdir(full) if ".data-" in n][0]
    else:
        path = os.path.join(tmp_path, "ckpt-2.delta")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    model, mgr = _fresh(tmp_path)
    before = model.state()
    with pytest.raises(te.checkpoint.CheckpointError) as err:
        mgr.restore()
    assert path in str(err.value) and "truncated or corrupted" in str(err.value)
    assert "holds tables" in str(err.value) and "'d'" in str(err.value) and "'s'" in str(err.value)
    _assert_same(model.state(), before)


@pytest.mark.parametrize("content", ["[1, 2, 3]", "{", '{"format": "tf_embed_ops.incremental_checkpoint"}', "7"])
def test_a_broken_manifest_is_refused_naming_it(tmp_path, content):
    with open(tmp_path / "manifest.json", "w") as f:
        f.write(content)
    with pytest.raises(te.checkpoint.CheckpointError, match=r"manifest\.json: "):
        _manager(_Model(), tmp_path)
    assert support.files(tmp_path) == {"manifest.json": content.encode()}


def test_a_manifest_whose_chain_is_malformed_is_refused_naming_it(tmp_path):
    _chain(tmp_path, deltas=1)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["chain"][1] = [1, 2]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(te.checkpoint.CheckpointError, match=r"manifest\.json: malformed manifest"):
        _manager(_Model(), tmp_path)
