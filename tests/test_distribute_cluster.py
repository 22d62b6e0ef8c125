"""ShardedTPUEmbedding on in-process localhost clusters: 2 parameter servers x 2 workers, as TensorFlow's tests do.

In-process gRPC servers cannot be shut down and connect the whole process to their cluster, so every cluster
runs in a fresh Python process: this file, run as a script (`python test_distribute_cluster.py SCENARIO ARGS`).
The pytest side computes the expectations (the numpy model of tests/numpy_reference.py and the
single-process `tf_embed_ops.TPUEmbedding`) and compares.

* `first`: cluster 1 runs 4 synchronous rounds (SyncSparseAggregator, 2 workers per round) and checkpoints after
  round 2 and at the end; on a second embedding it restores a single-process checkpoint and runs scheduled
  steps one at a time.
* `resume`: cluster 2 (fresh process, fresh ports) restores the round-2 checkpoint and runs rounds 3-4.
* `chief`: the chief of a job whose 2 ps and 2 worker tasks are separate processes started from TF_CONFIG with
  `python -m tf_embed_ops.distribute.server`, as on real hosts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.sharded_support import table_values

emb_api = tf.tpu.experimental.embedding
ROUNDS, SAVE_AFTER, BATCH = 4, 2, 2
RTOL, ATOL = 2e-5, 2e-6


# ------------------------------------------------------------------------ shared by both sides


def _feature_config():
    video = emb_api.TableConfig(11, 3, name="video", combiner="mean", optimizer=emb_api.Adagrad(0.1))
    user = emb_api.TableConfig(
        3, 2, name="user", combiner="sqrtn", optimizer=emb_api.FTRL(0.1, l1_regularization_strength=0.01)
    )
    return {
        "watched": emb_api.FeatureConfig(video),
        "history": emb_api.FeatureConfig(video, max_sequence_length=3),
        "user": emb_api.FeatureConfig(user),
    }


def _initial(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"video": rng.normal(size=(11, 3)).astype(np.float32), "user": rng.normal(size=(3, 2)).astype(np.float32)}


def _worker_batch(round_: int, worker: int) -> dict:
    """Plain-Python batch: {feature: (rows, weights or None)}, with duplicates, empty rows and truncation."""
    rng = np.random.default_rng(1000 * round_ + worker)
    watched = [[int(i) for i in rng.integers(11, size=int(rng.integers(0, 4)))] for _ in range(BATCH)]
    watched[0] = [2, 2, 10]
    weights = [[float(w) for w in rng.uniform(0.5, 2.0, size=len(r))] for r in watched]
    history = [[int(i) for i in rng.integers(11, size=int(rng.integers(1, 6)))] for _ in range(BATCH)]
    users = [[int(i) for i in rng.integers(3, size=int(rng.integers(1, 3)))] for _ in range(BATCH)]
    return {"watched": (watched, weights), "history": (history, None), "user": (users, None)}


def _tf_args(batch: dict) -> tuple:
    watched, weights = batch["watched"]
    return (
        tf.ragged.constant(watched, tf.int64, ragged_rank=1).to_sparse(),
        tf.ragged.constant(weights, tf.float32, ragged_rank=1).to_sparse(),
        tf.ragged.constant(batch["history"][0], tf.int64, ragged_rank=1),
        tf.ragged.constant(batch["user"][0], tf.int64, ragged_rank=1),
    )


def _train_step(emb, watched, watched_weights, history, user):
    """loss = 0.5 * sum(act^2), so dL/dact = act."""
    emb.enqueue(
        {"watched": watched, "history": history, "user": user},
        weights={"watched": watched_weights, "history": None, "user": None},
    )
    with tf.GradientTape() as tape:
        acts = emb.dequeue()
        tape.watch(acts)
        loss = tf.add_n([0.5 * tf.reduce_sum(a**2) for a in acts.values()])
    emb.apply_gradients(tape.gradient(loss, acts))
    return loss


def _keras_parts(layer_cls, **kwargs) -> tuple:
    """A sharded or single-machine embedding layer + Dense(1) + Keras SGD, deterministic initial values."""
    import keras

    def rows_initializer(shape, dtype=tf.float32):  # every row [-1, 0, 1], whatever the shard's row count
        return tf.broadcast_to(tf.constant(np.linspace(-1, 1, 3), dtype), shape)

    table = emb_api.TableConfig(11, 3, name="video", combiner="mean", initializer=rows_initializer)
    layer = layer_cls({"watched": emb_api.FeatureConfig(table)}, emb_api.Adagrad(0.2), **kwargs)
    dense = keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros")
    dense.build((None, 3))
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(dense.trainable_variables + layer.trainable_variables)
    return layer, dense, optimizer


def _keras_step(layer, dense, optimizer, ids, y):
    """One Keras training step: the model's optimizer applies the trigger's gradient, which runs the update."""
    with tf.GradientTape() as tape:
        acts = layer({"watched": ids}, training=True)
        loss = tf.reduce_mean((dense(acts["watched"])[:, 0] - y) ** 2)
    variables = dense.trainable_variables + layer.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
    return loss


def _keras_batch(step: int) -> tuple:
    rng = np.random.default_rng(500 + step)
    rows = [[int(i) for i in rng.integers(11, size=int(rng.integers(1, 4)))] for _ in range(BATCH)]
    return tf.ragged.constant(rows, tf.int64, ragged_rank=1), tf.constant(rng.normal(size=BATCH), tf.float32)


# ------------------------------------------------------------------------ child process (one cluster each)


def _chief_of_separate_processes(args: dict) -> None:
    """The chief of a job whose ps/worker tasks are other processes (`python -m tf_embed_ops.distribute.server`)."""
    from tf_embed_ops.distribute import ShardedTPUEmbedding

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        emb = ShardedTPUEmbedding(_feature_config())
        emb.build(per_replica_batch_size=BATCH)
    init = _initial(11)
    for table, var in emb.embedding_tables.items():
        bounds = emb.shard_boundaries[table]
        for p, shard in enumerate(var.variables):
            shard.assign(init[table.name][bounds[p] : bounds[p + 1]])
    step = tf.function(lambda *a: _train_step(emb, *a))
    for worker in range(2):
        coordinator.schedule(step, args=_tf_args(_worker_batch(0, worker)))
        coordinator.join()
    devices = {t.name: [s.device for s in v.variables] for t, v in emb.embedding_tables.items()}
    np.savez(args["out"], **table_values(emb))
    with open(args["out"] + ".json", "w", encoding="utf-8") as f:
        json.dump({"sync": devices}, f)


def _table_consumers(function, args: tuple, emb) -> list:
    """(op type, requested device, shard device) for every op of the traced step that takes a shard's handle."""
    graph = function.get_concrete_function(*args).graph
    shard_device = {}
    for table, var in emb.embedding_tables.items():
        for slot_var in [var, *emb.slot_variables[table].values()]:
            for shard in slot_var.variables:
                shard_device[id(shard.handle)] = shard.device
    placeholders = {}
    for external, internal in graph.captures:
        if id(external) in shard_device:
            placeholders[internal.ref()] = shard_device[id(external)]
    consumers = []
    for op in graph.get_operations():
        for tensor in op.inputs:
            if tensor.ref() in placeholders:
                consumers.append((op.type, op.device, placeholders[tensor.ref()]))
    return consumers


