"""`te.serving.Publisher` over tiered tables (docs/serving.md, docs/tiered_tables.md): full versions streamed from
the tier into the SavedModel, deltas of the touched rows read from the tier.

Reference: the same model with the tables in memory, trained on the same batches and published by the same
publisher (same model id): its delta files must be the tiered chain's byte for byte, and its servables must hold
and serve bitwise what the tiered chain's hold and serve, in this process and (slow tier) in an interpreter in
which `tf_embed_ops` cannot be imported. The tiered table's cache holds 8 of its 64 rows and its chunks are 7 rows,
so a full version is written as 10 row slices and the deltas read rows from the cache and from the row file.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from tiered_support import (
    cache_bytes_for,
    corrupt_every_record,
    keras_model,
    killed_child,
    record_bytes,
    run_json_child,
    table_pair,
)

import tf_embed_ops as te
from tests import serving_delta_util as util
from tf_embed_ops import keras as te_keras
from tf_embed_ops.serving import Publisher, delta_format, read_manifest

_emb = tf.tpu.experimental.embedding
V, DIM, CACHE_ROWS, CHUNK_ROWS = 64, 4, 8, 7
SIGNATURE = {"f": tf.TensorSpec([None], tf.int64)}
IDS = np.concatenate([np.arange(V), [V - 1, 0, 17]]).astype(np.int64)  # every row, then some again
MODEL_ID = "tiered-publisher-test"


def _model(table: te.TableConfig) -> keras.Model:
    """Features "f" over `table` and "g" over a small in-memory table "s" (after "t" in the engines' table order:
    the layouts must place the tiered table where the in-memory one is)."""
    small = te.TableConfig(
        16, DIM, name="s", optimizer=te.optimizers.Adagrad(0.1), initializer=tf.constant_initializer(0.25)
    )
    layer = te_keras.TPUEmbedding(
        {"f": _emb.FeatureConfig(table, name="f"), "g": _emb.FeatureConfig(small, name="g")}, name="embedding"
    )
    inputs = {"f": keras.Input(shape=(), dtype="int64", name="f")}
    acts = layer({"f": inputs["f"], "g": inputs["f"] % 16})
    head = keras.layers.Dense(2, kernel_initializer=keras.initializers.RandomNormal(seed=3), name="head")
    model = keras.Model(inputs, head(keras.layers.Concatenate()([acts["f"], acts["g"]])))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def _pair(tmp_path, optimizer=None, **options):
    """(in-memory model, tiered model, tiered table): the same initial rows."""
    optimizer = optimizer or te.optimizers.Adagrad(0.1)
    memory, tiered = table_pair(tmp_path / "rows", optimizer, V, DIM, CACHE_ROWS, **options)
    tiered.storage = te.Tiered(**{**tiered.storage.get_config(), "chunk_bytes": CHUNK_ROWS * 4 * 2 * DIM})
    models = [_model(memory), _model(tiered)]
    return models[0], models[1], next(iter(models[1].get_layer("embedding").tiered_tables.values()))


def _fit(models, seed, high=V):
    rng = np.random.default_rng(seed)
    x = {"f": rng.integers(0, high, size=24).astype(np.int64)}
    y = rng.normal(size=(24, 2)).astype(np.float32)
    for model in models:
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0)


def _publishers(tmp_path, memory, tiered):
    return (
        Publisher(memory, str(tmp_path / "chain_m"), SIGNATURE, model_id=MODEL_ID),
        Publisher(tiered, str(tmp_path / "chain_t"), SIGNATURE, model_id=MODEL_ID),
    )


def _serve(loaded) -> np.ndarray:
    return loaded.signatures["serving_default"](f=tf.constant(IDS))["output_0"].numpy()


def _state(loaded) -> list:
    """The servable's variables as numpy (tables in layout order, then dense), with the version."""
    out = [int(loaded.signatures["served_version"]()["version"])]
    out += [np.asarray(t.numpy()) for t in loaded.tables]
    out += [v.numpy() for v in loaded.dense]
    return out


