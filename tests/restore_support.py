"""Helpers of the restore tests (tests/test_restore_atomic.py, tests/test_restore_decisions.py): checkpoints of
chosen (possibly corrupted) tensors, a `te.TPUEmbedding` of static and dynamic tables, and its whole state."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops._tf_compat import trackable_base

__all__ = [
    "DIM",
    "V",
    "Tensors",
    "assert_same",
    "dynamic_tensors",
    "embedding",
    "good_children",
    "seed_state",
    "state",
    "write",
]

_emb = tf.tpu.experimental.embedding
V, DIM = 10, 4


class Tensors(trackable_base.Trackable):
    """A checkpoint child holding the given tensors (what a dynamic table writes, possibly corrupted)."""

    def __init__(self, tensors):
        self._tensors = tensors

    def _serialize_to_tensors(self):
        return dict(self._tensors)


def embedding(names=("s", "a", "b"), max_rows=1000, built=True):
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


def dynamic_tensors(n, seed, step=3):
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


def write(tmp_path, children):
    root = tf.Module()
    for name, value in children.items():
        if isinstance(value, dict):
            value = Tensors({k: tf.constant(v) for k, v in value.items()})
        else:
            value = tf.Variable(value)
        setattr(root, name, value)
    return tf.train.Checkpoint(embedding=root).write(str(tmp_path / "ckpt"))


def good_children(names):
    out = {}
    for i, name in enumerate(names):
        if name.startswith("s"):
            out[name] = np.full([V, DIM], 7.0, np.float32)
            out[f"{name}/accumulators"] = np.full([V, DIM], 0.5, np.float32)
        else:
            out[name] = dynamic_tensors(6, seed=i)
    return out


def state(emb):
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


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def seed_state(emb):
    for var in emb.embedding_tables.values():
        var.assign(tf.fill(var.shape, 2.0))
    for table in emb.dynamic_tables.values():
        table.import_(tf.constant([100, 101], tf.int64), tf.ones([2, DIM]))
        table.step.assign(9)