def _child(scenario: str, args: dict) -> None:
    from tf_embed_ops.distribute import ShardedTPUEmbedding, SyncSparseAggregator, create_local_cluster

    if scenario == "chief":
        _chief_of_separate_processes(args)
        return
    strategy = create_local_cluster(num_workers=2, num_ps=2)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    results, devices = {}, {}

    with strategy.scope():
        emb = ShardedTPUEmbedding(_feature_config())
        emb.build(per_replica_batch_size=BATCH)
        aggregator = SyncSparseAggregator(emb, replicas_to_aggregate=2)
    checkpoint = tf.train.Checkpoint(embedding=emb, aggregator=aggregator)
    devices["sync"] = {t.name: [s.device for s in v.variables] for t, v in emb.embedding_tables.items()}
    if scenario == "first":
        init = _initial(11)
        for table, var in emb.embedding_tables.items():
            bounds = emb.shard_boundaries[table]
            for p, shard in enumerate(var.variables):
                shard.assign(init[table.name][bounds[p] : bounds[p + 1]])
        first_round = 0
    else:
        checkpoint.read(args["restore"]).assert_consumed()
        aggregator.initialize_steps()
        first_round = SAVE_AFTER

    worker_step = tf.function(lambda *a: _train_step(emb, *a))
    if scenario == "first":
        devices["consumers"] = _table_consumers(worker_step, _tf_args(_worker_batch(0, 0)), emb)
    for round_ in range(first_round, ROUNDS):
        for worker in range(2):
            coordinator.schedule(worker_step, args=_tf_args(_worker_batch(round_, worker)))
        aggregator.take_and_apply(timeout=120)
        if scenario == "first" and round_ + 1 == SAVE_AFTER:
            checkpoint.write(args["mid"])
    coordinator.join()
    if scenario == "first":
        checkpoint.write(args["final"])
    for key, value in table_values(emb).items():
        results[f"sync/{key}"] = value
    results["sync/global_step"] = aggregator.global_step.numpy()

    if scenario == "first":
        # A single-process checkpoint restored into a second sharded embedding, then plain scheduled steps,
        # one at a time (no aggregator: each step updates the shards directly).
        with strategy.scope():
            plain = ShardedTPUEmbedding(_feature_config())
            plain.build(per_replica_batch_size=BATCH)
        tf.train.Checkpoint(embedding=plain).read(args["single"]).assert_consumed()
        for key, value in table_values(plain).items():
            results[f"restored/{key}"] = value
        plain_step = tf.function(lambda *a: _train_step(plain, *a))
        devices["consumers"] += _table_consumers(plain_step, _tf_args(_worker_batch(ROUNDS, 0)), plain)
        for worker in range(2):
            coordinator.schedule(plain_step, args=_tf_args(_worker_batch(ROUNDS, worker)))
            coordinator.join()
        for key, value in table_values(plain).items():
            results[f"sequential/{key}"] = value

        # Keras 3 model parts in a custom step: scheduled, run through strategy.run (Keras optimizers need a
        # replica context), one step at a time.
        from tf_embed_ops.distribute.keras_layer import ShardedEmbeddingLayer

        with strategy.scope():
            layer, dense, optimizer = _keras_parts(ShardedEmbeddingLayer)
        keras_step = tf.function(lambda ids, y: strategy.run(_keras_step, args=(layer, dense, optimizer, ids, y)))
        for step in range(2):
            coordinator.schedule(keras_step, args=_keras_batch(step))
            coordinator.join()
        results["keras/video"] = table_values(layer.embedding)["video"]
        results["keras/dense_kernel"] = dense.kernel.numpy()
    np.savez(args["out"], **results)
    with open(args["out"] + ".json", "w", encoding="utf-8") as f:
        json.dump(devices, f)


