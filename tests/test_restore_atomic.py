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

from tests.restore_support import (
    DIM,
    Tensors,
    V,
    assert_same,
    dynamic_tensors,
    embedding,
    good_children,
    seed_state,
    state,
    write,
)

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
    children = good_children(names)
    children[bad_table] = corrupt(dynamic_tensors(7, seed=9))
    path = write(tmp_path, children)
    emb = embedding(names, built=built, **options)
    checkpoint = tf.train.Checkpoint(embedding=emb)
    if built:
        seed_state(emb)
        before = state(emb)
        with pytest.raises(ValueError, match=match.format(t=bad_table)):
            checkpoint.read(path)
        assert_same(state(emb), before)
    else:
        with pytest.raises(ValueError, match=match.format(t=bad_table)):
            checkpoint.read(path)
        # Nothing was deferred either: building now gives the initial state, not part of the checkpoint.
        fresh = embedding(names, **options)
        assert_same(state(emb), state(fresh))


@pytest.mark.parametrize("built", [True, False], ids=["built", "not_built"])
def test_a_static_table_of_another_shape_refuses_the_whole_restore(tmp_path, built):
    names = ("a", "s", "z")
    children = good_children(names)
    children["s"] = np.ones([V + 1, DIM], np.float32)
    path = write(tmp_path, children)
    emb = embedding(names, built=built)
    if built:
        seed_state(emb)
    before = state(embedding(names)) if not built else state(emb)
    with pytest.raises(ValueError, match=r"checkpoint's 's' has shape \[11, 4\].*\[10, 4\]; no table was changed"):
        tf.train.Checkpoint(embedding=emb).read(path)
    assert_same(state(emb), before)


def test_a_static_table_of_another_dtype_refuses_a_built_restore(tmp_path):
    names = ("a", "s")
    children = good_children(names)
    children["s"] = np.ones([V, DIM], np.float64)
    path = write(tmp_path, children)
    emb = embedding(names)
    seed_state(emb)
    before = state(emb)
    with pytest.raises(ValueError, match=r"checkpoint's 's' is float64, this object's variable is float32"):
        tf.train.Checkpoint(embedding=emb).read(path)
    assert_same(state(emb), before)


def test_a_valid_checkpoint_restores_every_table(tmp_path):
    names = ("s", "a", "b")
    children = good_children(names)
    path = write(tmp_path, children)
    emb = embedding(names)
    seed_state(emb)
    tf.train.Checkpoint(embedding=emb).read(path).assert_consumed()
    got = state(emb)
    np.testing.assert_array_equal(got["s"], children["s"])
    np.testing.assert_array_equal(got["s/accumulators"], children["s/accumulators"])
    for name in ("a", "b"):
        for k, v in children[name].items():
            np.testing.assert_array_equal(got[f"{name}:{k}"], v, err_msg=f"{name}:{k}")


def test_two_embeddings_in_one_checkpoint_are_each_checked_against_their_own_data(tmp_path):
    good, bad = good_children(("s", "a")), good_children(("s", "a"))
    bad["a"] = dict(bad["a"], step=np.int64(-1))
    root = tf.Module()
    for which, children in (("one", good), ("two", bad)):
        module = tf.Module()
        for name, value in children.items():
            child = Tensors({k: tf.constant(v) for k, v in value.items()}) if isinstance(value, dict) else None
            setattr(module, name, child or tf.Variable(value))
        setattr(root, which, module)
    path = tf.train.Checkpoint(root=root).write(str(tmp_path / "ckpt"))
    one, two = embedding(("s", "a")), embedding(("s", "a"))
    seed_state(one)
    seed_state(two)
    before = state(two)
    holder = tf.Module()
    holder.one, holder.two = one, two
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        tf.train.Checkpoint(root=holder).read(path)
    assert_same(state(two), before)
