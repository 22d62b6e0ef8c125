"""tf.train.Checkpoint of dynamic tables: the content sorted by key, restore into another capacity and another
number of shards, deterministic files, refused checkpoints that change nothing, and te.TPUEmbedding's checkpoint."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.dynamic.state_util import (
    EXPORT_TENSORS,
    DynamicTable,
    ShardedDynamicTable,
    config,
    content,
    random_content,
    train_lookup,
)
from tf_embed_ops.dynamic import FrequencyAdmission
from tf_embed_ops.dynamic.sharding import shard_of_keys


def _filled(rng, n=40, pending=6, step=7, **kw):
    cfg = config(admission=FrequencyAdmission(3, max_pending_keys=100), **kw)
    table = DynamicTable(cfg)
    c = random_content(rng, n, cfg.dim, table.num_slots, pending)
    table.import_(**c)
    table.step.assign(step)
    return table, c


def _assert_content_equal(got, want):
    for k in EXPORT_TENSORS:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def _shard_part(c, num_shards, index):
    """The numpy reference of one shard's part: rows and counters whose key the shard function gives it."""
    mine = shard_of_keys(tf.constant(c["keys"]), num_shards).numpy() == index
    pend = shard_of_keys(tf.constant(c["pending_keys"]), num_shards).numpy() == index
    out = {k: c[k][mine] for k in ("keys", "weights", "slots", "counts", "last_steps")}
    out.update({k: c[k][pend] for k in ("pending_keys", "pending_counts", "pending_last_steps")})
    return out


def test_round_trip_restores_rows_slots_metadata_counters_and_step(tmp_path):
    rng = np.random.default_rng(0)
    table, c = _filled(rng)
    path = tf.train.Checkpoint(t=table).write(str(tmp_path / "ckpt"))
    table.import_(**random_content(rng, 5, 4, 1, 2))  # change everything, then restore
    table.step.assign(99)
    tf.train.Checkpoint(t=table).read(path).assert_consumed()
    _assert_content_equal(content(table), c)
    assert table.step.numpy() == 7


@pytest.mark.parametrize("shards", [1, 3])
def test_row_wise_adagrad_round_trip_keeps_one_accumulator_per_row(tmp_path, shards):
    """A RowWiseAdagrad table's slot is [n, 1] in the table, the export and the checkpoint (also resharded)."""
    table = DynamicTable(config(name="rw", optimizer="rowwise"))
    assert table.slot_widths == [1]
    c = random_content(np.random.default_rng(12), 30, 4, 1, slot_columns=1)
    table.import_(**c)
    table.step.assign(2)
    _assert_content_equal(content(table), c)
    assert content(table)["slots"].shape == (30, 1)
    path = tf.train.Checkpoint(t=table).write(str(tmp_path / "ckpt"))
    cfg = config(name="rw", optimizer="rowwise")
    other = DynamicTable(cfg) if shards == 1 else ShardedDynamicTable(cfg, shards)
    tf.train.Checkpoint(t=other).read(path).assert_consumed()
    parts = [other] if shards == 1 else list(other.shards)
    for i, part in enumerate(parts):
        _assert_content_equal(content(part), _shard_part(c, shards, i))


@pytest.mark.parametrize("initial_capacity", [1, 1000])
def test_restores_into_a_table_of_another_capacity(tmp_path, initial_capacity):
    table, c = _filled(np.random.default_rng(1), n=100)
    path = tf.train.Checkpoint(t=table).write(str(tmp_path / "ckpt"))
    admission = FrequencyAdmission(3, max_pending_keys=100)
    other = DynamicTable(config(admission=admission, initial_capacity=initial_capacity))
    tf.train.Checkpoint(t=other).read(path).assert_consumed()
    _assert_content_equal(content(other), c)
    assert other.stats()["capacity"].numpy() >= 100


def test_two_saves_of_equal_tables_are_byte_identical(tmp_path):
    """Tables filled in different orders and batchings hold the same content; their files are the same bytes."""
    keys = np.random.default_rng(2).integers(-(2**62), 2**62, 300, dtype=np.int64)
    a, b = DynamicTable(config()), DynamicTable(config())
    train_lookup(a, keys, step=0)
    rev = keys[::-1].copy()
    train_lookup(b, rev[:100], step=0)
    train_lookup(b, rev[100:], step=0)
    _assert_content_equal(content(a), content(b))
    files = []
    for name, table in (("a", a), ("b", b)):
        tf.train.Checkpoint(t=table).write(str(tmp_path / name / "ckpt"))
        (data,) = glob.glob(str(tmp_path / name / "ckpt.data-*"))
        with open(data, "rb") as f:
            files.append(f.read())
    assert files[0] == files[1]
    # Sorted by key inside the file too.
    saved = tf.train.load_checkpoint(str(tmp_path / "a" / "ckpt"))
    np.testing.assert_array_equal(saved.get_tensor("t/.ATTRIBUTES/keys"), np.unique(keys))