def _assert_same_state(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _delta_path(pub, version) -> str:
    entry = [e for e in read_manifest(pub.directory)["chain"] if e["version"] == version][0]
    return os.path.join(pub.directory, entry["path"])


def _table_as_stored(table) -> np.ndarray:
    """The tiered table's rows in their storage dtype (what a full version's variable holds)."""
    return tf.cast(table.read_all()[0], table.dtypes[0]).numpy()


@pytest.mark.parametrize(
    "options",
    [
        {},
        pytest.param({"storage_dtype": tf.bfloat16}, marks=pytest.mark.slow),
        pytest.param({"storage_dtype": tf.float16}, marks=pytest.mark.slow),  # float16 rows as their int16 bits
    ],
    ids=["fp32", "bf16", "fp16"],
)
def test_the_tiered_chain_is_the_in_memory_chain_bitwise(tmp_path, options):
    memory, tiered, table = _pair(tmp_path, **options)
    _fit([memory, tiered], seed=0)
    pub_m, pub_t = _publishers(tmp_path, memory, tiered)
    assert pub_m.publish_full() == pub_t.publish_full() == 1
    served_m = tf.saved_model.load(os.path.join(pub_m.directory, "1"))
    served_t = tf.saved_model.load(os.path.join(pub_t.directory, "1"))
    assert pub_t._served.layout == pub_m._served.layout  # same tables in the same order, same encodings
    assert [t["name"] for t in pub_t._served.layout["tables"]] == ["t", "s"]
    _assert_same_state(_state(served_t)[:1] + _state(served_t)[2:], _state(served_m)[:1] + _state(served_m)[2:])
    # The tiered table's variable: its rows, written as 10 row slices (float16 as its int16 bits).
    stored = np.asarray(served_t.tables[0].numpy())
    if options.get("storage_dtype") == tf.float16:
        stored = stored.view(np.float16)
    np.testing.assert_array_equal(stored, _table_as_stored(table))
    np.testing.assert_array_equal(stored, served_m.tables[0].numpy())
    data_files = [f for f in os.listdir(os.path.join(pub_t.directory, "1", "variables")) if ".data-" in f]
    assert len(data_files) == 1 + -(-V // CHUNK_ROWS)
    np.testing.assert_array_equal(_serve(served_t), _serve(served_m))
    for round_ in range(1, 3):
        _fit([memory, tiered], seed=round_, high=20 * round_)
        version = pub_t.publish_delta()
        assert pub_m.publish_delta() == version == round_ + 1
        with open(_delta_path(pub_t, version), "rb") as a, open(_delta_path(pub_m, version), "rb") as b:
            assert a.read() == b.read()  # the same rows, keys, dense weights, header: byte for byte
        parsed = delta_format.read_delta(_delta_path(pub_t, version))
        keys = parsed["tables"][0]["keys"]
        assert 0 < keys.size < V  # the touched rows only
        np.testing.assert_array_equal(parsed["tables"][0]["rows"], _table_as_stored(table)[keys])
        for served, pub in ((served_m, pub_m), (served_t, pub_t)):
            served.signatures["apply_delta"](path=tf.constant(_delta_path(pub, version)))
        np.testing.assert_array_equal(_serve(served_t), _serve(served_m))
        # The servable equals a full export of the trained model.
        te_keras.export_for_serving(tiered, str(tmp_path / f"export{round_}"), SIGNATURE)
        np.testing.assert_array_equal(_serve(served_t), _serve(tf.saved_model.load(str(tmp_path / f"export{round_}"))))


def test_a_tiered_table_changed_whole_is_published_as_a_full_version(tmp_path):
    _, tiered, table = _pair(tmp_path)
    _fit([tiered], seed=0)
    pub = Publisher(tiered, str(tmp_path / "chain"), SIGNATURE)
    pub.publish_full()
    # A restore writes every row through the tier: a full version, not a delta of every row.
    saved = tf.train.Checkpoint(model=tiered).write(str(tmp_path / "ckpt" / "c"))
    _fit([tiered], seed=1)
    tf.train.Checkpoint(model=tiered).read(saved).expect_partial()
    for changed_whole in ("restored", "mark_all"):
        if changed_whole == "mark_all":  # what a restore by other means calls (docs/tracking.md)
            te.tracking.Tracker(tiered).mark_all()
        version = pub.publish_delta()
        assert read_manifest(pub.directory)["chain"][-1]["kind"] == "full", changed_whole
        served = tf.saved_model.load(os.path.join(pub.directory, str(version)))
        np.testing.assert_array_equal(np.asarray(served.tables[0].numpy()), _table_as_stored(table))
    # After it, deltas again: the rows trained since.
    _fit([tiered], seed=2, high=10)
    version = pub.publish_delta()
    entry = read_manifest(pub.directory)["chain"][-1]
    assert (entry["kind"], entry["base"]) == ("delta", version - 1)
    assert 0 < entry["rows"]["t"] <= 10


def test_a_bad_row_id_writes_no_delta_and_changes_nothing(tmp_path):
    _, tiered, table = _pair(tmp_path)
    _fit([tiered], seed=0)
    pub = Publisher(tiered, str(tmp_path / "chain"), SIGNATURE)
    pub.publish_full()
    before, stats = table.read_all(), {k: int(v) for k, v in table.stats().items()}
    manifest = read_manifest(pub.directory)
    empty = np.zeros([0], np.int64)
    for bad in ([1, V], [-2, 3]):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"tiered table 't': rows\[\d\] = -?\d+ is outside"):
            pub.write_delta({"t": (np.array(bad, np.int64), empty)})
    assert read_manifest(pub.directory) == manifest
    assert os.listdir(os.path.join(pub.directory, "deltas")) == []
    assert {k: int(v) for k, v in table.stats().items()} == stats
    after = table.read_all()
    np.testing.assert_array_equal(after[0], before[0])
    for slot in before[1]:
        np.testing.assert_array_equal(after[1][slot], before[1][slot])


def test_a_corrupted_row_stops_the_full_version_and_leaves_the_chain(tmp_path):
    _, tiered, table = _pair(tmp_path)
    _fit([tiered], seed=0)
    pub = Publisher(tiered, str(tmp_path / "chain"), SIGNATURE)
    pub.publish_full()
    manifest = read_manifest(pub.directory)
    table.flush()
    corrupt_every_record(table.path, record_bytes(te.optimizers.Adagrad(0.1), DIM))
    with pytest.raises(tf.errors.DataLossError, match=r"'t'.*corrupted"):
        pub.publish_full()
    assert read_manifest(pub.directory) == manifest
    assert sorted(os.listdir(pub.directory)) == ["1", "MANIFEST.json", "deltas"]  # no temporary left


# ------------------------------------------------------------------------ tiered dynamic tables

DYN_CACHE_ROWS, DYN_CHUNK_ROWS = 16, 5
_RNG = np.random.default_rng(1)
DYN_KEYS = (np.arange(60, dtype=np.int64) * 7919) - 100  # negative keys too
DYN_IDS = np.concatenate([DYN_KEYS, [0, 5, 1 << 45]]).astype(np.int64)  # then keys never trained


def _dynamic_model(directory, storage_dtype=tf.float32, key_dtype=tf.int64) -> keras.Model:
    """Feature "f" over the dynamic table "d", tiered in `directory` (a cache of 16 rows, chunks of 5 rows) or, with
    `directory=None`, in memory."""
    optimizer = te.optimizers.Adagrad(0.1)
    storage = None
    if directory is not None:
        cache = cache_bytes_for(DYN_CACHE_ROWS, optimizer, DIM, storage_dtype)
        storage = te.Tiered(cache_bytes=cache, directory=str(directory), chunk_bytes=DYN_CHUNK_ROWS * 4 * 2 * DIM)
    config = te.DynamicTableConfig(
        "d",
        DIM,
        optimizer=optimizer,
        seed=11,
        storage=storage,
        storage_dtype=storage_dtype,
        combiner="sum",
        key_dtype=key_dtype,
    )
    return keras_model(config, key_dtype.name)


def _dynamic_table(model):
    return next(iter(model.get_layer("embedding").dynamic_tables.values()))


def _dynamic_fit(models, seed, keys):
    rng = np.random.default_rng(seed)
    x = {"f": rng.choice(keys, size=24)}
    y = rng.normal(size=(24, 2)).astype(np.float32)
    for model in models:
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0)


