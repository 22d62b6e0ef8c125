"""The parameter-server sharded classes as table groups (`distribute.sharded_groups`): their kinds, the one update
across them (`TPUEmbedding.send_all`, the sharded Keras layer's backward pass) and the tiered kind's refusal."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
import tf_embed_ops.keras
from tests.tiered_support import table_pair
from tf_embed_ops.distribute import ShardedTPUEmbedding, sharded_groups
from tf_embed_ops.distribute.keras_layer import ShardedEmbeddingLayer

_emb = tf.tpu.experimental.embedding
V, DIM = 8, 2


def _static(optimizer=None):
    return _emb.TableConfig(V, DIM, tf.constant_initializer(1.0), optimizer, combiner="sum", name="s")


def _both(rate):
    dynamic = te.DynamicTableConfig("d", DIM, optimizer=te.optimizers.SGD(lambda: rate), combiner="sum")
    static = _static(te.optimizers.SGD(0.5))
    return {"s": _emb.FeatureConfig(static), "d": _emb.FeatureConfig(dynamic)}, static, dynamic


def _rows(emb, table) -> np.ndarray:
    return tf.concat(list(emb.embedding_tables[table].variables), 0).numpy()


def test_the_sharded_class_lists_its_kinds_and_shards_the_dynamic_tables_on_its_devices():
    features, static, dynamic = _both(tf.Variable(0.1))
    emb = ShardedTPUEmbedding(features, num_shards=2)
    kinds = [(g.kind, type(g)) for g in emb.groups]
    assert kinds == [
        ("in-memory", sharded_groups.ShardedStaticGroup),
        ("dynamic", sharded_groups.ShardedDynamicGroup),
    ]
    emb.build()
    assert len(emb.dynamic_tables[dynamic].shards) == 2
    assert [len(v.variables) for v in emb.embedding_tables.values()] == [2]


@pytest.mark.parametrize("in_function", [False, True])
def test_send_all_updates_every_server_and_reads_each_after_its_update(in_function):
    # The single-process probe read a table's `handle`, which a ShardedVariable has none of.
    table = _static()
    emb = ShardedTPUEmbedding({"f": _emb.FeatureConfig(table, name="f")}, _emb.SGD(0.5), num_shards=2)
    emb.build(per_replica_batch_size=2)
    inputs, _ = emb.normalize_inputs({"f": tf.constant([[0], [6]], tf.int64)}, None)
    send = tf.function(emb.send_all) if in_function else emb.send_all
    probe = send([tf.fill([2, DIM], 2.0)], inputs)
    want = np.ones((V, DIM), np.float32)
    want[[0, 6]] -= 0.5 * 2.0  # SGD, one id per sample, sum combiner
    np.testing.assert_array_equal(_rows(emb, table), want)
    # One element of each server's first row (rows 0 and 4), read after the update.
    assert float(probe) == want[0, 0] + want[4, 0]


@pytest.mark.parametrize("bad_rate", [-1.0, float("nan")])
def test_the_sharded_layer_updates_every_kind_in_one_step_a_refused_one_changes_no_table(bad_rate):
    rate = tf.Variable(0.25)
    features, static, dynamic = _both(rate)
    layer = ShardedEmbeddingLayer(features, num_shards=2)
    ids = tf.constant([1, 6], tf.int64)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            acts = layer({"s": ids, "d": ids}, training=True)
            loss = tf.reduce_sum(acts["s"]) + tf.reduce_sum(acts["d"])
        return tape.gradient(loss, layer.trainable_variables)

    step()
    want = np.ones((V, DIM), np.float32)
    want[[1, 6]] -= 0.5
    np.testing.assert_array_equal(_rows(layer.embedding, static), want)
    exported = layer.embedding.dynamic_tables[dynamic].export()
    assert sorted(exported["keys"].numpy()) == [1, 6]
    before = exported["weights"].numpy()
    # Only the dynamic op reads its learning rate; its check runs before the in-memory tables' update.
    rate.assign(bad_rate)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be finite and >= 0"):
        step()
    np.testing.assert_array_equal(_rows(layer.embedding, static), want)
    np.testing.assert_array_equal(layer.embedding.dynamic_tables[dynamic].export()["weights"].numpy(), before)


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_the_tiered_kind_of_the_sharded_classes_refuses_tiered_tables_by_name(tmp_path, kind):
    if kind == "static":
        _, table = table_pair(tmp_path, te.optimizers.Adagrad(0.1), V, DIM, 4, name="big")
    else:
        storage = te.Tiered(cache_bytes=1 << 16, directory=str(tmp_path))
        table = te.DynamicTableConfig("big", DIM, optimizer=te.optimizers.SGD(0.1), storage=storage)
    features = {"f": _emb.FeatureConfig(table, name="f"), "g": _emb.FeatureConfig(_static(), name="g")}
    for make in (ShardedTPUEmbedding, ShardedEmbeddingLayer):
        with pytest.raises(ValueError, match=r"te\.distribute\.ShardedTPUEmbedding does not train tiered.*'big'"):
            make(features, te.optimizers.SGD(0.1), num_shards=2)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("sharded", [False, True])
def test_a_frozen_in_memory_table_beside_a_dynamic_one_is_looked_up_and_never_trained(sharded):
    # One update across the groups refused the step: the in-memory group's trainability check saw the frozen table.
    dynamic = te.DynamicTableConfig("d", DIM, optimizer=te.optimizers.SGD(0.5), combiner="sum", seed=1)
    features = {"s": _emb.FeatureConfig(_static()), "d": _emb.FeatureConfig(dynamic)}
    if sharded:
        layer = ShardedEmbeddingLayer(features, num_shards=2, frozen_tables=["s"])
    else:
        layer = tf_embed_ops.keras.TPUEmbedding(features, frozen_tables=["s"])
    ids = tf.constant([1, 6], tf.int64)
    layer({"d": ids, "s": ids}, training=False)  # inserts nothing: the keys come with the training lookup
    with tf.GradientTape() as tape:
        acts = layer({"s": ids, "d": ids}, training=True)
        loss = tf.reduce_sum(acts["s"]) + tf.reduce_sum(acts["d"])
    initial = acts["d"].numpy()
    tape.gradient(loss, layer.trainable_variables)
    (static,) = layer.embedding_tables
    table = layer.embedding_tables[static]
    rows = tf.concat(list(table.variables), 0) if sharded else tf.convert_to_tensor(table)
    np.testing.assert_array_equal(rows.numpy(), np.ones((V, DIM), np.float32))
    after = layer({"s": ids, "d": ids}, training=False)
    np.testing.assert_allclose(after["d"].numpy(), initial - 0.5, rtol=1e-6, atol=1e-6)  # SGD, gradient 1
    np.testing.assert_array_equal(after["s"].numpy(), np.ones((2, DIM), np.float32))
