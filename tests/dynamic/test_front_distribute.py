"""Dynamic tables in te.distribute: sharded by key (shard_of_keys), each shard's lookup and update on its server.

On one machine (shards on the local device) against the unsharded class; with 2 in-process parameter servers
in a child process (slow).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops.distribute import ShardedTPUEmbedding, SyncSparseAggregator

_emb = tf.tpu.experimental.embedding
DIM = 3
KEYS = np.array([-(2**63), -5, 0, 1, 2, 3, 17, 2**40, 2**63 - 1], np.int64)


def _features(combiner):
    table = te.DynamicTableConfig("users", DIM, optimizer=te.optimizers.Adagrad(0.1), combiner=combiner, seed=3)
    static = _emb.TableConfig(5, DIM, name="static", optimizer=te.optimizers.SGD(0.1), combiner=combiner)
    return {"u": _emb.FeatureConfig(table), "s": _emb.FeatureConfig(static)}, table, static


def _batches():
    rng = np.random.default_rng(5)
    out = []
    for _ in range(3):
        lengths = rng.integers(0, 4, size=4)
        keys = rng.choice(KEYS, size=int(lengths.sum()))
        weights = rng.uniform(0.5, 2.0, size=keys.size).astype(np.float32)
        static_ids = rng.integers(0, 5, size=4)
        out.append((keys, lengths, weights, static_ids))
    return out


def _train(emb):
    for keys, lengths, weights, static_ids in _batches():
        u = tf.RaggedTensor.from_row_lengths(tf.constant(keys), lengths)
        w = tf.RaggedTensor.from_row_lengths(tf.constant(weights), lengths)
        emb.enqueue({"u": u, "s": tf.constant(static_ids, tf.int64)}, weights={"u": w, "s": None})
        with tf.GradientTape() as tape:
            acts = emb.dequeue()
            tape.watch(acts)
            loss = tf.reduce_sum(acts["u"] ** 2) + tf.reduce_sum(acts["s"])
        emb.apply_gradients(tape.gradient(loss, acts))
    return acts


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_two_local_shards_train_like_one_table(combiner):
    features, table, _ = _features(combiner)
    single = te.TPUEmbedding(features)
    acts_single = _train(single)
    features, table2, _ = _features(combiner)
    sharded = ShardedTPUEmbedding(features, num_shards=2)
    acts_sharded = _train(sharded)
    np.testing.assert_allclose(acts_sharded["u"].numpy(), acts_single["u"].numpy(), rtol=2e-6, atol=1e-6)
    whole, shards = single.dynamic_tables[table], sharded.dynamic_tables[table2]
    a, b = whole.export(), shards.export()  # the sharded export is the sorted union of the shards
    np.testing.assert_array_equal(a["keys"].numpy(), b["keys"].numpy())
    np.testing.assert_allclose(a["weights"].numpy(), b["weights"].numpy(), rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(a["slots"].numpy(), b["slots"].numpy(), rtol=2e-6, atol=1e-6)
    # Every key lives on the shard shard_of_keys names, and only there.
    for index, shard in enumerate(shards.shards):
        keys = shard.export()["keys"].numpy()
        assert keys.size > 0
        np.testing.assert_array_equal(te.dynamic.shard_of_keys(tf.constant(keys), 2).numpy(), index)


def test_sync_aggregator_refuses_dynamic_tables():
    features, _, _ = _features("sum")
    emb = ShardedTPUEmbedding(features, num_shards=2)
    with pytest.raises(ValueError, match=r"has dynamic tables \('users'\); synchronous aggregation"):
        SyncSparseAggregator(emb, replicas_to_aggregate=1)


# ------------------------------------------------------------------------ 2 parameter servers (child process)


def _child() -> None:
    from tf_embed_ops.distribute import create_local_cluster

    strategy = create_local_cluster(num_workers=1, num_ps=2)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    features, table, _ = _features("mean")
    with strategy.scope():
        emb = ShardedTPUEmbedding(features)
        emb.build()
    batches = _batches()

    @tf.function
    def step(keys, lengths, weights, static_ids):
        u = tf.RaggedTensor.from_row_lengths(keys, lengths)
        w = tf.RaggedTensor.from_row_lengths(weights, lengths)
        emb.enqueue({"u": u, "s": static_ids}, weights={"u": w, "s": None})
        with tf.GradientTape() as tape:
            acts = emb.dequeue()
            tape.watch(acts)
            loss = tf.reduce_sum(acts["u"] ** 2) + tf.reduce_sum(acts["s"])
        emb.apply_gradients(tape.gradient(loss, acts))
        return acts["u"]

    for keys, lengths, weights, static_ids in batches:
        coordinator.schedule(
            step,
            args=(
                tf.constant(keys),
                tf.constant(lengths, tf.int64),
                tf.constant(weights),
                tf.constant(static_ids, tf.int64),
            ),
        )
        coordinator.join()
    shards = emb.dynamic_tables[table]
    exported = shards.export()
    result = {
        "devices": [s.handle.device for s in shards.shards],
        "keys": exported["keys"].numpy().tolist(),
        "weights": exported["weights"].numpy().tolist(),
        "shard_keys": [s.export()["keys"].numpy().tolist() for s in shards.shards],
    }
    print("RESULT " + json.dumps(result))


@pytest.mark.slow
def test_two_parameter_servers():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "child"], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-4000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert ["/job:ps" in d and f"task:{i}" in d for i, d in enumerate(result["devices"])] == [True, True]
    features, table, _ = _features("mean")
    single = te.TPUEmbedding(features)
    _train(single)
    expected = single.dynamic_tables[table].export()
    np.testing.assert_array_equal(result["keys"], expected["keys"].numpy())
    np.testing.assert_allclose(result["weights"], expected["weights"].numpy(), rtol=2e-6, atol=1e-6)
    for index, keys in enumerate(result["shard_keys"]):
        np.testing.assert_array_equal(te.dynamic.shard_of_keys(tf.constant(keys, tf.int64), 2).numpy(), index)


if __name__ == "__main__":
    _child()


def test_sharded_keras_layer_trains_like_the_single_machine_layer():
    from tf_embed_ops.distribute.keras_layer import ShardedEmbeddingLayer

    def train(layer):
        for keys, lengths, weights, static_ids in _batches():
            u = tf.RaggedTensor.from_row_lengths(tf.constant(keys), lengths)
            w = tf.RaggedTensor.from_row_lengths(tf.constant(weights), lengths)
            with tf.GradientTape() as tape:
                ids = {"u": u, "s": tf.constant(static_ids, tf.int64)}
                acts = layer(ids, weights={"u": w, "s": None}, training=True)
                loss = tf.reduce_sum(acts["u"] ** 2) + tf.reduce_sum(acts["s"])
            tape.gradient(loss, layer.trainable_variables)  # the updates hang on the trigger's gradient
        return layer

    features, table, _ = _features("sqrtn")
    sharded = train(ShardedEmbeddingLayer(features, num_shards=2))
    features, table1, _ = _features("sqrtn")
    single = train(te.keras.TPUEmbedding(features))
    a = sharded.embedding.dynamic_tables[table].export()
    b = single.dynamic_tables[table1].export()
    np.testing.assert_array_equal(a["keys"].numpy(), b["keys"].numpy())
    np.testing.assert_allclose(a["weights"].numpy(), b["weights"].numpy(), rtol=2e-6, atol=1e-6)
    assert int(sharded.embedding.dynamic_step.numpy()) == 3