def _dynamic_state(loaded) -> list:
    """The servable's dynamic table (key -> slot map sorted by key, rows, slot states), dense weights, version."""
    t = loaded.tables[0]
    keys, slots = tf.raw_ops.LookupTableExportV2(table_handle=t.index.resource_handle, Tkeys=tf.int64, Tvalues=tf.int64)
    order = np.argsort(keys.numpy())
    out = [int(loaded.signatures["served_version"]()["version"]), keys.numpy()[order], slots.numpy()[order]]
    return out + [t.values.numpy(), t.state.numpy()] + [v.numpy() for v in loaded.dense]


def _serve_dynamic(loaded) -> np.ndarray:
    return loaded.signatures["serving_default"](f=tf.constant(DYN_IDS))["output_0"].numpy()


@pytest.mark.parametrize(
    "storage_dtype", [tf.float32, pytest.param(tf.bfloat16, marks=pytest.mark.slow)], ids=["fp32", "bf16"]
)
def test_a_tiered_dynamic_chain_is_the_in_memory_chain_bitwise(tmp_path, storage_dtype):
    memory, tiered = _dynamic_model(None, storage_dtype), _dynamic_model(tmp_path / "rows", storage_dtype)
    _dynamic_fit([memory, tiered], seed=0, keys=DYN_KEYS[:30])
    assert int(_dynamic_table(tiered).cache_stats()["evictions"]) > 0  # the rows went through the row file
    pub_m = Publisher(memory, str(tmp_path / "chain_m"), SIGNATURE, model_id=MODEL_ID, min_free_slots=40)
    pub_t = Publisher(tiered, str(tmp_path / "chain_t"), SIGNATURE, model_id=MODEL_ID, min_free_slots=40)
    assert pub_m.publish_full() == pub_t.publish_full() == 1
    assert pub_t._served.layout == pub_m._served.layout
    served = {k: tf.saved_model.load(os.path.join(p.directory, "1")) for k, p in (("m", pub_m), ("t", pub_t))}
    _assert_same_state(_dynamic_state(served["t"]), _dynamic_state(served["m"]))
    capacity = pub_t._served.layout["tables"][0]["capacity"]
    data_files = [f for f in os.listdir(os.path.join(pub_t.directory, "1", "variables")) if ".data-" in f]
    n = int(_dynamic_table(tiered).size())
    # The keys' rows a chunk at a time, then the free slots and the default row a chunk at a time.
    assert len(data_files) == 1 + -(-n // DYN_CHUNK_ROWS) + -(-(capacity + 1 - n) // DYN_CHUNK_ROWS)
    np.testing.assert_array_equal(_serve_dynamic(served["t"]), _serve_dynamic(served["m"]))
    for round_ in range(1, 3):
        _dynamic_fit([memory, tiered], seed=round_, keys=DYN_KEYS[: 30 + 15 * round_])  # new keys every round
        for model in (memory, tiered):
            _dynamic_table(model).evict_keys(tf.constant([DYN_KEYS[round_], DYN_KEYS[-1]], tf.int64))
        version = pub_t.publish_delta()
        assert pub_m.publish_delta() == version == round_ + 1
        assert read_manifest(pub_t.directory)["chain"][-1]["kind"] == "delta"
        with open(_delta_path(pub_t, version), "rb") as a, open(_delta_path(pub_m, version), "rb") as b:
            assert a.read() == b.read()  # keys, rows, evicted keys, dense weights, header: byte for byte
        parsed = delta_format.read_delta(_delta_path(pub_t, version))["tables"][0]
        evicted = set(parsed["evicted"].tolist())  # the last key only once it was trained (round 2)
        assert DYN_KEYS[round_] in evicted and evicted <= {int(DYN_KEYS[round_]), int(DYN_KEYS[-1])}
        assert 0 < parsed["keys"].size < len(_dynamic_table(tiered).export()["keys"])  # the changed keys only
        for k, pub in (("m", pub_m), ("t", pub_t)):
            served[k].signatures["apply_delta"](path=tf.constant(_delta_path(pub, version)))
        _assert_same_state(_dynamic_state(served["t"]), _dynamic_state(served["m"]))
        # The servable serves what a full export of the trained model serves.
        te_keras.export_for_serving(tiered, str(tmp_path / f"export{round_}"), SIGNATURE)
        export = tf.saved_model.load(str(tmp_path / f"export{round_}"))
        np.testing.assert_array_equal(_serve_dynamic(served["t"]), _serve_dynamic(export))


@pytest.mark.slow
def test_a_string_keyed_tiered_dynamic_chain_is_the_in_memory_chain(tmp_path):
    memory, tiered = (_dynamic_model(d, key_dtype=tf.string) for d in (None, tmp_path / "rows"))
    words = np.array([f"w{i}" for i in range(40)], object)
    signature = {"f": tf.TensorSpec([None], tf.string)}
    pubs = [
        Publisher(m, str(tmp_path / k), signature, model_id=MODEL_ID, min_free_slots=40)
        for m, k in ((memory, "m"), (tiered, "t"))
    ]
    _dynamic_fit([memory, tiered], seed=0, keys=words[:20])
    for pub in pubs:
        pub.publish_full()
    _dynamic_fit([memory, tiered], seed=1, keys=words)
    versions = [pub.publish_delta() for pub in pubs]
    assert versions == [2, 2]
    with open(_delta_path(pubs[1], 2), "rb") as a, open(_delta_path(pubs[0], 2), "rb") as b:
        assert a.read() == b.read()
    served = []
    for pub in pubs:
        loaded = tf.saved_model.load(os.path.join(pub.directory, "1"))
        loaded.signatures["apply_delta"](path=tf.constant(_delta_path(pub, 2)))
        probe = tf.constant([*words[::3].tolist(), "never-seen"])
        served.append(loaded.signatures["serving_default"](f=probe)["output_0"].numpy())
    np.testing.assert_array_equal(served[1], served[0])


def test_a_tiered_dynamic_table_restored_or_outgrowing_its_slots_gets_a_full_version(tmp_path):
    tiered = _dynamic_model(tmp_path / "rows")
    _dynamic_fit([tiered], seed=0, keys=DYN_KEYS[:20])
    pub = Publisher(tiered, str(tmp_path / "chain"), SIGNATURE, dynamic_headroom=0.0, min_free_slots=4)
    pub.publish_full()
    _dynamic_fit([tiered], seed=1, keys=DYN_KEYS)  # about 40 new keys: more than the 4 free slots
    version = pub.publish_delta()
    assert read_manifest(pub.directory)["chain"][-1]["kind"] == "full"
    assert os.listdir(os.path.join(pub.directory, "deltas")) == []
    served = tf.saved_model.load(os.path.join(pub.directory, str(version)))
    te_keras.export_for_serving(tiered, str(tmp_path / "export"), SIGNATURE)
    np.testing.assert_array_equal(_serve_dynamic(served), _serve_dynamic(tf.saved_model.load(str(tmp_path / "export"))))
    te.tracking.Tracker(tiered).mark_all()  # as after a restore by other means: taken whole
    pub.publish_delta()
    assert [e["kind"] for e in read_manifest(pub.directory)["chain"]] == ["full", "full", "full"]


def test_a_corrupted_record_stops_a_tiered_dynamic_full_version_and_leaves_the_chain(tmp_path):
    tiered = _dynamic_model(tmp_path / "rows")
    _dynamic_fit([tiered], seed=0, keys=DYN_KEYS[:40])
    pub = Publisher(tiered, str(tmp_path / "chain"), SIGNATURE)
    pub.publish_full()
    manifest = read_manifest(pub.directory)
    table = _dynamic_table(tiered)
    before = {k: v.numpy() for k, v in dynamic_ops_export_keys(table).items()}
    corrupt_every_record(table.tiered.path(table.table_name), record_bytes(te.optimizers.Adagrad(0.1), DIM))
    with pytest.raises(tf.errors.DataLossError, match=r"'d'.*corrupted"):
        pub.publish_full()
    assert read_manifest(pub.directory) == manifest
    assert sorted(os.listdir(pub.directory)) == ["1", "MANIFEST.json", "deltas"]  # no temporary left
    after = {k: v.numpy() for k, v in dynamic_ops_export_keys(table).items()}
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])