# ------------------------------------------------------------------------ pytest side


def _child_env(**extra) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]), **extra)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _run_child(scenario: str, args: dict, env: dict | None = None) -> tuple:
    env = env or _child_env()
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), scenario, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"cluster scenario {scenario!r} failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
    with open(args["out"] + ".json", encoding="utf-8") as f:
        devices = json.load(f)
    return dict(np.load(args["out"])), devices


def _single_process(values: dict):
    import tf_embed_ops

    emb = tf_embed_ops.TPUEmbedding(_feature_config())
    emb.build(per_replica_batch_size=BATCH)
    for table, var in emb.embedding_tables.items():
        var.assign(values[table.name])
    return emb


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs both clusters once for all tests below."""
    tmp = tmp_path_factory.mktemp("cluster")
    # The single-process checkpoint the first cluster restores: other initial values, one step trained.
    single = _single_process(_initial(23))
    single_step = tf.function(lambda *a: _train_step(single, *a))
    single_step(*_tf_args(_worker_batch(99, 0)))
    single_path = tf.train.Checkpoint(embedding=single).write(str(tmp / "single"))
    single_values = table_values(single)
    for worker in range(2):  # what the cluster's sequential steps must reproduce
        single_step(*_tf_args(_worker_batch(ROUNDS, worker)))

    paths = {"mid": str(tmp / "mid"), "final": str(tmp / "final"), "single": single_path}
    first, first_devices = _run_child("first", dict(paths, out=str(tmp / "first.npz")))
    resumed, _ = _run_child("resume", {"restore": paths["mid"], "out": str(tmp / "resume.npz")})
    import tf_embed_ops.keras

    layer, dense, optimizer = _keras_parts(tf_embed_ops.keras.TPUEmbedding)
    for step in range(2):
        _keras_step(layer, dense, optimizer, *_keras_batch(step))
    return {
        "first": first,
        "devices": first_devices,
        "resumed": resumed,
        "paths": paths,
        "single_restored": single_values,
        "single_sequential": table_values(single),
        "single_keras": {
            "video": tf.convert_to_tensor(layer.embedding_tables[next(iter(layer.embedding_tables))]).numpy(),
            "dense_kernel": dense.kernel.numpy(),
        },
    }


@pytest.fixture(scope="module")
def separate_processes(tmp_path_factory):
    """A job as on real hosts: 2 ps + 2 worker server processes started from TF_CONFIG, and a chief process."""
    from tf_embed_ops.distribute.local_cluster import _free_port

    tmp = tmp_path_factory.mktemp("processes")
    cluster = {
        "chief": [f"localhost:{_free_port()}"],
        "ps": [f"localhost:{_free_port()}" for _ in range(2)],
        "worker": [f"localhost:{_free_port()}" for _ in range(2)],
    }
    servers = []
    try:
        for job in ("ps", "worker"):
            for index in range(2):
                tf_config = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
                servers.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "tf_embed_ops.distribute.server"],
                        env=_child_env(TF_CONFIG=tf_config),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                        text=True,
                    )
                )
        # Start the chief only once every task serves (the server prints one line then): a task that failed to
        # start is reported here, where the chief would wait for it forever.
        for server in servers:
            line = server.stdout.readline()
            assert "server started" in line, f"a ps/worker task did not start (rc {server.poll()}): {line!r}"
        chief_config = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
        values, devices = _run_child("chief", {"out": str(tmp / "chief.npz")}, env=_child_env(TF_CONFIG=chief_config))
    finally:
        for server in servers:
            server.kill()
            server.wait(timeout=60)
    single = _single_process(_initial(11))
    for worker in range(2):
        _train_step(single, *_tf_args(_worker_batch(0, worker)))
    return values, devices, table_values(single)


pytestmark = pytest.mark.slow


def test_separate_processes_from_tf_config_train_like_one_process(separate_processes):
    values, devices, expected = separate_processes
    ps = [f"/job:ps/replica:0/task:{p}/device:CPU:0" for p in range(2)]
    assert devices["sync"] == {"video": ps, "user": ps}
    for key, value in expected.items():
        np.testing.assert_allclose(values[key], value, rtol=1e-6, atol=1e-7, err_msg=key)


def _reference_sync_rounds() -> dict:
    from tests.numpy_reference import RefFeature, RefTable
    from tests.numpy_reference import ref_activations as activations
    from tests.numpy_reference import ref_row_gradients as row_gradients

    fc = _feature_config()
    init = _initial(11)
    tables = {f.table.name: RefTable(init[f.table.name], f.table.optimizer) for f in fc.values()}
    for round_ in range(ROUNDS):
        grads = {name: {} for name in tables}
        for worker in range(2):
            batch = _worker_batch(round_, worker)
            for name, feature in fc.items():
                rows, weights = batch[name]
                ref = RefFeature(feature.table.name, rows, weights, feature.max_sequence_length)
                act = activations(ref, tables[feature.table.name].params, feature.table.combiner)
                row_gradients(ref, act, feature.table.combiner, grads[feature.table.name])
        for name, table in tables.items():
            table.apply(grads[name], table.opt.learning_rate)
    out = {}
    for name, table in tables.items():
        out[name] = table.params
        for slot, value in table.slots.items():
            out[f"{name}/{slot}"] = value
    return out


def test_shards_live_on_their_parameter_servers(runs):
    ps = [f"/job:ps/replica:0/task:{p}/device:CPU:0" for p in range(2)]
    assert runs["devices"]["sync"] == {"video": ps, "user": ps}


def test_tables_are_only_touched_by_our_ops_on_their_own_server(runs):
    # No read or gather of a table or slot in the worker step: only the forward and the fused update take
    # the shards' handles, each placed on the shard's own parameter server. No table crosses the network.
    consumers = runs["devices"]["consumers"]
    # The synchronous step only looks up (its update goes to the accumulators); the plain one does both.
    assert {c[0] for c in consumers} == {"TfEmbed>EmbeddingActivations", "TfEmbed>SendTPUEmbeddingGradients"}
    for op_type, requested, shard_device in consumers:
        assert op_type in ("TfEmbed>EmbeddingActivations", "TfEmbed>SendTPUEmbeddingGradients"), op_type
        same = tf.DeviceSpec.from_string(requested) == tf.DeviceSpec.from_string(shard_device)
        assert same, (requested, shard_device)


def test_synchronous_rounds_match_the_reference(runs):
    expected = _reference_sync_rounds()
    for key, value in expected.items():
        np.testing.assert_allclose(runs["first"][f"sync/{key}"], value, rtol=RTOL, atol=ATOL, err_msg=key)
    assert int(runs["first"]["sync/global_step"]) == ROUNDS


def test_resumed_job_on_a_fresh_cluster_is_identical(runs):
    # Same shards, same op order; each accumulator adds two workers' rows (a + b == b + a): bit-identical.
    first, resumed = runs["first"], runs["resumed"]
    sync_keys = sorted(k for k in first if k.startswith("sync/"))
    assert sync_keys == sorted(resumed)
    for key in sync_keys:
        np.testing.assert_array_equal(resumed[key], first[key], err_msg=key)


def test_sharded_checkpoint_restores_into_the_single_process_class(runs):
    import tf_embed_ops

    emb = tf_embed_ops.TPUEmbedding(_feature_config())
    emb.build(per_replica_batch_size=BATCH)
    tf.train.Checkpoint(embedding=emb).read(runs["paths"]["final"]).assert_existing_objects_matched()
    for key, value in table_values(emb).items():
        np.testing.assert_array_equal(value, runs["first"][f"sync/{key}"], err_msg=key)


def test_single_process_checkpoint_restores_into_the_cluster(runs):
    for key, value in runs["single_restored"].items():
        np.testing.assert_array_equal(runs["first"][f"restored/{key}"], value, err_msg=key)


def test_keras_custom_step_matches_the_single_machine_layer(runs):
    for key, value in runs["single_keras"].items():
        np.testing.assert_allclose(runs["first"][f"keras/{key}"], value, rtol=1e-6, atol=1e-7, err_msg=key)
    assert not np.allclose(runs["single_keras"]["video"], np.linspace(-1, 1, 3)[None, :])


def test_scheduled_steps_match_the_single_process_class(runs):
    # Only the forward pass's cross-shard summation order differs from the single-process run.
    for key, value in runs["single_sequential"].items():
        np.testing.assert_allclose(runs["first"][f"sequential/{key}"], value, rtol=1e-6, atol=1e-7, err_msg=key)


if __name__ == "__main__":
    _child(sys.argv[1], json.loads(sys.argv[2]))
