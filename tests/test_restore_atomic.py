"""A refused `te.TPUEmbedding` restore changes nothing: every table's checkpoint data is checked before any is
written (static tables, slots, and every dynamic table: rows, counters, the step).

Each case writes a checkpoint whose one child is bad (the rest valid and different from the target's state),
restores it, and asserts the error names the table and that every table, slot, dynamic table and step is
bitwise what it was.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops._tf_compat import trackable_base

_emb = tf.tpu.experimental.embedding
V, DIM = 10, 4


class _Tensors(trackable_base.Trackable):
    """A checkpoint child holding the given tensors (what a dynamic table writes, possibly corrupted)."""

    def __init__(self, tensors):
        self._tensors = tensors

    def _serialize_to_tensors(self):
        return dict(self._tensors)


def _embedding(names=("s", "a", "b"), max_rows=1000, built=True):
    features = {}
    for name in names:
        if name.startswith("s"):
            table = _emb.TableConfig(V, DIM, name=name, initializer=tf.zeros_initializer())
        else:
            table = te.DynamicTableConfig(name, DIM, max_rows=max_rows)
        features[name] = _emb.FeatureConfig(table, name=name)
    emb = te.TPUEmbedding(features, te.optimizers.Adagrad(0.1))
    if built:
        emb.build()
    return emb


def _dynamic_tensors(n, seed, step=3):
    rng = np.random.default_rng(seed)
    return {
        "keys": np.arange(n, dtype=np.int64),
        "weights": rng.standard_normal([n, DIM]).astype(np.float32),
        "slots": rng.uniform(0.1, 1, [n, DIM]).astype(np.float32),
        "counts": np.ones(n, np.int64),
        "last_steps": np.zeros(n, np.int64),
        "pending_keys": np.zeros(0, np.int64),
        "pending_counts": np.zeros(0, np.int64),
        "pending_last_steps": np.zeros(0, np.int64),
        "step": np.int64(step),
    }


def _write(tmp_path, children):
    root = tf.Module()
    for name, value in children.items():
        if isinstance(value, dict):
            value = _Tensors({k: tf.constant(v) for k, v in value.items()})
        else:
            value = tf.Variable(value)
        setattr(root, name, value)
    return tf.train.Checkpoint(embedding=root).write(str(tmp_path / "ckpt"))


def _good_children(names):
    out = {}
    for i, name in enumerate(names):
        if name.startswith("s"):
            out[name] = np.full([V, DIM], 7.0, np.float32)
            out[f"{name}/accumulators"] = np.full([V, DIM], 0.5, np.float32)
        else:
            out[name] = _dynamic_tensors(6, seed=i)
    return out


def _state(emb):
    out = {}
    for table, var in emb.embedding_tables.items():
        out[table.name] = var.numpy().copy()
    for table, slots in emb.slot_variables.items():
        for slot, var in slots.items():
            out[f"{table.name}/{slot}"] = var.numpy().copy()
    for config, table in emb.dynamic_tables.items():
        for k, v in table.export().items():
            out[f"{config.name}:{k}"] = v.numpy().copy()
        out[f"{config.name}:step"] = table.step.numpy()
    return out


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _seed_state(emb):
    for var in emb.embedding_tables.values():
        var.assign(tf.fill(var.shape, 2.0))
    for table in emb.dynamic_tables.values():
        table.import_(tf.constant([100, 101], tf.int64), tf.ones([2, DIM]))
        table.step.assign(9)


_BAD = {
    "rows over max_rows": ({"max_rows": 6}, lambda c: c, r"DynamicTable '{t}'.*7 rows.*max_rows=6"),
    "step of shape [2]": ({}, lambda c: dict(c, step=np.array([1, 2], np.int64)), r"'{t}'.*step must be a scalar"),
    "negative step": ({}, lambda c: dict(c, step=np.int64(-5)), r"'{t}'.*step must be >= 0, got -5"),
    "duplicate key": ({}, lambda c: dict(c, keys=np.array([0, 1, 1, 3, 4, 5, 6], np.int64)), r"'{t}'.*key 1 appears"),
    "weights of another dim": (
        {},
        lambda c: dict(c, weights=np.zeros([7, DIM + 1], np.float32)),
        r"'{t}'.*(dim 5|weights has shape)",
    ),
    "negative count": ({}, lambda c: dict(c, counts=np.full(7, -1, np.int64)), r"'{t}'.*counts\[0\].*-1"),
    "pending counters without admission": (
        {},
        lambda c: dict(
            c,
            pending_keys=np.array([50], np.int64),
            pending_counts=np.array([1], np.int64),
            pending_last_steps=np.array([0], np.int64),
        ),
        r"'{t}'.*1 pending admission counters but the table counts none",
    ),
}


@pytest.mark.parametrize("built", [True, False], ids=["built", "not_built"])
@pytest.mark.parametrize("bad_table", ["a", "b"])
@pytest.mark.parametrize("case", sorted(_BAD))
def test_a_bad_dynamic_table_refuses_the_whole_restore(tmp_path, case, bad_table, built):
    options, corrupt, match = _BAD[case]
    names = ("s", "a", "b")
    children = _good_children(names)
    children[bad_table] = corrupt(_dynamic_tensors(7, seed=9))
    path = _write(tmp_path, children)
    emb = _embedding(names, built=built, **options)
    checkpoint = tf.train.Checkpoint(embedding=emb)
    if built:
        _seed_state(emb)
        before = _state(emb)
        with pytest.raises(ValueError, match=match.format(t=bad_table)):
            checkpoint.read(path)
        _assert_same(_state(emb), before)
    else:
        with pytest.raises(ValueError, match=match.format(t=bad_table)):
            checkpoint.read(path)
        # Nothing was deferred either: building now gives the initial state, not part of the checkpoint.
        fresh = _embedding(names, **options)
        _assert_same(_state(emb), _state(fresh))


@pytest.mark.parametrize("built", [True, False], ids=["built", "not_built"])
def test_a_static_table_of_another_shape_refuses_the_whole_restore(tmp_path, built):
    names = ("a", "s", "z")
    children = _good_children(names)
    children["s"] = np.ones([V + 1, DIM], np.float32)
    path = _write(tmp_path, children)
    emb = _embedding(names, built=built)
    if built:
        _seed_state(emb)
    before = _state(_embedding(names)) if not built else _state(emb)
    with pytest.raises(ValueError, match=r"checkpoint's 's' has shape \[11, 4\].*\[10, 4\]; no table was changed"):
        tf.train.Checkpoint(embedding=emb).read(path)
    _assert_same(_state(emb), before)


def test_a_static_table_of_another_dtype_refuses_a_built_restore(tmp_path):
    names = ("a", "s")
    children = _good_children(names)
    children["s"] = np.ones([V, DIM], np.float64)
    path = _write(tmp_path, children)
    emb = _embedding(names)
    _seed_state(emb)
    before = _state(emb)
    with pytest.raises(ValueError, match=r"checkpoint's 's' is float64, this object's variable is float32"):
        tf.train.Checkpoint(embedding=emb).read(path)
    _assert_same(_state(emb), before)


def test_a_valid_checkpoint_restores_every_table(tmp_path):
    names = ("s", "a", "b")
    children = _good_children(names)
    path = _write(tmp_path, children)
    emb = _embedding(names)
    _seed_state(emb)
    tf.train.Checkpoint(embedding=emb).read(path).assert_consumed()
    state = _state(emb)
    np.testing.assert_array_equal(state["s"], children["s"])
    np.testing.assert_array_equal(state["s/accumulators"], children["s/accumulators"])
    for name in ("a", "b"):
        for k, v in children[name].items():
            np.testing.assert_array_equal(state[f"{name}:{k}"], v, err_msg=f"{name}:{k}")


def test_two_embeddings_in_one_checkpoint_are_each_checked_against_their_own_data(tmp_path):
    good, bad = _good_children(("s", "a")), _good_children(("s", "a"))
    bad["a"] = dict(bad["a"], step=np.int64(-1))
    root = tf.Module()
    for which, children in (("one", good), ("two", bad)):
        module = tf.Module()
        for name, value in children.items():
            child = _Tensors({k: tf.constant(v) for k, v in value.items()}) if isinstance(value, dict) else None
            setattr(module, name, child or tf.Variable(value))
        setattr(root, which, module)
    path = tf.train.Checkpoint(root=root).write(str(tmp_path / "ckpt"))
    one, two = _embedding(("s", "a")), _embedding(("s", "a"))
    _seed_state(one)
    _seed_state(two)
    before = _state(two)
    holder = tf.Module()
    holder.one, holder.two = one, two
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        tf.train.Checkpoint(root=holder).read(path)
    _assert_same(_state(two), before)