@pytest.mark.parametrize("saved_shards, restored_shards", [(1, 2), (2, 1), (2, 3), (3, 3)])
def test_restores_into_another_number_of_shards(tmp_path, saved_shards, restored_shards):
    rng = np.random.default_rng(3 + saved_shards * 10 + restored_shards)
    table, c = _filled(rng, n=200, pending=20)
    path = tf.train.Checkpoint(t=table).write(str(tmp_path / "one"))
    cfg = table.config
    source = DynamicTable(cfg) if saved_shards == 1 else ShardedDynamicTable(cfg, saved_shards)
    tf.train.Checkpoint(t=source).read(path).assert_consumed()
    path = tf.train.Checkpoint(t=source).write(str(tmp_path / "source"))
    target = DynamicTable(cfg) if restored_shards == 1 else ShardedDynamicTable(cfg, restored_shards)
    tf.train.Checkpoint(t=target).read(path).assert_consumed()
    _assert_content_equal(content(target), c)  # the union, sorted
    if restored_shards > 1:
        for i, shard in enumerate(target.shards):
            _assert_content_equal(content(shard), _shard_part(c, restored_shards, i))
            assert shard.step.numpy() == 7


def test_one_shard_object_restores_its_part_of_a_whole_table(tmp_path):
    table, c = _filled(np.random.default_rng(4), n=120, pending=10)
    path = tf.train.Checkpoint(t=table).write(str(tmp_path / "ckpt"))
    shard = DynamicTable(table.config, num_shards=4, shard_index=2)
    tf.train.Checkpoint(t=shard).read(path).assert_consumed()
    part = _shard_part(c, 4, 2)
    assert 0 < part["keys"].shape[0] < 120
    _assert_content_equal(content(shard), part)


@pytest.mark.parametrize(
    "saved, restored, match",
    [
        ({"dim": 4}, {"dim": 5}, "dim 4 but the table has dim 5"),
        (
            {"optimizer": "adagrad"},
            {"optimizer": "sgd"},
            r"slots are 4 values per row but the table's optimizer keeps 0",
        ),
        ({"optimizer": "sgd"}, {"optimizer": "adam"}, r"slots are 0 values per row but the table's optimizer keeps 8"),
        # Row-wise Adagrad keeps one accumulator per row: a per-column accumulator does not restore into it.
        ({"optimizer": "adagrad"}, {"optimizer": "rowwise"}, r"slots are 4 values per row .* keeps 1 \(1 slot"),
        ({"optimizer": "rowwise"}, {"optimizer": "adagrad"}, r"slots are 1 values per row .* keeps 4"),
    ],
)
@pytest.mark.parametrize("shards", [1, 2])
def test_a_checkpoint_of_another_shape_is_refused_naming_the_table_and_changes_nothing(
    tmp_path, saved, restored, match, shards
):
    rng = np.random.default_rng(5)
    source = DynamicTable(config(name="users", **saved))
    source.import_(**random_content(rng, 10, source.dim, source.num_slots, slot_columns=sum(source.slot_widths)))
    path = tf.train.Checkpoint(t=source).write(str(tmp_path / "ckpt"))
    cfg = config(name="users", **restored)
    target = DynamicTable(cfg) if shards == 1 else ShardedDynamicTable(cfg, shards)
    parts = [target] if shards == 1 else list(target.shards)
    for i, part in enumerate(parts):
        columns = sum(part.slot_widths)
        part.import_(**random_content(np.random.default_rng(10 + i), 6, part.dim, part.num_slots, slot_columns=columns))
        part.step.assign(3)
    before = [content(p) for p in parts]
    with pytest.raises(ValueError, match=f"DynamicTable 'users'.*{match}"):
        tf.train.Checkpoint(t=target).read(path)
    for part, want in zip(parts, before, strict=True):
        _assert_content_equal(content(part), want)
        assert part.step.numpy() == 3