def test_write_delta_reads_given_keys_from_the_tier(tmp_path):
    tiered = _dynamic_model(tmp_path / "rows")
    _dynamic_fit([tiered], seed=0, keys=DYN_KEYS[:30])
    pub = Publisher(tiered, str(tmp_path / "chain"), SIGNATURE)
    pub.publish_full()
    table = _dynamic_table(tiered)
    content = {k: v.numpy() for k, v in table.export().items()}
    keys = np.array([content["keys"][3], 123456789, content["keys"][0], content["keys"][-1]], np.int64)
    version = pub.write_delta({"d": (keys, np.zeros([0], np.int64))}, dense=False)
    parsed = delta_format.read_delta(_delta_path(pub, version))["tables"][0]
    want = np.sort(keys[keys != 123456789])  # a key without a row is left out
    np.testing.assert_array_equal(parsed["keys"], want)
    np.testing.assert_array_equal(parsed["rows"], content["weights"][np.searchsorted(content["keys"], want)])


def dynamic_ops_export_keys(table) -> dict:
    from tf_embed_ops.dynamic import ops as dynamic_ops

    names = ("keys", "counts", "last_steps", "pending_keys", "pending_counts", "pending_last_steps")
    return dict(zip(names, dynamic_ops.dynamic_table_tiered_export_keys(table.handle), strict=True))


