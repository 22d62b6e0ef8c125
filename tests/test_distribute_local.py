"""ShardedTPUEmbedding and SyncSparseAggregator on one machine (shards on the local device, no cluster).

The sharded math (id partition, per-shard configs, partial activations, per-shard fused updates, accumulators)
is checked against the independent numpy model in tests/numpy_reference.py, and checkpoints against the
single-process class.  tests/test_distribute_cluster.py runs the same code on an in-process cluster.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops
from tests.numpy_reference import RefFeature, RefTable
from tests.numpy_reference import ref_activations as activations
from tests.numpy_reference import ref_row_gradients as row_gradients
from tests.sharded_support import assign_tables
from tf_embed_ops.distribute import ShardedTPUEmbedding, SyncSparseAggregator

emb_api = tf.tpu.experimental.embedding
RTOL, ATOL = 2e-5, 2e-6
OPTIMIZERS = {
    "sgd": lambda: emb_api.SGD(0.1),
    "adagrad": lambda: emb_api.Adagrad(0.1, initial_accumulator_value=0.2),
    "adam_non_lazy": lambda: emb_api.Adam(0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-3, lazy_adam=False),
    "ftrl": lambda: emb_api.FTRL(0.1, l1_regularization_strength=0.01, beta=0.1, initial_accumulator_value=0.3),
    # A per-row ([rows, 1]) slot, sharded like its table.
    "rowwise_adagrad": lambda: tf_embed_ops.optimizers.RowWiseAdagrad(0.1, weight_decay=0.05),
}


def _feature_config(optimizer_name: str, combiner: str):
    """Two tables: `video` (11 rows: 4/4/3 over three shards) shared by two features, `user` (2 rows: two shards)."""
    video = emb_api.TableConfig(11, 3, name="video", combiner=combiner, optimizer=OPTIMIZERS[optimizer_name]())
    user = emb_api.TableConfig(2, 2, name="user", combiner=combiner, optimizer=emb_api.Adagrad(0.2))
    return {
        "watched": emb_api.FeatureConfig(video),
        "history": emb_api.FeatureConfig(video, max_sequence_length=3),
        "user": emb_api.FeatureConfig(user),
    }


def _initial(rng) -> dict:
    return {"video": rng.normal(size=(11, 3)).astype(np.float32), "user": rng.normal(size=(2, 2)).astype(np.float32)}


def _full(var) -> np.ndarray:
    return tf.convert_to_tensor(var).numpy()


def _batches(rng, n: int, batch: int = 3) -> list:
    """n batches: {feature: (RefFeature, tf input, tf weights)} with duplicates, empty rows, truncation."""
    out = []
    for _ in range(n):
        rows = [[int(i) for i in rng.integers(11, size=int(rng.integers(0, 4)))] for _ in range(batch)]
        rows[0] = [3, 3, 10]
        weights = [[float(w) for w in rng.uniform(0.5, 2.0, size=len(r))] for r in rows]
        history = [[int(i) for i in rng.integers(11, size=int(rng.integers(1, 6)))] for _ in range(batch)]
        users = [[int(rng.integers(2))] for _ in range(batch)]
        out.append(
            {
                "watched": (
                    RefFeature("video", rows, weights),
                    tf.ragged.constant(rows, tf.int64, ragged_rank=1).to_sparse(),
                    tf.ragged.constant(weights, tf.float32, ragged_rank=1).to_sparse(),
                ),
                "history": (
                    RefFeature("video", history, None, max_sequence_length=3),
                    tf.ragged.constant(history, tf.int64, ragged_rank=1),
                    None,
                ),
                "user": (RefFeature("user", users), tf.constant([u[0] for u in users], tf.int64), None),
            }
        )
    return out


def _step(emb, batch, apply=None):
    """One training step of loss = 0.5 * sum(act^2) on emb; returns the activations."""
    features = {k: v[1] for k, v in batch.items()}
    weights = {k: v[2] for k, v in batch.items()}
    emb.enqueue(features, weights=weights)
    with tf.GradientTape() as tape:
        acts = emb.dequeue()
        tape.watch(acts)
        loss = tf.add_n([0.5 * tf.reduce_sum(a**2) for a in acts.values()])
    (apply or emb.apply_gradients)(tape.gradient(loss, acts))
    return acts


def _reference_grads(ref_tables, feature_config, batch) -> dict:
    grads = {name: {} for name in ref_tables}
    for k, (ref, _, _) in batch.items():
        table = feature_config[k].table
        act = activations(ref, ref_tables[table.name].params, table.combiner)
        row_gradients(ref, act, table.combiner, grads[table.name])  # dL/dact = act
    return grads


def _check(emb, ref_tables) -> None:
    for table, var in emb.embedding_tables.items():
        ref = ref_tables[table.name]
        np.testing.assert_allclose(_full(var), ref.params, rtol=RTOL, atol=ATOL, err_msg=table.name)
        for slot, slot_var in emb.slot_variables[table].items():
            np.testing.assert_allclose(_full(slot_var), ref.slots[slot], rtol=RTOL, atol=ATOL, err_msg=slot)


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_sharded_steps_match_reference_and_single_process(optimizer_name, combiner):
    rng = np.random.default_rng(7)
    init = _initial(rng)
    batches = _batches(rng, 3)
    fc = _feature_config(optimizer_name, combiner)
    sharded = ShardedTPUEmbedding(fc, num_shards=3)
    sharded.build(per_replica_batch_size=3)
    assign_tables(sharded, init)
    single_fc = _feature_config(optimizer_name, combiner)
    single = tf_embed_ops.TPUEmbedding(single_fc)
    single.build(per_replica_batch_size=3)
    assign_tables(single, init)
    ref_tables = {
        t.name: RefTable(init[t.name], t.optimizer) for t in {f.table.name: f.table for f in fc.values()}.values()
    }
    assert [len(v.variables) for v in sharded.embedding_tables.values()] == [3, 2]

    for batch in batches:
        grads = _reference_grads(ref_tables, fc, batch)
        acts = _step(sharded, batch)
        single_acts = _step(single, batch)
        for k in acts:
            np.testing.assert_allclose(acts[k].numpy(), single_acts[k].numpy(), rtol=1e-6, atol=1e-7)
        for name, table in ref_tables.items():
            table.apply(grads[name], table.opt.learning_rate)
    _check(sharded, ref_tables)
    # Same rows, same per-row accumulation order: only the forward's cross-shard summation order differs.
    for (table, var), single_var in zip(
        sharded.embedding_tables.items(), single.embedding_tables.values(), strict=True
    ):
        np.testing.assert_allclose(_full(var), single_var.numpy(), rtol=1e-6, atol=1e-7, err_msg=table.name)


def test_sharded_steps_in_tf_function_with_dynamic_learning_rate():
    lr = tf.Variable(0.1)
    video = emb_api.TableConfig(11, 3, name="video", combiner="mean", optimizer=emb_api.SGD(lambda: lr))
    fc = {"watched": emb_api.FeatureConfig(video)}
    emb = ShardedTPUEmbedding(fc, num_shards=3)
    emb.build(per_replica_batch_size=2)
    init = np.arange(33, dtype=np.float32).reshape(11, 3) / 10
    assign_tables(emb, {"video": init})
    ref = RefTable(init, video.optimizer)

    @tf.function
    def step(ids):
        emb.enqueue({"watched": ids})
        acts = emb.dequeue()
        emb.apply_gradients({"watched": tf.ones_like(acts["watched"])})

    for n, rows in enumerate([[[1, 5], [9, 10, 10]], [[0], [4, 7]]]):
        lr.assign(0.1 * (n + 1))
        step(tf.ragged.constant(rows, tf.int64))
        grads = {}
        row_gradients(RefFeature("video", rows), np.ones((2, 3)), "mean", grads)
        ref.apply(grads, 0.1 * (n + 1))
    np.testing.assert_allclose(_full(emb.embedding_tables[video]), ref.params, rtol=RTOL, atol=ATOL)


def _checkpoint_values(emb) -> dict:
    out = {}
    for table, var in emb.embedding_tables.items():
        out[table.name] = _full(var)
        for slot, slot_var in emb.slot_variables[table].items():
            out[f"{table.name}/{slot}"] = _full(slot_var)
    return out


def _trained(cls, seed: int, optimizer_name: str = "adam_non_lazy", **kwargs):
    rng = np.random.default_rng(seed)
    emb = cls(_feature_config(optimizer_name, "mean"), **kwargs)
    emb.build(per_replica_batch_size=3)
    assign_tables(emb, _initial(rng))
    for batch in _batches(rng, 2):
        _step(emb, batch)
    return emb


@pytest.mark.parametrize("optimizer_name", ["adam_non_lazy", "rowwise_adagrad"])  # slots [rows, dim] and [rows, 1]
@pytest.mark.parametrize("source_shards,target_shards", [(3, None), (None, 3), (3, 2), (2, 3)])
def test_checkpoints_move_between_sharded_and_single_process(tmp_path, source_shards, target_shards, optimizer_name):
    def make(shards, seed):
        if shards is None:
            return _trained(tf_embed_ops.TPUEmbedding, seed, optimizer_name)
        return _trained(ShardedTPUEmbedding, seed, optimizer_name, num_shards=shards)

    source = make(source_shards, seed=1)
    path = tf.train.Checkpoint(embedding=source).write(str(tmp_path / "ckpt"))
    target = make(target_shards, seed=2)  # different values everywhere before the restore
    before = _checkpoint_values(target)
    expected = _checkpoint_values(source)
    assert any(not np.array_equal(before[k], expected[k]) for k in expected)
    tf.train.Checkpoint(embedding=target).read(path).assert_consumed()
    got = _checkpoint_values(target)
    assert got.keys() == expected.keys()
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


def test_sharded_checkpoint_keys_are_the_single_process_keys(tmp_path):
    sharded = tf.train.Checkpoint(embedding=_trained(ShardedTPUEmbedding, 0, num_shards=3))
    single = tf.train.Checkpoint(embedding=_trained(tf_embed_ops.TPUEmbedding, 0))
    keys = {}
    for name, ckpt in (("sharded", sharded), ("single", single)):
        path = ckpt.write(str(tmp_path / name))
        keys[name] = {k: tuple(s) for k, s in tf.train.list_variables(path) if k != "_CHECKPOINTABLE_OBJECT_GRAPH"}
    assert keys["sharded"] == keys["single"]
    assert keys["sharded"]["embedding/video/.ATTRIBUTES/VARIABLE_VALUE"] == (11, 3)
    assert "embedding/video.Smomenta/.ATTRIBUTES/VARIABLE_VALUE" in keys["sharded"]


def test_restore_before_build_fills_the_new_shards(tmp_path):
    source = _trained(tf_embed_ops.TPUEmbedding, 3)
    path = tf.train.Checkpoint(embedding=source).write(str(tmp_path / "ckpt"))
    target = ShardedTPUEmbedding(_feature_config("adam_non_lazy", "mean"), num_shards=3)
    status = tf.train.Checkpoint(embedding=target).read(path)
    target.build(per_replica_batch_size=3)  # deferred restoration fills the shards as they are tracked
    status.assert_consumed()
    expected = _checkpoint_values(source)
    got = _checkpoint_values(target)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_shards": 0}, "num_shards"),
        ({"num_shards": True}, "num_shards"),
        ({"strategy": "not a strategy"}, "ParameterServerStrategy"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShardedTPUEmbedding(_feature_config("sgd", "sum"), **kwargs)


def test_rejects_other_strategies():
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope(), pytest.raises(ValueError, match="OneDeviceStrategy"):
        ShardedTPUEmbedding(_feature_config("sgd", "sum"))


def test_rejects_slot_variable_creation_fn():
    optimizer = emb_api.Adagrad(0.1, slot_variable_creation_fn=lambda table, names, inits: {})
    fc = {"f": emb_api.FeatureConfig(emb_api.TableConfig(5, 2, name="t", optimizer=optimizer))}
    with pytest.raises(ValueError, match="slot_variable_creation_fn"):
        ShardedTPUEmbedding(fc, num_shards=2)


def test_out_of_range_id_is_rejected_and_changes_nothing():
    emb = ShardedTPUEmbedding(_feature_config("adagrad", "sum"), num_shards=3)
    emb.build(per_replica_batch_size=1)
    before = _checkpoint_values(emb)
    features = {
        "watched": tf.sparse.from_dense(tf.constant([[1, 11]], tf.int64)),
        "history": tf.ragged.constant([[2]], tf.int64),
        "user": tf.constant([0], tf.int64),
    }
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[0, 11\)"):
        emb.enqueue(features)
        acts = emb.dequeue()
        emb.apply_gradients({k: tf.ones_like(v) for k, v in acts.items()})
    after = _checkpoint_values(emb)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)


# ------------------------------------------------------------------------------------- synchronous rounds


def _sync_setup(seed: int = 5):
    rng = np.random.default_rng(seed)
    init = _initial(rng)
    fc = _feature_config("adagrad", "sqrtn")
    emb = ShardedTPUEmbedding(fc, num_shards=3)
    emb.build(per_replica_batch_size=3)
    assign_tables(emb, init)
    ref_tables = {
        t.name: RefTable(init[t.name], t.optimizer) for t in {f.table.name: f.table for f in fc.values()}.values()
    }
    return rng, fc, emb, ref_tables


def test_sync_rounds_apply_the_sum_of_the_workers_gradients_once():
    rng, fc, emb, ref_tables = _sync_setup()
    aggregator = SyncSparseAggregator(emb, replicas_to_aggregate=2)
    for round_ in range(3):
        worker_batches = _batches(rng, 2)
        grads = {name: {} for name in ref_tables}
        for batch in worker_batches:  # both workers read the tables of this round
            for name, g in _reference_grads(ref_tables, fc, batch).items():
                for row, value in g.items():
                    grads[name][row] = grads[name].get(row, 0.0) + value
        before = _checkpoint_values(emb)
        for batch in worker_batches:
            _step(emb, batch)
        # Workers only fed the accumulators: the tables move at the chief's take.
        for key, value in _checkpoint_values(emb).items():
            np.testing.assert_array_equal(value, before[key], err_msg=key)
        assert int(aggregator.take_and_apply(timeout=30)) == round_ + 1
        for name, table in ref_tables.items():
            table.apply(grads[name], table.opt.learning_rate)
        _check(emb, ref_tables)


def test_stale_gradient_is_dropped():
    rng, fc, emb, ref_tables = _sync_setup()
    aggregator = SyncSparseAggregator(emb, replicas_to_aggregate=1)
    late_batch, fresh_batch = _batches(rng, 2)
    stale_step = int(aggregator.global_step.numpy())
    _step(emb, fresh_batch)
    aggregator.take_and_apply(timeout=30)  # the round moves on without the late worker
    after_round = _checkpoint_values(emb)
    # The late worker computed its gradient at the old step; the accumulators drop it.
    _step(emb, late_batch, apply=lambda g: aggregator.apply_gradients(g, local_step=stale_step))
    for per_server in aggregator._server_accumulators():
        for acc in per_server:
            assert int(acc.num_accumulated()) == 0
    with pytest.raises(tf.errors.DeadlineExceededError):
        aggregator.take_and_apply(timeout=0.2)
    for key, value in _checkpoint_values(emb).items():
        np.testing.assert_array_equal(value, after_round[key], err_msg=key)
    assert int(aggregator.global_step.numpy()) == 1


@pytest.mark.parametrize(
    "kwargs,match",
    [({"replicas_to_aggregate": 0}, "replicas_to_aggregate"), ({"replicas_to_aggregate": 1.5}, "replicas")],
)
def test_aggregator_bad_arguments(kwargs, match):
    emb = ShardedTPUEmbedding(_feature_config("sgd", "sum"), num_shards=2)
    emb.build(per_replica_batch_size=1)
    with pytest.raises(ValueError, match=match):
        SyncSparseAggregator(emb, **kwargs)
    with pytest.raises(ValueError, match="ShardedTPUEmbedding"):
        SyncSparseAggregator(tf_embed_ops.TPUEmbedding(_feature_config("sgd", "sum")), 1)
    SyncSparseAggregator(emb, 1)
    with pytest.raises(ValueError, match="already has"):
        SyncSparseAggregator(emb, 1)
