"""te.serving: `apply_delta` in chunks (chunks of 4 rows here): deltas of no row, exactly one chunk, one row more
and many chunks apply bit for bit; a bad last chunk is refused before the first write; a reader during an apply sees
each row whole, of the old version or the new one.

Reference: a full export (`export_for_serving`) of the model at the same state, and the training tables' rows.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf

from tests import serving_delta_util as util
from tf_embed_ops.keras import serving as keras_serving
from tf_embed_ops.serving import Publisher, delta_format
from tf_embed_ops.serving import servable as servable_lib

CHUNK_ROWS = 4


def _published(tmp_path, monkeypatch, limit: str = "bytes"):
    """(model, layer, table, publisher, loaded servable of version 1) with apply chunks of CHUNK_ROWS rows (the
    chunk size is traced into `apply_delta` when the full version is saved): every table's, by its bytes a chunk
    (`limit` "bytes"), or a dynamic table's alone, by its keys a chunk ("keys")."""
    if limit == "bytes":
        monkeypatch.setattr(servable_lib, "APPLY_CHUNK_BYTES", CHUNK_ROWS * util.DIM * 4)
    else:
        monkeypatch.setattr(servable_lib, "APPLY_CHUNK_KEYS", CHUNK_ROWS)
    model, layer, table = util.dynamic_model()
    util.fit(model, seed=0)
    pub = Publisher(model, str(tmp_path / "chain"), util.SIGNATURE, min_free_slots=64)
    assert pub.publish_full() == 1
    return model, layer, table, pub, tf.saved_model.load(str(tmp_path / "chain" / "1"))


@pytest.fixture
def chunked(tmp_path, monkeypatch):
    return _published(tmp_path, monkeypatch)


def _static_variable(layer):
    var = [v for c, v in layer.embedding_tables.items() if c.name == "static"][0]
    return getattr(var, "value", var)


def _static_index(pub) -> int:
    return [t["name"] for t in pub._served.layout["tables"]].index("static")


def _path(tmp_path, version) -> str:
    return str(tmp_path / "chain" / "deltas" / f"{version}.delta")


def _probe():
    ids = [list(range(i, i + 4)) for i in range(0, util.V, 4)] + [[7, 30, 45]]
    return {"ids": tf.ragged.constant(ids, tf.int64)}


def _serve(loaded, x):
    fn = loaded.signatures["serving_default"]
    return fn(ids_values=x["ids"].values, ids_row_splits=x["ids"].row_splits)["output_0"].numpy()


def test_static_deltas_of_no_row_one_chunk_one_row_more_and_many_chunks_apply_bit_for_bit(tmp_path, chunked):
    model, layer, _, pub, served = chunked
    var, index = _static_variable(layer), _static_index(pub)
    rng = np.random.default_rng(3)
    version = 1
    for n in [0, CHUNK_ROWS, CHUNK_ROWS + 1, CHUNK_ROWS - 1, 1, 5 * CHUNK_ROWS + 2, util.V]:
        rows = np.sort(rng.choice(util.V, size=n, replace=False)).astype(np.int64)
        values = rng.normal(size=(n, util.DIM)).astype(np.float32)
        var.scatter_update(tf.IndexedSlices(tf.constant(values), tf.constant(rows)))
        version = pub.write_delta({"static": (rows, np.zeros([0], np.int64))}, dense=False)
        assert delta_format.read_delta(_path(tmp_path, version))["tables"][index]["keys"].size == n
        got = int(served.signatures["apply_delta"](path=tf.constant(_path(tmp_path, version)))["version"])
        assert got == version
        np.testing.assert_array_equal(served.tables[index].numpy().view(np.uint8), var.numpy().view(np.uint8))
    keras_serving.export_for_serving(model, str(tmp_path / "full"), util.SIGNATURE)
    full = tf.saved_model.load(str(tmp_path / "full"))
    np.testing.assert_array_equal(_serve(served, _probe()), _serve(full, _probe()))


def test_a_trained_delta_of_many_chunks_in_both_tables_equals_a_full_export(tmp_path, chunked):
    model, _, table, pub, served = chunked
    for round_ in range(1, 3):
        before = util.Snapshot(pub)
        util.fit(model, seed=round_, high=40 + 10 * round_)  # new dynamic keys
        table.evict_keys(tf.constant([round_, 30 + round_], tf.int64))
        touched = util.Snapshot(pub).touched_since(before)
        assert all(keys.size > 2 * CHUNK_ROWS for keys, _ in touched.values()), touched
        version = pub.write_delta(touched)
        assert int(served.signatures["apply_delta"](path=tf.constant(_path(tmp_path, version)))["version"]) == version
        keras_serving.export_for_serving(model, str(tmp_path / f"full{round_}"), util.SIGNATURE)
        full = tf.saved_model.load(str(tmp_path / f"full{round_}"))
        np.testing.assert_array_equal(_serve(served, _probe()), _serve(full, _probe()))