# ------------------------------------------------------------------------ slow: as TensorFlow Serving applies it


@pytest.mark.slow
def test_a_server_without_tf_embed_ops_applies_the_tiered_chain_as_the_in_memory_one(tmp_path):
    memory, tiered, _ = _pair(tmp_path)
    _fit([memory, tiered], seed=0)
    pub_m, pub_t = _publishers(tmp_path, memory, tiered)
    pub_m.publish_full()
    pub_t.publish_full()
    results = {}
    for round_ in range(1, 3):
        _fit([memory, tiered], seed=round_)
        pub_m.publish_delta()
        pub_t.publish_delta()
    for name, pub in (("m", pub_m), ("t", pub_t)):
        chain = read_manifest(pub.directory)["chain"]
        steps = [{"load": os.path.join(pub.directory, "1")}, {"serve": {"f": IDS.tolist()}}]
        corrupt = str(tmp_path / f"corrupt_{name}.delta")
        data = bytearray(open(os.path.join(pub.directory, chain[1]["path"]), "rb").read())
        data[-5] ^= 1
        open(corrupt, "wb").write(bytes(data))
        steps += [{"apply": corrupt}, {"version": True}]
        steps += [{"apply": os.path.join(pub.directory, e["path"])} for e in chain[1:]]
        steps += [{"serve": {"f": IDS.tolist()}}]
        results[name] = util.run_server(steps)
    out = results["t"]
    for a, b in zip(out, results["m"], strict=True):  # the same results, but for the paths named
        assert a.keys() == b.keys() and a["ok"] == b["ok"]
        assert {k: v for k, v in a.items() if k not in ("loaded", "error")} == {
            k: v for k, v in b.items() if k not in ("loaded", "error")
        }
    assert not out[2]["ok"] and "checksum mismatch" in out[2]["error"]
    assert out[3] == {"version": 1, "ok": True}
    assert [r["version"] for r in out[4:6]] == [2, 3]
    np.testing.assert_array_equal(np.array(out[6]["output_0"], np.float32), _serve_model(memory))


