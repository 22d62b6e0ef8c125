"""The collective mode's parts that need no cluster: where rows live, the routing around an all-to-all (against
numpy), the argument checks of `fit` and of `launch --collective` (refused before anything starts)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tf_embed_ops.distribute.collective import exchange, layout
from tf_embed_ops.distribute.collective.loop import check_arguments, worker_index
from tf_embed_ops.distribute.launch import local_collective_spec, main
from tf_embed_ops.distribute.server import is_loopback_address


@pytest.mark.parametrize("vocabulary,workers", [(11, 1), (11, 2), (11, 4), (12, 4), (4, 4), (5, 3)])
def test_mod_sharding_places_every_row_once_as_tpu_embedding_v2(vocabulary, workers):
    full = np.arange(vocabulary)
    shards = [full[layout.shard_slice(workers, w)] for w in range(workers)]
    assert [len(s) for s in shards] == [layout.shard_rows(vocabulary, workers, w) for w in range(workers)]
    for w, shard in enumerate(shards):
        # Row r lives on worker r % N at local row r // N.
        assert all(r % workers == w and shard[r // workers] == r for r in shard)
    assert sorted(np.concatenate(shards).tolist()) == full.tolist()


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: layout.shard_rows(10, 0, 0), "`num_workers` must be an int >= 1; got 0"),
        (lambda: layout.shard_rows(10, 2, 2), r"`worker` must be an int in \[0, 2\); got 2"),
        (lambda: layout.shard_slice(True, 0), "`num_workers` must be an int >= 1; got True"),
        (lambda: exchange.Exchange(0, 10.0), "`num_workers` must be an int >= 1; got 0"),
        (lambda: exchange.Exchange(2, 0), "`timeout_seconds` must be > 0; got 0"),
    ],
)
def test_layout_and_exchange_refuse_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("ids", [[], [5], [4, 1, 7, 1, 0, 9, 4, 2], list(range(12))])
def test_route_place_unroute_keep_each_destinations_values_in_input_order(workers, ids):
    ids = np.array(ids, np.int64)
    r = exchange.route(tf.constant(ids % workers), workers)
    counts = np.bincount(ids % workers, minlength=workers)
    np.testing.assert_array_equal(r.counts.numpy(), counts)
    capacity = int(counts.max()) if len(ids) else 0
    buffer = exchange.place(tf.constant(ids), r, tf.constant(capacity, tf.int64), workers, -1).numpy()
    assert buffer.shape == (workers, capacity)
    for d in range(workers):
        mine = ids[ids % workers == d]  # numpy reference: a stable filter
        np.testing.assert_array_equal(buffer[d, : len(mine)], mine)
        assert (buffer[d, len(mine) :] == -1).all()
    np.testing.assert_array_equal(exchange.unroute(tf.constant(buffer), r).numpy(), ids)
    rows = np.stack([ids, -ids], axis=1).astype(np.float32)  # rows travel the same way
    placed = exchange.place(tf.constant(rows), r, tf.constant(capacity, tf.int64), workers, 0.0)
    np.testing.assert_array_equal(exchange.unroute(placed, r).numpy(), rows)


def test_the_exchange_of_one_worker_passes_values_through():
    one = exchange.Exchange(1, 5.0)
    x = tf.constant([[3, 4]], tf.int64)
    np.testing.assert_array_equal(one.all_to_all(x).numpy(), x.numpy())
    np.testing.assert_array_equal(one.all_reduce(x, "Max").numpy(), x.numpy())
    np.testing.assert_array_equal(one.all_gather(x).numpy(), x.numpy())


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(epochs=0), "`epochs` must be an int >= 1; got 0"),
        (dict(steps_per_epoch=None), "`steps_per_epoch` is required"),
        (dict(steps_per_epoch=2.0), "`steps_per_epoch` must be an int >= 1; got 2.0"),
        (dict(initial_epoch=-1), "`initial_epoch` must be an int >= 0; got -1"),
        (dict(max_ids_per_worker=0), "`max_ids_per_worker` must be an int >= 1; got 0"),
        (dict(timeout_seconds=0), "`timeout_seconds` must be a number > 0; got 0"),
        (dict(timeout_seconds="60"), "`timeout_seconds` must be a number > 0; got '60'"),
        (dict(verbose=3), "`verbose` must be 0, 1, 2 or 'auto'; got 3"),
    ],
)
def test_fit_arguments_are_checked_before_anything_is_built(kwargs, match):
    arguments = dict(
        epochs=1, steps_per_epoch=2, verbose="auto", initial_epoch=0, max_ids_per_worker=None, timeout_seconds=60.0
    )
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=match):
        check_arguments(**arguments)


def test_worker_index_reads_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert worker_index() == (0, 1)
    cluster = {"worker": ["localhost:1", "localhost:2", "localhost:3"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 2}}))
    assert worker_index() == (2, 3)


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--collective", "--ps", "1", "--", "true"], "--ps 1 with --collective: a collective job has no parameter"),
        (["--collective", "--workers", "0", "--", "true"], "`num_workers` must be an int >= 1; got 0"),
        (["--collective", "--failure-grace", "-1", "--", "true"], "--failure-grace must be >= 0; got -1.0"),
        (["--collective"], "after `--`"),
    ],
)
def test_launch_collective_rejects_bad_arguments_before_starting_anything(argv, match, capsys):
    assert main(argv) == 2
    assert match in capsys.readouterr().err


def test_local_collective_spec_is_workers_only_on_loopback():
    spec = local_collective_spec(4)
    assert list(spec) == ["worker"] and len(spec["worker"]) == 4
    assert all(is_loopback_address(a) for a in spec["worker"])
    assert len({a.rsplit(":", 1)[1] for a in spec["worker"]}) == 4


@pytest.mark.slow
@pytest.mark.parametrize("code", [0, 3])
def test_launch_collective_runs_the_command_on_every_worker_with_its_tf_config(tmp_path, code):
    # Worker 1 exits with `code`; the launcher exits with the first failure's status (0 when all succeed). The
    # workers share the launcher's stdout: each writes its line in one write(2), which a pipe keeps whole (print
    # under PYTHONUNBUFFERED=1 writes the text and its newline apart, and two workers' lines could interleave).
    program = (
        f"import json, os, sys; c = json.loads(os.environ['TF_CONFIG']); "
        f"os.write(1, (json.dumps(c) + chr(10)).encode()); "
        f"sys.exit({code} if c['task']['index'] == 1 else 0)"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tf_embed_ops.distribute.launch",
            "--workers",
            "3",
            "--collective",
            "--",
            sys.executable,
            "-c",
            program,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert result.returncode == code, result.stderr
    configs = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(c["task"]["index"] for c in configs) == [0, 1, 2]
    assert all(c["task"]["type"] == "worker" and list(c["cluster"]) == ["worker"] for c in configs)
    assert len({json.dumps(c["cluster"]) for c in configs}) == 1


@pytest.mark.parametrize("option", [["--dynamic"], ["--storage-dtype", "bfloat16"], ["--config", "x.pbtxt"]])
def test_the_ctr_example_refuses_collective_with_options_it_does_not_train(option, capsys):
    from tf_embed_ops.examples import ctr

    with pytest.raises(SystemExit) as exit_info:
        ctr.main(["--collective", *option])
    assert exit_info.value.code == 2
    assert "--collective trains the example's float32 static tables" in capsys.readouterr().err


def _layer(tables_and_features: dict, optimizer=None):
    import tf_embed_ops as te

    emb = tf.tpu.experimental.embedding
    features = {name: emb.FeatureConfig(table) for name, table in tables_and_features.items()}
    return te.keras.TPUEmbedding(features, optimizer or emb.Adagrad(0.1))


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_each_worker_loads_its_mod_shard_of_the_layers_tables_and_slots(workers):
    from tf_embed_ops.distribute.collective.shards import LayerShards

    emb = tf.tpu.experimental.embedding
    layer = _layer({"a": emb.TableConfig(11, 3, name="t"), "b": emb.TableConfig(4, 2, name="u")})
    rng = np.random.default_rng(0)
    full = {}
    for table, var in layer.embedding_tables.items():
        full[table.name] = rng.standard_normal(tuple(var.shape)).astype(np.float32)
        var.assign(full[table.name])
        slot = layer.slot_variables[table]["accumulators"]
        full[table.name + "/acc"] = rng.random(tuple(slot.shape)).astype(np.float32)
        slot.assign(full[table.name + "/acc"])
    for worker in range(workers):
        shards = LayerShards(layer, exchange.Exchange(workers, 10.0), worker)
        shards.load()
        for name in ("t", "u"):
            variables = shards.shard.variables[name]
            np.testing.assert_array_equal(variables["parameters"].numpy(), full[name][worker::workers])
            np.testing.assert_array_equal(variables["accumulators"].numpy(), full[name + "/acc"][worker::workers])


def test_tables_the_collective_mode_cannot_shard_are_refused_naming_layer_and_table():
    # Dynamic tables are sharded by key (tests/test_collective_training.py); those whose shards would count, admit
    # or evict keys differently from one process are refused.
    import tf_embed_ops as te
    from tf_embed_ops.distribute.collective.shards import LayerShards

    emb = tf.tpu.experimental.embedding
    cases = [
        ({"a": emb.TableConfig(3, 2, name="small")}, "table 'small': vocabulary_size 3 is smaller than the number"),
        (
            {
                "a": te.DynamicTableConfig(
                    "users", dim=2, optimizer=te.optimizers.Adagrad(0.1), admission=te.dynamic.FrequencyAdmission(2)
                )
            },
            "dynamic table 'users': admission=FrequencyAdmission",
        ),
        (
            {"a": te.DynamicTableConfig("names", dim=2, key_dtype=tf.string, optimizer=te.optimizers.Adagrad(0.1))},
            "dynamic table 'names': key_dtype=string is not supported",
        ),
        (
            {"a": te.TableConfig(8, 2, name="half", storage_dtype="bfloat16")},
            "table 'half': storage_dtype=bfloat16 is not supported",
        ),
        (
            {"a": emb.TableConfig(8, 2, name="q", quantization_config=emb.QuantizationConfig(4, -1.0, 1.0))},
            "table 'q': quantization_config is not supported",
        ),
    ]
    for tables, match in cases:
        layer = _layer(tables)
        before = [v.numpy().copy() for v in layer.weights]
        with pytest.raises(ValueError, match=re.escape(match)):
            LayerShards(layer, exchange.Exchange(4, 10.0), 0)
        assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, layer.weights, strict=True))


def _trained_case_model():
    """The collective tests' model (two static tables with Adagrad slots, one dynamic table) after two steps in this
    process."""
    import keras

    from tests import collective_cases as cases

    model = cases.build_model(tf, keras, "adagrad", False)
    for batch in cases.global_batches()[:2]:
        model.train_on_batch(*cases.to_inputs(tf, batch, 0, cases.GLOBAL_BATCH))
    return model


def _embedding_layer(model):
    from tf_embed_ops.distribute.collective.loop import embedding_layers

    (layer,) = embedding_layers(model)
    return layer


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_while_fit_trains_each_worker_holds_only_its_shard_and_restores_its_rows(tmp_path, workers):
    import gc
    import weakref

    import keras

    from tests import collective_cases as cases
    from tf_embed_ops.distribute.collective.shards import LayerShards, attached
    from tf_embed_ops.dynamic import sharding

    trained = _trained_case_model()
    path = tf.train.Checkpoint(model=trained).save(str(tmp_path / "one"))
    reader = tf.train.load_checkpoint(path)
    keys = cases.weights(trained)["dynamic/dyn/keys"]
    assert keys.size > 0
    for worker in range(workers):
        model = cases.build_model(tf, keras, "adagrad", False)
        layer = _embedding_layer(model)
        fulls = [weakref.ref(v.value) for v in layer.weights if len(v.shape) == 2]
        shards = LayerShards(layer, exchange.Exchange(workers, 10.0), worker)
        shards.attach()
        assert attached(layer) is shards
        gc.collect()
        assert all(ref() is None for ref in fulls)  # no full table or slot is left on the worker
        for table, variable in layer.embedding_tables.items():
            rows = layout.shard_rows(table.vocabulary_size, workers, worker)
            assert rows <= -(-table.vocabulary_size // workers)
            assert tuple(variable.shape) == (rows, cases.DIM) == np.asarray(variable).shape
            for slot in layer.slot_variables[table].values():
                assert np.asarray(slot).shape == (rows, cases.DIM)
        # The layer's own dynamic table is empty; the shard holds what a restore gives this worker.
        (dynamic,) = layer.dynamic_tables.values()
        assert int(dynamic.size()) == 0
        # A one-process checkpoint restores into the stand-ins: each worker keeps its rows and its keys.
        tf.train.Checkpoint(model=model).restore(path).assert_existing_objects_matched()
        prefix = _store_key(reader)
        for table, variable in layer.embedding_tables.items():
            full = reader.get_tensor(f"{prefix}/{table.name}/.ATTRIBUTES/VARIABLE_VALUE")
            np.testing.assert_array_equal(np.asarray(variable), full[layout.shard_slice(workers, worker)])
            slot = reader.get_tensor(f"{prefix}/{table.name}.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE")
            accumulators = layer.slot_variables[table]["accumulators"]
            np.testing.assert_array_equal(np.asarray(accumulators), slot[layout.shard_slice(workers, worker)])
        mine = keys[sharding.shard_of_keys(tf.constant(keys), workers).numpy() == worker]
        shard_keys = shards.dynamic_shard(0).export()["keys"].numpy()
        np.testing.assert_array_equal(shard_keys, mine)
        assert int(shards.dynamic_shard(0).size()) == mine.size
        assert workers == 1 or mine.size < keys.size


def _store_key(reader) -> str:
    """The checkpoint key of the layer's table store (its path depends on Keras' numbering of the layers)."""
    (key,) = [k for k in reader.get_variable_to_shape_map() if k.endswith("/t1/.ATTRIBUTES/VARIABLE_VALUE")]
    return key.rsplit("/t1/", 1)[0]


def test_one_workers_stand_ins_save_one_processs_checkpoint_and_detach_gives_the_tables_back(tmp_path):
    from tests import collective_cases as cases
    from tf_embed_ops.distribute.collective.shards import LayerShards, attached

    model = _trained_case_model()
    want = cases.weights(model)
    before = tf.train.load_checkpoint(tf.train.Checkpoint(model=model).save(str(tmp_path / "before")))
    layer = _embedding_layer(model)
    shards = LayerShards(layer, exchange.Exchange(1, 10.0), 0)
    shards.attach()
    during = tf.train.load_checkpoint(tf.train.Checkpoint(model=model).save(str(tmp_path / "during")))
    keys = sorted(before.get_variable_to_shape_map())
    assert keys == sorted(during.get_variable_to_shape_map())  # the same keys: no extra path to a shard
    for key in keys:
        if key != "_CHECKPOINTABLE_OBJECT_GRAPH":
            np.testing.assert_array_equal(during.get_tensor(key), before.get_tensor(key), err_msg=key)
    shards.detach()
    assert attached(layer) is None
    got = cases.weights(model)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_a_checkpoint_of_another_shape_is_refused_by_the_stand_ins_and_changes_no_shard(tmp_path):
    from tf_embed_ops.distribute.collective.shards import LayerShards

    emb = tf.tpu.experimental.embedding
    other = _layer({"a": emb.TableConfig(12, 3, name="t")})
    path = tf.train.Checkpoint(layer=other).save(str(tmp_path / "other"))
    layer = _layer({"a": emb.TableConfig(11, 3, name="t")})
    shards = LayerShards(layer, exchange.Exchange(2, 10.0), 1)
    shards.attach()
    before = [np.asarray(v).copy() for v in layer.weights]
    with pytest.raises(ValueError, match=r"the checkpoint's 't' has shape \[12, 3\], this object's is \[11, 3\]"):
        tf.train.Checkpoint(layer=layer).restore(path)
    assert all(np.array_equal(b, np.asarray(v)) for b, v in zip(before, layer.weights, strict=True))