def _crafted(tmp_path, pub, name, rows: np.ndarray, keys: np.ndarray, dynamic=None) -> str:
    """A delta of these static rows; `dynamic`: (keys, rows, evicted) of the dynamic table (default: none)."""
    meta = pub._served.metadata()
    empty = np.zeros([0], np.int64)
    dynamic_keys, dynamic_rows, evicted = dynamic or (empty, np.zeros([0, util.DIM], np.float32), None)
    parts = {
        "dynamic": delta_format.TableDelta(dynamic_keys, dynamic_rows, evicted=evicted),
        "static": delta_format.TableDelta(keys, rows),
    }
    path = str(tmp_path / f"{name}.delta")
    delta_format.write_delta(
        path,
        model_id=delta_format.fingerprint64(pub.model_id),
        layout_id=meta["layout_id"],
        version=2,
        base_version=1,
        step=0,
        tables=[parts[t["name"]] for t in meta["layout"]["tables"]],
    )
    return path


@pytest.mark.parametrize("n", [CHUNK_ROWS, CHUNK_ROWS + 1, 3 * CHUNK_ROWS + 2])
def test_a_bad_last_chunk_is_refused_and_nothing_changes(tmp_path, chunked, n):
    """The last row non-finite (a checksum-valid file), or the file's last byte flipped (a checksum mismatch): the
    rows of the chunks before it would be writable, but the whole delta is checked before the first write."""
    _, _, _, pub, served = chunked
    keys = np.arange(n, dtype=np.int64)
    rows = np.full([n, util.DIM], 0.5, np.float32)
    good = _crafted(tmp_path, pub, "good", rows, keys)
    rows[-1, -1] = np.nan
    nan = _crafted(tmp_path, pub, "nan", rows, keys)
    data = bytearray(open(good, "rb").read())
    data[-1] ^= 0x01  # the last row's last byte: the static table is written last, it has no evicted keys
    flipped = str(tmp_path / "flipped.delta")
    with open(flipped, "wb") as f:
        f.write(bytes(data))
    state, out = util.served_state(served), _serve(served, _probe())
    for path, words in [(nan, f"row {n - 1} of the delta"), (flipped, "checksum mismatch")]:
        with pytest.raises(tf.errors.InvalidArgumentError) as err:
            served.signatures["apply_delta"](path=tf.constant(path))
        assert path in err.value.message and words in err.value.message, err.value.message
        util.assert_same_state(util.served_state(served), state)
        np.testing.assert_array_equal(_serve(served, _probe()), out)
    assert int(served.signatures["apply_delta"](path=tf.constant(good))["version"]) == 2
    np.testing.assert_array_equal(served.tables[_static_index(pub)].numpy()[:n], np.full([n, util.DIM], 0.5))