@pytest.mark.slow
def test_a_server_without_tf_embed_ops_applies_the_tiered_dynamic_chain_as_the_in_memory_one(tmp_path):
    memory, tiered = _dynamic_model(None), _dynamic_model(tmp_path / "rows")
    _dynamic_fit([memory, tiered], seed=0, keys=DYN_KEYS[:30])
    pubs = {
        name: Publisher(model, str(tmp_path / f"chain_{name}"), SIGNATURE, model_id=MODEL_ID, min_free_slots=40)
        for name, model in (("m", memory), ("t", tiered))
    }
    for pub in pubs.values():
        pub.publish_full()
    for round_ in range(1, 3):
        _dynamic_fit([memory, tiered], seed=round_, keys=DYN_KEYS[: 30 + 15 * round_])
        for model in (memory, tiered):
            _dynamic_table(model).evict_keys(tf.constant([DYN_KEYS[round_]], tf.int64))
        for pub in pubs.values():
            pub.publish_delta()
    results = {}
    for name, pub in pubs.items():
        chain = read_manifest(pub.directory)["chain"]
        assert [e["kind"] for e in chain] == ["full", "delta", "delta"]
        steps = [{"load": os.path.join(pub.directory, "1")}, {"serve": {"f": DYN_IDS.tolist()}}]
        steps += [{"apply": os.path.join(pub.directory, e["path"])} for e in chain[1:]]
        steps += [{"serve": {"f": DYN_IDS.tolist()}}, {"version": True}]
        results[name] = util.run_server(steps)
    assert results["t"][1:] == results["m"][1:]  # (the first result names the path loaded)
    assert all(r["ok"] for r in results["t"]) and results["t"][-1]["version"] == 3
    te_keras.export_for_serving(tiered, str(tmp_path / "export"), SIGNATURE)
    export = _serve_dynamic(tf.saved_model.load(str(tmp_path / "export")))
    np.testing.assert_array_equal(np.array(results["t"][-2]["output_0"], np.float32), export)


