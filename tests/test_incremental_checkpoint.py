"""te.checkpoint.IncrementalCheckpointManager: a chain (full + deltas) restores bit for bit, faults are refused.

The reference is the model's own state captured (as numpy) when each save was taken: a restore of the chain
must give back exactly that state, into the same object and into a new one with another shard count or dynamic
capacity.  Every refusal leaves every table, slot and dense variable unchanged.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tests import fault_support as support
from tests.tracked_optimizers import DIM, OPTIMIZERS, VA, VB
from tf_embed_ops.checkpoint import _format

_emb = tf.tpu.experimental.embedding


class _Model(support.EmbeddingModel):
    def __init__(self, optimizer_name, kind, num_shards=3, dim=DIM):
        super().__init__()
        opt = OPTIMIZERS[optimizer_name]()
        if kind == "dynamic_lifecycle":
            a = te.DynamicTableConfig(
                "a",
                dim,
                optimizer=opt,
                combiner="sum",
                initial_capacity=16 * num_shards,
                admission=te.dynamic.BloomAdmission(2, num_counters=1024, num_hashes=2, counter_bits=4),
                eviction=te.dynamic.DecayedLFU(max_rows=8, decay=0.5),
            )
        elif kind in ("dynamic", "sharded_dynamic"):
            a = te.DynamicTableConfig("a", dim, optimizer=opt, combiner="sum", initial_capacity=16 * num_shards)
        elif kind == "bfloat16":
            a = te.TableConfig(VA, dim, name="a", optimizer=opt, combiner="sum", storage_dtype=tf.bfloat16)
        else:
            a = _emb.TableConfig(VA, dim, name="a", optimizer=opt, combiner="sum")
        b = _emb.TableConfig(VB, dim, name="b", optimizer=opt, combiner="sum")
        features = {"a": _emb.FeatureConfig(a), "b": _emb.FeatureConfig(b)}
        if kind in ("sharded", "sharded_dynamic"):
            from tf_embed_ops.distribute import ShardedTPUEmbedding

            self.emb = ShardedTPUEmbedding(features, num_shards=num_shards)
        else:
            self.emb = te.TPUEmbedding(features)
        self.emb.build(per_replica_batch_size=6)
        self.dense = tf.Variable(np.zeros([dim], np.float32))
        self.kind = kind

    def step(self, rng):
        a = rng.integers(0, VA, 6) if "dynamic" not in self.kind else rng.integers(0, 15, 6) * 7919 + 3
        if self.kind == "dynamic_lifecycle":
            a = np.concatenate([a[:3], a[:3]])  # seen twice: admitted by the Bloom filter
        ids = {"a": tf.constant(a, tf.int64), "b": tf.constant(rng.integers(0, VB, 6), tf.int64)}
        self.train(ids, "b")


def _manager(model, directory, **kwargs):
    return te.checkpoint.IncrementalCheckpointManager(tf.train.Checkpoint(model=model), directory, **kwargs)


def _assert_same(got, want):
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def _train_and_save(model, mgr, rng, saves=4, steps=2, evict=False):
    states = []
    for i in range(saves):
        for _ in range(steps):
            model.step(rng)
        if evict and i == 2:
            table = list(model.emb.dynamic_tables.values())[0]
            shards = getattr(table, "shards", None) or [table]
            for s in shards:
                s.evict_keys(tf.constant([3, 3 + 7919, 3 + 2 * 7919], tf.int64))
        mgr.save()
        states.append(model.state())
    return states


def _assert_restores_last_save(model, mgr, rng, states, other, tmp_path):
    """After `_train_and_save` (four saves): `model`, trained on past its last save, and a new object `other`
    restore the chain to version 4, bitwise the state saved last."""
    model.step(rng)  # move away from the saved state
    assert mgr.restore() == 4
    _assert_same(model.state(), states[-1])
    assert _manager(other, tmp_path).restore() == 4
    _assert_same(other.state(), states[-1])


@pytest.mark.parametrize("kind", ["static", "bfloat16", "sharded", "dynamic", "sharded_dynamic"])
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_chain_restores_bit_identical(tmp_path, optimizer_name, kind):
    rng = np.random.default_rng(0)
    model = _Model(optimizer_name, kind)
    mgr = _manager(model, tmp_path, full_every=0)
    states = _train_and_save(model, mgr, rng, evict="dynamic" in kind)
    assert [e["kind"] for e in mgr.chain] == ["full", "delta", "delta", "delta"]
    # The new object: another shard count / dynamic capacity.
    _assert_restores_last_save(model, mgr, rng, states, _Model(optimizer_name, kind, num_shards=2), tmp_path)


def test_dynamic_lifecycle_policies_restore_bit_identical(tmp_path):
    """Bloom admission counters and decayed-LFU counts are saved whole in each delta."""
    rng = np.random.default_rng(5)
    model = _Model("adagrad", "dynamic_lifecycle")
    mgr = _manager(model, tmp_path, full_every=0)
    states = _train_and_save(model, mgr, rng)
    _assert_restores_last_save(model, mgr, rng, states, _Model("adagrad", "dynamic_lifecycle"), tmp_path)


def test_deltas_hold_only_changed_rows_and_full_every(tmp_path):
    rng = np.random.default_rng(1)
    model = _Model("adagrad", "static")
    mgr = _manager(model, tmp_path, full_every=3)
    _train_and_save(model, mgr, rng, saves=5, steps=1)
    assert [e["kind"] for e in mgr.chain] == ["full", "delta", "delta", "full", "delta"]
    header, arrays = _format.read_delta(os.path.join(tmp_path, "ckpt-5.delta"), mgr.chain[-1]["sha256"])
    assert header["tables"]["a"]["rows"] <= 6 and arrays["static/a/parameters"].shape[1] == DIM
    # Compaction: a new full checkpoint; with max_chains=2 the oldest chain's files are gone.
    mgr.compact()
    assert [e["kind"] for e in mgr.chain] == ["full", "delta", "full"]
    assert not os.path.exists(os.path.join(tmp_path, "ckpt-1.full"))
    assert mgr.latest_checkpoint.endswith("ckpt-6")


def _corrupt(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))


def _truncate(path):
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])


@pytest.mark.parametrize("fault", ["corrupt", "truncate", "missing"])
def test_bad_delta_is_refused_or_skipped_with_allow_partial(tmp_path, fault):
    rng = np.random.default_rng(2)
    model = _Model("adagrad", "dynamic")
    mgr = _manager(model, tmp_path, full_every=0)
    states = _train_and_save(model, mgr, rng)
    bad = os.path.join(tmp_path, "ckpt-3.delta")
    {"corrupt": _corrupt, "truncate": _truncate, "missing": os.remove}[fault](bad)
    model.step(rng)
    before = model.state()
    with pytest.raises(te.checkpoint.CheckpointError, match="ckpt-3.delta"):
        mgr.restore()
    _assert_same(model.state(), before)  # refused: nothing changed
    assert mgr.restore(allow_partial=True) == 2
    _assert_same(model.state(), states[1])
    # Saving continues the valid prefix.
    mgr.save()
    assert [e["name"] for e in mgr.chain] == ["ckpt-1", "ckpt-2", "ckpt-3"]
    assert _manager(_Model("adagrad", "dynamic"), tmp_path).restore() == 3


def test_delta_of_another_model_is_refused(tmp_path):
    rng = np.random.default_rng(3)
    model = _Model("sgd", "static")
    mgr = _manager(model, tmp_path / "a", full_every=0)
    _train_and_save(model, mgr, rng, saves=2)
    other = _Model("sgd", "static", dim=8)
    other_mgr = _manager(other, tmp_path / "b", full_every=0)
    _train_and_save(other, other_mgr, rng, saves=2)
    # The foreign delta takes the place of ckpt-2, with the manifest's checksum updated to match it.
    foreign = os.path.join(tmp_path / "b", "ckpt-2.delta")
    target = os.path.join(tmp_path / "a", "ckpt-2.delta")
    os.replace(foreign, target)
    manifest = _format.read_manifest(str(tmp_path / "a"))
    manifest["chain"][1]["sha256"] = _format.sha256_file(target)
    _format.write_manifest(str(tmp_path / "a"), manifest)
    before = model.state()
    with pytest.raises(te.checkpoint.CheckpointError, match="ckpt-2.delta: a delta of another model"):
        mgr.restore()
    _assert_same(model.state(), before)
    # The whole directory of another model: refused by the manifest.
    with pytest.raises(te.checkpoint.CheckpointError, match="another model"):
        _manager(model, tmp_path / "b").restore()


def test_verify_directory_without_the_library(tmp_path):
    rng = np.random.default_rng(4)
    model = _Model("sgd", "static")
    mgr = _manager(model, tmp_path, full_every=0)
    _train_and_save(model, mgr, rng, saves=3)
    _corrupt(os.path.join(tmp_path, "ckpt-3.delta"))
    script = os.path.abspath(_format.__file__)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "import importlib.util, json, sys\n"
        "sys.modules['tf_embed_ops'] = None  # the checker must not need the library\n"
        "try:\n    import tf_embed_ops\n    sys.exit('tf_embed_ops importable')\nexcept ImportError:\n    pass\n"
        f"spec = importlib.util.spec_from_file_location('fmt', {script!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        f"print(json.dumps(m.verify_directory({str(tmp_path)!r})))\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], env=env, cwd="/", capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    import json

    result = json.loads(out.stdout)
    assert result["valid"] == ["ckpt-1", "ckpt-2"] and "ckpt-3.delta" in result["error"]


def test_no_checkpoint_is_an_error(tmp_path):
    mgr = _manager(_Model("sgd", "static"), tmp_path)
    with pytest.raises(te.checkpoint.CheckpointError, match="no incremental checkpoint"):
        mgr.restore()
    assert mgr.restore_or_initialize() is None


@pytest.mark.slow
def test_sigkill_mid_save_leaves_a_restorable_chain(tmp_path):
    """A training process saving in a loop is killed with SIGKILL at random moments; each restart restores the
    last complete save and continues the chain, which a library-free checker validates."""
    import random
    import signal
    import time

    child = os.path.join(os.path.dirname(__file__), "incremental_checkpoint_child.py")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rnd = random.Random(7)
    last_saved = 0
    for _ in range(4):
        proc = subprocess.Popen(
            [sys.executable, child, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        try:
            restored = int(proc.stdout.readline().split()[1])
            assert restored == last_saved  # the last completed save, never a half-written one
            line = proc.stdout.readline()  # one save done; kill during the next ones
            assert line.startswith("saved"), line
            time.sleep(rnd.uniform(0.0, 1.5))
            proc.send_signal(signal.SIGKILL)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        saved = [int(x.split()[1]) for x in [line, *out.splitlines()] if x.startswith("saved")]
        last_saved = saved[-1]
        result = _format.verify_directory(str(tmp_path))
        assert result["error"] is None, result
        # The manifest lists the last completed save (a save killed before its manifest write is not listed).
        assert result["valid"][-1] in (f"ckpt-{last_saved}", f"ckpt-{last_saved + 1}")
        last_saved = int(result["valid"][-1].split("-")[1])
