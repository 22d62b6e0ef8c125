"""What a restore or an import does with data at the edges (docs/reliability.md, "Restores: decisions"):

- admission counters for a table without admission, or beyond `max_pending_keys`: refused, naming the table;
- NaN / inf rows and slots: restored as saved (as TensorFlow restores a static table's variables);
- a negative `rounding_step` in a checkpoint: refused;
- a truncated checkpoint file: TensorFlow's reader fails before any object is restored; nothing changes.
"""

from __future__ import annotations

import glob

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tests.dynamic.state_util import DynamicTable, config, content
from tests.restore_support import Tensors, assert_same, dynamic_tensors, embedding, seed_state, state
from tf_embed_ops.dynamic import FrequencyAdmission

_emb = tf.tpu.experimental.embedding


def _pending(n, start=1000):
    return {
        "pending_keys": np.arange(start, start + n, dtype=np.int64),
        "pending_counts": np.ones(n, np.int64),
        "pending_last_steps": np.zeros(n, np.int64),
    }


@pytest.mark.parametrize(
    ("admission", "n", "match"),
    [
        (None, 1, r"holds 1 pending admission counters but the table counts none"),
        (
            FrequencyAdmission(3, max_pending_keys=4),
            5,
            r"holds 5 pending admission counters, more than max_pending_keys=4",
        ),
    ],
    ids=["no_admission", "over_max_pending_keys"],
)
def test_admission_counters_a_table_cannot_hold_are_refused_by_import_and_restore(tmp_path, admission, n, match):
    table = DynamicTable(config(name="users", admission=admission))
    table.import_([5, 6], np.ones([2, 4], np.float32))
    before = content(table)
    with pytest.raises(ValueError, match=rf"DynamicTable 'users': import_: the content {match}"):
        table.import_([1, 2], np.zeros([2, 4], np.float32), **_pending(n))
    # The same counters in a checkpoint.
    tensors = dict(dynamic_tensors(2, seed=1), **_pending(n))
    tensors["slots"] = np.ones([2, 4], np.float32)
    path = tf.train.Checkpoint(t=Tensors({k: tf.constant(v) for k, v in tensors.items()})).write(str(tmp_path / "c"))
    with pytest.raises(ValueError, match=rf"DynamicTable 'users': restore: the checkpoint {match}"):
        tf.train.Checkpoint(t=table).read(path)
    for k, v in before.items():
        np.testing.assert_array_equal(content(table)[k], v)


def test_admission_counters_within_the_limits_are_restored():
    table = DynamicTable(config(name="users", admission=FrequencyAdmission(3, max_pending_keys=4)))
    table.import_([1, 2], np.zeros([2, 4], np.float32), **_pending(4))
    np.testing.assert_array_equal(content(table)["pending_keys"], np.arange(1000, 1004))


def test_non_finite_rows_and_slots_are_restored_as_saved(tmp_path):
    table = DynamicTable(config(name="users"))
    weights = np.array([[np.nan, np.inf, -np.inf, 1.0], [0.0, -0.0, 3.4e38, -1.0]], np.float32)
    slots = np.array([[np.inf, 1, 1, 1], [np.nan, 2, 2, 2]], np.float32)
    table.import_([1, 2], weights, slots=slots)
    path = tf.train.Checkpoint(t=table).write(str(tmp_path / "c"))
    fresh = DynamicTable(config(name="users"))
    tf.train.Checkpoint(t=fresh).read(path).assert_consumed()
    got = content(fresh)
    np.testing.assert_array_equal(got["weights"].view(np.int32), weights.view(np.int32))  # bitwise, NaN included
    np.testing.assert_array_equal(got["slots"].view(np.int32), slots.view(np.int32))


def test_a_negative_rounding_step_in_a_checkpoint_is_refused(tmp_path):
    table = te.TableConfig(10, 4, name="s16", storage_dtype=tf.bfloat16, initializer=tf.zeros_initializer())
    root = tf.Module()
    root.s16 = tf.Variable(tf.ones([10, 4], tf.bfloat16))
    root.rounding_step = tf.Variable(tf.constant(-1, tf.int64))
    path = tf.train.Checkpoint(embedding=root).write(str(tmp_path / "c"))
    emb = te.TPUEmbedding({"f": _emb.FeatureConfig(table, name="f")}, te.optimizers.SGD(0.1))
    emb.build()
    before = emb.embedding_tables[table].numpy().copy()
    with pytest.raises(ValueError, match=r"'rounding_step' is -1, it must be >= 0; no table was changed"):
        tf.train.Checkpoint(embedding=emb).read(path)
    np.testing.assert_array_equal(emb.embedding_tables[table].numpy(), before)


@pytest.mark.parametrize("which", ["data", "index"])
@pytest.mark.parametrize("keep", [0.5, 0.98])
def test_a_truncated_checkpoint_changes_nothing(tmp_path, which, keep):
    names = ("s", "a", "b")
    emb = embedding(names)
    for cfg, table in emb.dynamic_tables.items():
        table.import_(np.arange(20), np.full([20, 4], float(len(cfg.name)), np.float32))
    path = tf.train.Checkpoint(embedding=emb).write(str(tmp_path / "ckpt"))
    (file,) = glob.glob(f"{path}.{which}*")
    data = open(file, "rb").read()
    with open(file, "wb") as f:
        f.write(data[: int(len(data) * keep)])
    target = embedding(names)
    seed_state(target)
    before = state(target)
    # TensorFlow's own reader fails first (the object graph is read before any object): IndexError "Read less
    # bytes than requested" for a data file, an OpError for the index.
    with pytest.raises((IndexError, tf.errors.OpError, ValueError)):
        tf.train.Checkpoint(embedding=target).read(path)
    assert_same(state(target), before)