@pytest.mark.slow
def test_a_tiered_publish_killed_at_random_points_leaves_a_chain_a_plain_server_applies(tmp_path):
    """SIGKILL while full versions stream their rows and deltas are written: the manifest lists complete versions
    only, each delta builds on the previous version, and a server without tf_embed_ops loads the last full version
    and applies the deltas after it; a new Publisher removes the temporaries and continues past every number."""
    import random
    import time

    rng = random.Random(11)
    for _ in range(3):
        with killed_child("tiered_publish_kill_child.py", str(tmp_path)) as child:
            assert child.stdout.readline().startswith("full")  # up, and published once
            time.sleep(rng.uniform(0.0, 3.0))
    directory = str(tmp_path / "chain")
    chain = util.consistent_chain(directory)
    last_full = [e for e in chain if e["kind"] == "full"][-1]
    steps = [{"load": os.path.join(directory, last_full["path"])}]
    steps += [{"apply": os.path.join(directory, e["path"])} for e in chain[chain.index(last_full) + 1 :]]
    steps += [{"version": True}, {"serve": {"f": [0, 5, 19999, 123]}}]
    results = util.run_server(steps)
    assert all(r["ok"] for r in results), results
    assert results[-2]["version"] == chain[-1]["version"]
    # A new publisher (a restarted job) removes the temporaries and continues past every number used.
    from tiered_publish_kill_child import build_model  # pylint: disable=import-outside-toplevel

    pub = Publisher(build_model(str(tmp_path)), directory, SIGNATURE)
    assert not [e for e in os.listdir(directory) if ".tmp-" in e]
    used = [int(e) for e in os.listdir(directory) if e.isdigit()]
    assert pub.publish_full() > max(used + [chain[-1]["version"]])