def test_a_checkpoint_over_max_rows_is_refused_and_changes_nothing(tmp_path):
    table, _ = _filled(np.random.default_rng(6), n=30, pending=0)
    path = tf.train.Checkpoint(t=table).write(str(tmp_path / "ckpt"))
    small = DynamicTable(config(name="t", max_rows=20, admission=FrequencyAdmission(3, max_pending_keys=100)))
    small.import_(**random_content(np.random.default_rng(7), 5, 4, 1))
    before = content(small)
    with pytest.raises(ValueError, match="DynamicTable 't'.*30 rows.*max_rows=20"):
        tf.train.Checkpoint(t=small).read(path)
    _assert_content_equal(content(small), before)
    # Into two shards of 20 rows each it fits.
    sharded = ShardedDynamicTable(small.config, 2)
    tf.train.Checkpoint(t=sharded).read(path).assert_consumed()
    assert int(sharded.stats()["size"].numpy()) == 30


def test_tpu_embedding_checkpoint_carries_its_dynamic_tables(tmp_path):
    import tf_embed_ops as te

    cfg = config(name="users", dim=3)
    feature = {"u": tf.tpu.experimental.embedding.FeatureConfig(table=cfg, name="u")}
    emb = te.TPUEmbedding(feature, te.optimizers.SGD(learning_rate=0.1))
    emb.build()
    (table,) = emb.dynamic_tables.values()
    table.import_(**random_content(np.random.default_rng(8), 12, 3, table.num_slots))
    table.step.assign(5)
    want = content(table)
    path = tf.train.Checkpoint(embedding=emb).write(str(tmp_path / "ckpt"))
    fresh = te.TPUEmbedding(feature, te.optimizers.SGD(learning_rate=0.1))
    fresh.build()
    tf.train.Checkpoint(embedding=fresh).read(path).assert_consumed()
    (restored,) = fresh.dynamic_tables.values()
    _assert_content_equal(content(restored), want)
    assert restored.step.numpy() == 5
    assert os.path.exists(path + ".index")


def test_keras_layer_checkpoint_carries_its_dynamic_tables(tmp_path):
    import keras

    from tf_embed_ops import keras as te_keras

    def model():
        feature = {"u": tf.tpu.experimental.embedding.FeatureConfig(table=config(name="users", dim=3), name="u")}
        layer = te_keras.TPUEmbedding(feature, tf.tpu.experimental.embedding.SGD(0.1), name="embedding")
        inputs = {"u": keras.Input(shape=(), dtype="int64", name="u")}
        return keras.Model(inputs, layer(inputs)["u"]), layer

    trained, layer = model()
    (table,) = layer.dynamic_tables.values()
    table.import_(**random_content(np.random.default_rng(9), 10, 3, table.num_slots))
    table.step.assign(4)
    want = content(table)
    path = tf.train.Checkpoint(model=trained).write(str(tmp_path / "ckpt"))
    fresh, fresh_layer = model()
    tf.train.Checkpoint(model=fresh).read(path).assert_existing_objects_matched()
    (restored,) = fresh_layer.dynamic_tables.values()
    _assert_content_equal(content(restored), want)
    assert restored.step.numpy() == 4
    keys = tf.constant(want["keys"][:4])
    np.testing.assert_array_equal(fresh({"u": keys}).numpy(), want["weights"][:4])


@pytest.mark.parametrize("shards", [1, 2])
def test_a_saved_model_holding_dynamic_tables_saves_and_loads_with_the_plugin(tmp_path, shards):
    """Not the serving export (that freezes the tables): a SavedModel of the tables themselves, as
    `tf.saved_model.save` writes for any module that holds them."""
    table, c = _filled(np.random.default_rng(10), n=25, pending=3)
    holder = table
    if shards > 1:
        holder = ShardedDynamicTable(table.config, shards)
        tf.train.Checkpoint(t=holder).read(tf.train.Checkpoint(t=table).write(str(tmp_path / "ckpt")))
    module = tf.Module()
    module.table = holder

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def lookup(keys):
        return holder.lookup(keys)

    module.lookup = lookup
    tf.saved_model.save(module, str(tmp_path / "model"))
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    query = np.concatenate([c["keys"], [1, 2]])
    want = np.concatenate([c["weights"], np.zeros([2, table.dim], np.float32)])
    np.testing.assert_array_equal(loaded.lookup(tf.constant(query)).numpy(), want)
