"""A truncated or corrupt checkpoint file, restored through `tf.train.Checkpoint` into every kind of table (static,
dynamic, tiered, tiered dynamic, alone or in a `te.TPUEmbedding`): one documented error, `tf.errors.DataLossError`,
naming the data file and the table, and nothing changed (docs/dynamic_tables.md, "Checkpoints")."""

from __future__ import annotations

import glob

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tests.dynamic.state_util import DynamicTable, ShardedDynamicTable, config, content
from tf_embed_ops.dynamic import checkpoint_check

_emb = tf.tpu.experimental.embedding
DIM = 4


def _truncate(path, keep):
    """Cuts the largest data file (a tiered table's checkpoint has several: the rows are in the largest)."""
    file = max(glob.glob(f"{path}.data-*-of-*"), key=lambda f: len(open(f, "rb").read()))
    data = open(file, "rb").read()
    with open(file, "wb") as f:
        f.write(data[: int(len(data) * keep)])
    return file


def _embedding(tmp_path, kind, sub):
    storage = te.Tiered(cache_bytes=1 << 16, directory=str(tmp_path / sub)) if "tiered" in kind else None
    if kind in ("static", "tiered"):
        table = te.TableConfig(40, DIM, name="clicks", storage=storage, initializer=tf.zeros_initializer())
    else:
        table = te.DynamicTableConfig("clicks", DIM, max_rows=1000, storage=storage)
    emb = te.TPUEmbedding({"f": _emb.FeatureConfig(table, name="f")}, te.optimizers.Adagrad(0.1))
    emb.build()
    return emb, table


def _fill(emb, table, value):
    if isinstance(table, te.DynamicTableConfig):
        emb.dynamic_tables[table].import_(tf.range(30, dtype=tf.int64), tf.fill([30, DIM], value))
    elif table.name in {t.name for t in emb.tiered_tables}:
        emb.tiered_tables[table].write_rows(0, tf.fill([40, DIM], value))
    else:
        emb.embedding_tables[table].assign(tf.fill([40, DIM], value))


def _state(emb, table):
    if isinstance(table, te.DynamicTableConfig):
        t = emb.dynamic_tables[table]
        return {**{k: v.numpy() for k, v in t.export().items()}, "step": t.step.numpy()}
    if table.name in {t.name for t in emb.tiered_tables}:
        values, slots = emb.tiered_tables[table].read_all()
        return {"values": values, **slots}
    return {
        "values": emb.embedding_tables[table].numpy(),
        **{k: v.numpy() for k, v in emb.slot_variables[table].items()},
    }


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("keep", [0.3, 0.98])
@pytest.mark.parametrize("kind", ["static", "dynamic", "tiered", "tiered_dynamic"])
def test_a_truncated_data_file_is_a_data_loss_error_naming_the_file_and_the_table(tmp_path, kind, keep):
    source, table = _embedding(tmp_path, kind, "a")
    _fill(source, table, 3.0)
    path = tf.train.Checkpoint(embedding=source).write(str(tmp_path / "ckpt"))
    file = _truncate(path, keep)
    target, target_table = _embedding(tmp_path, kind, "b")
    _fill(target, target_table, 5.0)
    before = _state(target, target_table)
    with pytest.raises(tf.errors.DataLossError, match=rf"'clicks'.*{file}.*truncated"):
        tf.train.Checkpoint(embedding=target).read(path)
    _assert_same(_state(target, target_table), before)


@pytest.mark.parametrize("shards", [1, 2])
def test_a_truncated_file_restored_into_a_dynamic_table_alone(tmp_path, shards):
    source = DynamicTable(config(name="users"))
    source.import_(np.arange(500), np.ones([500, DIM], np.float32))
    path = tf.train.Checkpoint(t=source).write(str(tmp_path / "ckpt"))
    file = _truncate(path, 0.9)
    cfg = config(name="users")
    target = DynamicTable(cfg) if shards == 1 else ShardedDynamicTable(cfg, shards)
    parts = [target] if shards == 1 else list(target.shards)
    for part in parts:
        part.import_([1, 2], np.zeros([2, DIM], np.float32))
    before = [content(p) for p in parts]
    with pytest.raises(tf.errors.DataLossError, match=rf"'users'.*{file} is truncated or corrupt"):
        tf.train.Checkpoint(t=target).read(path)
    for part, want in zip(parts, before, strict=True):
        _assert_same(content(part), want)


def test_a_table_s_own_check_reads_every_tensor_and_names_the_file(tmp_path):
    """Past TensorFlow's object graph (a checkpoint whose data file lost bytes inside a table's tensor, or a reader
    that fails on one tensor): the table's own check, before TensorFlow restores anything."""
    source = DynamicTable(config(name="users"))
    source.import_(np.arange(50), np.ones([50, DIM], np.float32))
    path = tf.train.Checkpoint(t=source).write(str(tmp_path / "ckpt"))
    reader = tf.train.load_checkpoint(path)

    class Failing:
        def get_tensor(self, key):
            raise IndexError("Read less bytes than requested")

    with pytest.raises(tf.errors.DataLossError, match=rf"DynamicTable 'users': restore: the checkpoint file {path}"):
        checkpoint_check.read_tensor(Failing(), path, "t/.ATTRIBUTES/keys", "DynamicTable 'users'")
    checkpoint_check.check_data_files(path, reader, "DynamicTable 'users'")  # whole: no error
    file = _truncate(path, 0.5)
    with pytest.raises(
        tf.errors.DataLossError, match=rf"DynamicTable 'users': restore: .*{file} is truncated: it holds"
    ):
        checkpoint_check.check_data_files(path, reader, "DynamicTable 'users'")


def test_a_checkpoint_holding_none_of_the_package_s_tables_keeps_tensorflow_s_error(tmp_path):
    path = tf.train.Checkpoint(v=tf.Variable(tf.ones([100]))).write(str(tmp_path / "ckpt"))
    _truncate(path, 0.5)
    with pytest.raises(IndexError):
        tf.train.Checkpoint(v=tf.Variable(tf.zeros([100]))).read(path)


def test_a_dynamic_table_checked_by_its_embedding_is_not_read_again_by_its_own_check(tmp_path, monkeypatch):
    source, table = _embedding(tmp_path, "dynamic", "a")
    _fill(source, table, 3.0)
    path = tf.train.Checkpoint(embedding=source).write(str(tmp_path / "ckpt"))
    reads = []
    real = checkpoint_check.read_tensor
    monkeypatch.setattr(
        checkpoint_check, "read_tensor", lambda reader, p, key, *a: reads.append(key) or real(reader, p, key, *a)
    )
    target, target_table = _embedding(tmp_path, "dynamic", "b")
    tf.train.Checkpoint(embedding=target).read(path).assert_consumed()
    assert sum(key.endswith("/keys") for key in reads) == 1, reads
    np.testing.assert_array_equal(_state(target, target_table)["keys"], np.arange(30))
    # Alone, the table checks its own part.
    reads.clear()
    alone = DynamicTable(config(name="clicks"))
    tf.train.Checkpoint(t=alone).read(
        tf.train.Checkpoint(t=target.dynamic_tables[target_table]).write(str(tmp_path / "c2"))
    )
    assert sum(key.endswith("/keys") for key in reads) == 1, reads