def _serve_model(model) -> np.ndarray:
    """The model's outputs for IDS (a model with its tables in memory: one batch of every row)."""
    return model.predict({"f": IDS}, batch_size=len(IDS), verbose=0)


def _publish_growth(tmp_path, kind: str, size: str = "large") -> dict:
    """The memory child's report for one kind and table size, in a directory of its own."""
    return run_json_child("tiered_publish_memory_child.py", str(tmp_path / f"{kind}_{size}"), kind, size)


def _table_cost(large: dict, one_chunk: dict, key: str) -> int:
    """A publish's peak growth with the large table less the same publish's with a table of one chunk: what the
    table's size costs, without the save's fixed cost (the servable's functions traced and serialized, the same at
    every size)."""
    return large[key] - one_chunk[key]


@pytest.mark.slow
def test_a_full_version_holds_one_chunk_not_the_table(tmp_path):
    """A 96 MiB table published in chunks of 2 MiB: a full version raises the publishing process's peak RSS by a
    small fraction of the table over the same publish of a one-chunk table, and the process's peak stays about the
    table below the same model's with the table in memory (which holds it all; its full version saves the variable
    without a copy)."""
    tiered = _publish_growth(tmp_path, "tiered")
    small = _publish_growth(tmp_path, "tiered", "one_chunk")
    memory = _publish_growth(tmp_path, "memory")
    print(tiered, small, memory)
    table = tiered["table_bytes"]
    assert table == 393216 * 64 * 4 and small["table_bytes"] == small["chunk_bytes"]
    for key in ("tiered_full_2", "tiered_delta"):
        assert _table_cost(tiered, small, key) < table / 8, (key, tiered, small)
    grown = {k: r[f"{k}_full_2_peak"] - r["rss_before"] for k, r in (("tiered", tiered), ("memory", memory))}
    assert grown["memory"] > table, memory  # the measure sees the table
    assert grown["memory"] - grown["tiered"] > 0.75 * table, (tiered, memory)
    assert tiered["tiered_delta_rows"] == memory["memory_delta_rows"] > 0


@pytest.mark.slow
def test_a_tiered_dynamic_full_version_holds_the_keys_and_one_chunk(tmp_path):
    """65,536 keys x 256 (64 MiB of rows) published in chunks of 2 MiB: a full version raises the publishing
    process's peak RSS by the keys' share and a chunk over the same publish of a one-chunk table, where the same
    table in memory reads its whole export and builds the servable's rows from it."""
    tiered = _publish_growth(tmp_path, "tiered_dynamic")
    small = _publish_growth(tmp_path, "tiered_dynamic", "one_chunk")
    memory = _publish_growth(tmp_path, "memory_dynamic")
    print(tiered, small, memory)
    table = tiered["table_bytes"]
    assert table == 65536 * 256 * 4 and small["table_bytes"] == small["chunk_bytes"]
    assert _table_cost(tiered, small, "tiered_dynamic_full_2") < table / 3, (tiered, small)
    assert _table_cost(tiered, small, "tiered_dynamic_delta") < table / 8, (tiered, small)
    assert memory["memory_dynamic_full_2"] > 2 * table, memory  # the measure sees the copies
    assert tiered["tiered_dynamic_delta_kind"] == memory["memory_dynamic_delta_kind"] == "delta"
    assert tiered["tiered_dynamic_delta_rows"] == memory["memory_dynamic_delta_rows"] == 256