@pytest.mark.parametrize("limit", ["bytes", "keys"])
def test_a_dynamic_tables_keys_are_checked_chunk_by_chunk_before_the_first_write(tmp_path, monkeypatch, limit):
    """A dynamic table's keys are checked a chunk at a time (chunks bounded by their rows' bytes, or by their keys
    alone): a key repeated across a chunk boundary, a key evicted in the last chunk, one new key more than the free
    slots (the new keys spread over many chunks) are each refused before any write; new keys filling exactly the
    free slots apply, each key's row at its own slot."""
    _, _, _, pub, served = _published(tmp_path, monkeypatch, limit)
    index = [t["name"] for t in pub._served.layout["tables"]].index("dynamic")
    table = served.tables[index]
    free = int(np.sum(table.state.numpy() != servable_lib.SLOT_USED))
    assert free > 3 * CHUNK_ROWS, free
    no_static = (np.zeros([0, util.DIM], np.float32), np.zeros([0], np.int64))

    def dynamic_delta(name, keys, evicted=None):
        rows = (np.arange(keys.size * util.DIM, dtype=np.float32).reshape(-1, util.DIM) + 0.25).astype(np.float32)
        return _crafted(tmp_path, pub, name, *no_static, dynamic=(keys, rows, evicted)), rows

    new_keys = np.arange(10**6, 10**6 + free + 1, dtype=np.int64)
    # 9 keys in chunks of 4, the short chunk first: rows 0 | 1-4 | 5-8, so rows 4 and 5 are in different chunks.
    across = np.array([10**6 + i for i in (0, 1, 2, 3, 4, 4, 5, 6, 7)], np.int64)
    cases = [
        (dynamic_delta("across", across)[0], "keys not strictly ascending: 1000004 at 5 (0-based) after 1000004"),
        (
            dynamic_delta("evicted_last", new_keys[:9], evicted=np.array([5, 10**6 + 8], np.int64))[0],
            "1 keys are both written and evicted",
        ),
        (dynamic_delta("over", new_keys)[0], f"{free + 1} new keys, only {free} free slots"),
    ]
    state, out = util.served_state(served), _serve(served, _probe())
    for path, words in cases:
        with pytest.raises(tf.errors.InvalidArgumentError) as err:
            served.signatures["apply_delta"](path=tf.constant(path))
        assert path in err.value.message and words in err.value.message, err.value.message
        util.assert_same_state(util.served_state(served), state)
        np.testing.assert_array_equal(_serve(served, _probe()), out)
    path, rows = dynamic_delta("exact", new_keys[:free])
    assert int(served.signatures["apply_delta"](path=tf.constant(path))["version"]) == 2
    keys, slots = tf.raw_ops.LookupTableExportV2(
        table_handle=table.index.resource_handle, Tkeys=tf.int64, Tvalues=tf.int64
    )
    slots = dict(zip(keys.numpy().tolist(), slots.numpy().tolist(), strict=True))
    slots = np.array([slots[k] for k in new_keys[:free].tolist()])
    assert sorted(slots.tolist()) == sorted(set(slots.tolist())) and slots.max() < table.state.shape[0]
    np.testing.assert_array_equal(tf.gather(table.values, slots).numpy(), rows)
    assert not np.any(table.state.numpy() != servable_lib.SLOT_USED)


def test_a_reader_during_an_apply_sees_each_row_whole_old_or_new(tmp_path, chunked):
    """Readers are not blocked for the whole delta: between two chunks a lookup may see rows of both versions (a
    torn view across chunks, as before chunking), never a row half-written; the served version changes after the
    last write."""
    _, layer, _, pub, served = chunked
    var, index = _static_variable(layer), _static_index(pub)
    table = served.tables[index]
    old = table.numpy()
    values = (old + 1000.0).astype(np.float32)
    var.assign(values)
    version = pub.write_delta({"static": (np.arange(util.V, dtype=np.int64), np.zeros([0], np.int64))}, dense=False)
    seen, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            seen.append((int(served.signatures["served_version"]()["version"]), table.numpy()))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(3):  # the same delta, refused after the first by the version chain: only one apply writes
            try:
                served.signatures["apply_delta"](path=tf.constant(_path(tmp_path, version)))
            except tf.errors.InvalidArgumentError as e:
                assert "version chain gap" in e.message
    finally:
        stop.set()
        reader.join()
    assert seen
    for served_version, rows in seen:
        is_old = (rows == old).all(axis=1)
        is_new = (rows == values).all(axis=1)
        assert (is_old | is_new).all()  # every row whole, of one version or the other
        if served_version == version:
            assert is_new.all()  # the version moves after the last write
    np.testing.assert_array_equal(table.numpy(), values)


def test_a_dynamic_tables_chunks_hold_at_most_apply_chunk_keys_keys_whatever_its_row_size():
    """A chunk's keys are looked up, inserted and removed under the hash table's lock: a dynamic table of dim-1 rows
    gets chunks of APPLY_CHUNK_KEYS keys, not the 1 MiB of rows a static table of the same dim gets."""
    table = servable_lib.MutableRowTable(np.arange(2), np.zeros([2, 1], np.float32), capacity=4, name="d")
    fields = [tf.constant(v, tf.int64) for v in (1, 0, 2, 0, 0, 16, 24, 8)]
    keys = tf.constant([0, 1], tf.int64)
    empty = tf.zeros([0], tf.int64)
    dynamic = {"name": "d", "kind": "dynamic", "encoding": "float32", "dim": 1, "capacity": 4}
    plan, _, _ = servable_lib._check_table(dynamic, table, fields, keys, empty, tf.constant("x"), 40)
    assert plan["chunk_rows"] == servable_lib.APPLY_CHUNK_KEYS < servable_lib.APPLY_CHUNK_BYTES // 4
    static = {"name": "s", "kind": "static", "encoding": "float32", "dim": 1, "rows": 8}
    plan, _, _ = servable_lib._check_table(static, tf.Variable(tf.zeros([8, 1])), fields, keys, empty, "x", 40)
    assert plan["chunk_rows"] == servable_lib.APPLY_CHUNK_BYTES // 4
