"""te.serving: full versions and deltas applied in place to a servable of stock TensorFlow ops.

References: a delta computed by comparing table contents before and after training (not the tracker), and a full
export (`export_for_serving`) taken at the same step, which the delta-fed servable must equal bit for bit.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from tests import serving_delta_util as util
from tf_embed_ops.keras import serving as keras_serving
from tf_embed_ops.serving import Publisher, delta_format, read_manifest


def _serve(loaded, x):
    fn = loaded.signatures["serving_default"]
    return fn(ids_values=x["ids"].values, ids_row_splits=x["ids"].row_splits)["output_0"].numpy()


def _full_export(model, path):
    keras_serving.export_for_serving(model, path, util.SIGNATURE)
    return tf.saved_model.load(path)


def _probe():
    """Ids that cover every static row, trained dynamic keys, new keys and keys never seen."""
    ids = [list(range(i, i + 4)) for i in range(0, util.V, 4)] + [[util.V - 1], [7]]
    return {"ids": tf.ragged.constant(ids, tf.int64)}


def _published_once(tmp_path, dtype=tf.float32, **publisher_args):
    """A trained dynamic model (`util.dynamic_model`), its dynamic table, and a `Publisher` into tmp_path/chain that
    has published version 1 (full)."""
    model, _, table = util.dynamic_model(dtype)
    util.fit(model, seed=0)
    pub = Publisher(model, str(tmp_path / "chain"), util.SIGNATURE, **publisher_args)
    assert pub.publish_full() == 1
    return model, table, pub


def _train_round(pub, model, table, round_) -> dict:
    """Trains a round (new dynamic keys, two evicted); returns the rows it touched by comparing the publisher's
    tables before and after (`util.Snapshot`), the reference the tracker's deltas are held to."""
    before = util.Snapshot(pub)
    util.fit(model, seed=round_, high=30 + 10 * round_)  # new dynamic keys every round
    table.evict_keys(tf.constant([round_, 30 + round_], tf.int64))
    return util.Snapshot(pub).touched_since(before)


@pytest.mark.slow  # several publish rounds and exports (several seconds)
def test_deltas_make_the_servable_bit_identical_to_a_full_export(tmp_path):
    model, table, pub = _published_once(tmp_path, min_free_slots=64)
    served = tf.saved_model.load(str(tmp_path / "chain" / "1"))
    probe = _probe()
    for round_ in range(1, 4):
        touched = _train_round(pub, model, table, round_)
        assert touched["dynamic"][1].size > 0  # evictions are part of the delta
        version = pub.write_delta(touched)
        assert version == round_ + 1
        path = str(tmp_path / "chain" / "deltas" / f"{version}.delta")
        assert int(served.signatures["apply_delta"](path=tf.constant(path))["version"]) == version
        full = _full_export(model, str(tmp_path / f"full{round_}"))
        np.testing.assert_array_equal(_serve(served, probe), _serve(full, probe))
        assert int(served.signatures["served_version"]()["version"]) == version
    chain = read_manifest(str(tmp_path / "chain"))["chain"]
    assert [(e["version"], e["kind"], e["base"]) for e in chain] == [
        (1, "full", None),
        (2, "delta", 1),
        (3, "delta", 2),
        (4, "delta", 3),
    ]


@pytest.mark.slow  # several training rounds and servables per dtype (~4 s each): the fast tier keeps the others
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_publish_delta_with_the_tracker_keeps_the_servable_bit_identical(tmp_path, dtype):
    """The touched-row tracker's deltas: a superset of the rows that changed (reference: table comparison), and a
    servable equal to a full export after each; 16-bit tables travel as stored."""
    model, table, pub = _published_once(tmp_path, dtype, min_free_slots=64)
    served = tf.saved_model.load(str(tmp_path / "chain" / "1"))
    probe = _probe()
    for round_ in range(1, 4):
        reference = _train_round(pub, model, table, round_)
        version = pub.publish_delta()
        entry = read_manifest(str(tmp_path / "chain"))["chain"][-1]
        assert (entry["version"], entry["kind"], entry["base"]) == (version, "delta", version - 1)
        parsed = delta_format.read_delta(str(tmp_path / "chain" / entry["path"]))
        for t, layout in zip(parsed["tables"], pub._served.layout["tables"], strict=True):
            rows, evicted = reference[layout["name"]]
            assert set(rows.tolist()) <= set(t["keys"].tolist())
            # Every key gone since the previous version, and none that is live now (a key inserted and evicted
            # between two versions may be listed too: removing it is a no-op).
            assert set(evicted.tolist()) <= set(t["evicted"].tolist())
            if layout["kind"] == "dynamic":
                assert not set(t["evicted"].tolist()) & set(table.export()["keys"].numpy().tolist())
            assert t["encoding"] == ("bfloat16" if layout["name"] == "static" and dtype == tf.bfloat16 else "float32")
        served.signatures["apply_delta"](path=tf.constant(str(tmp_path / "chain" / entry["path"])))
        full = _full_export(model, str(tmp_path / f"full{round_}"))
        np.testing.assert_array_equal(_serve(served, probe), _serve(full, probe))
    # Nothing trained: an empty delta (no rows), still a version.
    version = pub.publish_delta(dense=False)
    parsed = delta_format.read_delta(str(tmp_path / "chain" / "deltas" / f"{version}.delta"))
    assert [t["keys"].size for t in parsed["tables"]] == [0, 0]


@pytest.mark.slow  # several publish rounds (several seconds)
def test_dense_weights_follow_their_cadence(tmp_path):
    model, _, table = util.dynamic_model()
    pub = Publisher(model, str(tmp_path), util.SIGNATURE, dense_every=2)
    pub.publish_full()
    served = tf.saved_model.load(str(tmp_path / "1"))
    head = model.get_layer("head").kernel.numpy().copy()
    for round_, carries in ((1, False), (2, True)):
        version = pub.write_delta(_train_round(pub, model, table, round_))
        path = str(tmp_path / "deltas" / f"{version}.delta")
        names = [d["name"] for d in pub._served.layout["dense"]]
        assert {"head/kernel", "head/bias"} <= set(names)
        assert len(delta_format.read_delta(path)["dense"]) == (len(names) if carries else 0)
        served.signatures["apply_delta"](path=tf.constant(path))
        kernel = [v.numpy() for v in served.dense if v.shape == head.shape][0]
        if carries:
            np.testing.assert_array_equal(kernel, model.get_layer("head").kernel.numpy())
        else:
            np.testing.assert_array_equal(kernel, head)


def test_delta_bytes_are_keys_plus_rows(tmp_path):
    model, layer, _ = util.dynamic_model()
    pub = Publisher(model, str(tmp_path), util.SIGNATURE)
    pub.publish_full()
    keys = np.arange(20, dtype=np.int64)
    version = pub.write_delta({"static": (keys, np.zeros([0], np.int64))}, dense=False)
    path = str(tmp_path / "deltas" / f"{version}.delta")
    payload = keys.size * (8 + util.DIM * 4)
    overhead = delta_format.PREAMBLE + 8 * (delta_format.HEADER_FIXED + delta_format.TABLE_FIELDS * 2)
    assert os.path.getsize(path) == payload + overhead
    parsed = delta_format.read_delta(path)
    index = [t["name"] for t in pub._served.layout["tables"]].index("static")
    np.testing.assert_array_equal(parsed["tables"][index]["keys"], keys)
    np.testing.assert_array_equal(parsed["tables"][index]["rows"], layer.embedding_tables[_static(layer)].numpy()[:20])


def _static(layer):
    return [c for c in layer.embedding_tables if c.name == "static"][0]


def _bad_deltas(tmp_path, pub, model, table):
    """{name: (path, words the error must contain)}; the servable serves version 1 when they are applied."""
    good = {}
    v2 = pub.write_delta(_train_round(pub, model, table, 1))
    good["v2"] = str(tmp_path / "chain" / "deltas" / f"{v2}.delta")
    v3 = pub.write_delta(_train_round(pub, model, table, 2))
    data = open(good["v2"], "rb").read()
    bad = {}

    def put(name, blob):
        path = str(tmp_path / f"{name}.delta")
        with open(path, "wb") as f:
            f.write(blob)
        return path

    bad["truncated"] = (put("truncated", data[:-7]), "truncated")
    bad["short"] = (put("short", data[:20]), "truncated")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    bad["corrupted"] = (put("corrupted", bytes(flipped)), "checksum mismatch")
    bad["magic"] = (put("magic", b"XXXXXXXX" + data[8:]), "bad magic")
    bad["gap"] = (str(tmp_path / "chain" / "deltas" / f"{v3}.delta"), "version chain gap")
    meta = pub._served.metadata()
    keys = np.arange(3, dtype=np.int64)
    empty = np.zeros([0], np.int64)

    def crafted(
        name,
        *,
        model_id=None,
        layout_id=None,
        dims=(util.DIM, util.DIM),
        static_keys=keys,
        new=0,
        fill=1.0,
        dense=None,
        dynamic_keys=None,
        evicted=None,
    ):
        dynamic_keys = np.arange(10**6, 10**6 + new) if dynamic_keys is None else dynamic_keys
        parts = {
            "dynamic": delta_format.TableDelta(
                dynamic_keys, np.zeros([len(dynamic_keys), dims[0]]), evicted=evicted, dim=dims[0]
            ),
            "static": delta_format.TableDelta(static_keys, np.full([static_keys.size, dims[1]], fill), dim=dims[1]),
        }
        tables = [parts[t["name"]] for t in meta["layout"]["tables"]]
        path = str(tmp_path / f"{name}.delta")
        delta_format.write_delta(
            path,
            model_id=model_id if model_id is not None else delta_format.fingerprint64(pub.model_id),
            layout_id=layout_id if layout_id is not None else meta["layout_id"],
            version=2,
            base_version=1,
            step=0,
            tables=tables,
            dense=dense,
        )
        return path

    def rewritten(name, data, words=None, patch=None):
        """`data` with header words replaced ({index: value}) and/or its payload patched (`patch(payload,
        header)`), the checksum recomputed: a file only a crafted header or payload can refuse."""
        h = int(np.frombuffer(data[16:24], "<i8")[0])
        header = np.frombuffer(data[delta_format.PREAMBLE : delta_format.PREAMBLE + h], "<i8").copy()
        for index, value in (words or {}).items():
            header[index] = value
        payload = bytearray(data[delta_format.PREAMBLE + h :])
        if patch is not None:
            patch(payload, header)
        body = header.tobytes() + bytes(payload)
        checksum = delta_format.checksum(body)
        fields = np.array([delta_format.FORMAT_VERSION, h, len(payload), checksum], "<i8")
        return put(name, delta_format.MAGIC + fields.tobytes() + body)

    bad["model"] = (crafted("model", model_id=delta_format.fingerprint64("another")), "another model")
    bad["layout"] = (crafted("layout", layout_id=12345), "another table layout")
    bad["dim"] = (crafted("dim", dims=(util.DIM, util.DIM + 1)), "table static: dim 5")
    bad["row_id"] = (crafted("row_id", static_keys=np.array([0, util.V], np.int64)), f"row id {util.V} outside")
    capacity = [t for t in meta["layout"]["tables"] if t["kind"] == "dynamic"][0]["capacity"]
    bad["capacity"] = (crafted("capacity", new=capacity + 1, static_keys=empty), "free slots")
    # Keys out of order (as a writer other than the publisher may give them): a dynamic table's keys, one repeated;
    # its evicted keys; a static table's row ids. One key both written and evicted.
    repeated = np.array([10**6, 10**6 + 5, 10**6 + 5], np.int64)
    bad["repeated"] = (
        crafted("repeated", dynamic_keys=repeated),
        "table dynamic: keys not strictly ascending: 1000005 at 2 (0-based) after 1000005",
    )
    bad["evicted_unsorted"] = (
        crafted("evicted_unsorted", evicted=np.array([7, 9, 8], np.int64)),
        "table dynamic: evicted keys not strictly ascending: 8 at 2 (0-based) after 9",
    )
    bad["ids_unsorted"] = (
        crafted("ids_unsorted", static_keys=np.array([2, 0, 1], np.int64)),
        "table static: row ids not strictly ascending: 0 at 1 (0-based) after 2",
    )
    both = np.array([10**6, 10**6 + 1], np.int64)
    bad["written_and_evicted"] = (
        crafted("written_and_evicted", dynamic_keys=both, evicted=both[1:]),
        "table dynamic: 1 keys are both written and evicted",
    )
    # Sizes that overflow int64 when multiplied: 2**61 rows of an empty payload (2**61 * 8 and 2**61 * dim * 4 wrap
    # to 0, the rows' byte count), and a dense offset near 2**63 (offset + bytes wraps negative).
    static_index = [t["name"] for t in meta["layout"]["tables"]].index("static")
    rows_word = delta_format.HEADER_FIXED + delta_format.TABLE_FIELDS * static_index + 2
    empty_delta = open(crafted("empty", static_keys=empty), "rb").read()
    bad["rows_overflow"] = (rewritten("rows_overflow", empty_delta, {rows_word: 2**61}), "segments outside the payload")
    dense_word = delta_format.HEADER_FIXED + delta_format.TABLE_FIELDS * len(meta["layout"]["tables"])
    bad["dense_overflow"] = (rewritten("dense_overflow", data, {dense_word: 2**63 - 8}), "dense variable")
    # Checksum-valid deltas with non-finite values: a row, a dense weight.
    bad["nan_row"] = (crafted("nan_row", fill=np.nan), "table static: row 0 of the delta (0-based")
    bad["inf_row"] = (crafted("inf_row", fill=np.inf), "is not finite")

    def nan_dense(payload, header):
        offset = int(header[dense_word])
        payload[offset : offset + 4] = np.array([np.nan], np.float32).tobytes()

    bad["nan_dense"] = (rewritten("nan_dense", data, patch=nan_dense), "a value is not finite")
    return good, bad


def test_every_bad_delta_is_refused_with_its_file_and_reason_and_nothing_changes(tmp_path):
    model, table, pub = _published_once(tmp_path, dynamic_headroom=0.0, min_free_slots=40)
    good, bad = _bad_deltas(tmp_path, pub, model, table)
    served = tf.saved_model.load(str(tmp_path / "chain" / "1"))
    probe = _probe()
    state, out = util.served_state(served), _serve(served, probe)
    for name, (path, words) in bad.items():
        with pytest.raises(tf.errors.InvalidArgumentError) as err:
            served.signatures["apply_delta"](path=tf.constant(path))
        assert path in err.value.message and words in err.value.message, (name, err.value.message)
        util.assert_same_state(util.served_state(served), state)
        np.testing.assert_array_equal(_serve(served, probe), out)
    # After all the refusals, the good delta still applies.
    assert int(served.signatures["apply_delta"](path=tf.constant(good["v2"]))["version"]) == 2


@pytest.mark.slow  # ~7 s: trains, publishes and reloads several versions
def test_publish_delta_writes_what_the_tracker_reports_and_falls_back_to_a_full_version(tmp_path):
    """publish_delta over a reference tracker (table comparison): deltas while the new keys fit, then a full
    version when they do not."""
    model, _, table = util.dynamic_model()
    util.fit(model, seed=0)
    pub = Publisher(model, str(tmp_path), util.SIGNATURE, dynamic_headroom=0.0, min_free_slots=12)
    pub._tracker = util.DiffTracker(pub)
    pub.publish_full()
    served = tf.saved_model.load(str(tmp_path / "1"))
    probe = _probe()
    util.fit(model, seed=1, high=30)  # no new keys
    version = pub.publish_delta()
    entry = read_manifest(str(tmp_path))["chain"][-1]
    assert (entry["version"], entry["kind"], entry["base"]) == (version, "delta", 1)
    served.signatures["apply_delta"](path=tf.constant(str(tmp_path / entry["path"])))
    np.testing.assert_array_equal(_serve(served, probe), _serve(_full_export(model, str(tmp_path / "f")), probe))
    util.fit(model, seed=2, high=60)  # about 30 new keys: more than the 12 free slots
    version = pub.publish_delta()
    entry = read_manifest(str(tmp_path))["chain"][-1]
    assert (entry["version"], entry["kind"]) == (version, "full")
    fresh = tf.saved_model.load(str(tmp_path / str(version)))
    np.testing.assert_array_equal(_serve(fresh, probe), _serve(_full_export(model, str(tmp_path / "g")), probe))


def test_publish_delta_needs_a_full_version_first(tmp_path):
    model, _, _ = util.dynamic_model()
    pub = Publisher(model, str(tmp_path), util.SIGNATURE)
    with pytest.raises(RuntimeError, match="publish_full"):
        pub.publish_delta()
    with pytest.raises(ValueError, match="dense_every"):
        Publisher(model, str(tmp_path), util.SIGNATURE, dense_every=0)


@pytest.mark.slow
def test_a_serving_process_without_tf_embed_ops_applies_the_chain(tmp_path):
    model, table, pub = _published_once(tmp_path, min_free_slots=64)
    probe = _probe()
    steps = [{"load": str(tmp_path / "chain" / "1")}, {"version": True}]
    expected = []
    for round_ in range(1, 3):
        version = pub.write_delta(_train_round(pub, model, table, round_))
        path = str(tmp_path / "chain" / "deltas" / f"{version}.delta")
        if round_ == 2:  # a corrupted copy first: refused, the server keeps serving version 2
            data = bytearray(open(path, "rb").read())
            data[-3] ^= 1
            corrupt = str(tmp_path / "corrupt.delta")
            open(corrupt, "wb").write(bytes(data))
            steps += [{"apply": corrupt}, {"version": True}]
        steps += [{"apply": path}, {"serve": util.feed_of(probe)}]
        expected.append(_serve(_full_export(model, str(tmp_path / f"full{round_}")), probe))
    results = util.run_server(steps)
    assert results[1] == {"version": 1, "ok": True}
    assert results[2] == {"version": 2, "ok": True}
    np.testing.assert_array_equal(np.array(results[3]["output_0"], np.float32), expected[0])
    assert (
        not results[4]["ok"] and "checksum mismatch" in results[4]["error"] and "corrupt.delta" in results[4]["error"]
    )
    assert results[5] == {"version": 2, "ok": True}
    assert results[6] == {"version": 3, "ok": True}
    np.testing.assert_array_equal(np.array(results[7]["output_0"], np.float32), expected[1])


_PUBLISHER_CHILD = r"""
import sys
sys.path.insert(0, {root!r})
from tests import serving_delta_util as util
from tf_embed_ops.serving import Publisher
model, _, table = util.dynamic_model()
pub = Publisher(model, {directory!r}, util.SIGNATURE, min_free_slots=4096)
print("full", pub.publish_full(), flush=True)
for round_ in range(1, 10**6):
    before = util.Snapshot(pub)
    util.fit(model, seed=round_, high=30 + round_)
    print("delta", pub.write_delta(util.Snapshot(pub).touched_since(before)), flush=True)
    if round_ % 4 == 0:
        print("full", pub.publish_full(), flush=True)
"""


@pytest.mark.slow
def test_a_publish_killed_at_random_points_leaves_a_consistent_chain(tmp_path):
    import random
    import signal
    import subprocess
    import sys
    import time

    directory = str(tmp_path / "chain")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rng = random.Random(7)
    for _ in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", _PUBLISHER_CHILD.format(root=root, directory=directory)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert child.stdout.readline().startswith("full")  # the publisher is up and has published once
        time.sleep(rng.uniform(0.0, 3.0))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        child.stdout.close()
    chain = util.consistent_chain(directory)
    last_full = [e for e in chain if e["kind"] == "full"][-1]
    served = tf.saved_model.load(os.path.join(directory, last_full["path"]))
    for entry in chain[chain.index(last_full) + 1 :]:
        served.signatures["apply_delta"](path=tf.constant(os.path.join(directory, entry["path"])))
    assert int(served.signatures["served_version"]()["version"]) == chain[-1]["version"]
    # A new publisher removes the temporaries and continues past every number used, listed or not.
    model, _, _ = util.dynamic_model()
    pub = Publisher(model, directory, util.SIGNATURE)
    assert not [e for e in os.listdir(directory) if ".tmp-" in e]
    used = [int(e) for e in os.listdir(directory) if e.isdigit()]
    assert pub.publish_full() > max(used + [chain[-1]["version"]])


_SESSION_SERVER = (
    util.WITHOUT_TF_EMBED_OPS
    + r"""args = json.loads(sys.stdin.read())
with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as sess:
    sigs = tf.compat.v1.saved_model.loader.load(sess, ["serve"], args["load"]).signature_def
    ap, sv, serve = sigs["apply_delta"], sigs["served_version"], sigs["serving_default"]
    for path in args["deltas"]:
        sess.run(ap.outputs["version"].name, {ap.inputs["path"].name: path})
    feed = {serve.inputs[k].name: v for k, v in args["feed"].items()}
    out = sess.run(serve.outputs["output_0"].name, feed)
    print(json.dumps({"version": int(sess.run(sv.outputs["version"].name)), "out": out.tolist()}))
"""
)


@pytest.mark.slow
def test_a_graph_mode_session_loader_applies_deltas_as_tensorflow_serving_would(tmp_path):
    """TensorFlow Serving loads a SavedModel with the TF1 loader (restore, then the init op) and runs signatures
    in a session: the same path here, in a process without tf_embed_ops."""
    import json

    model, table, pub = _published_once(tmp_path, min_free_slots=64)
    deltas = []
    for round_ in range(1, 3):
        version = pub.write_delta(_train_round(pub, model, table, round_))
        deltas.append(str(tmp_path / "chain" / "deltas" / f"{version}.delta"))
    probe = _probe()
    expected = _serve(_full_export(model, str(tmp_path / "full")), probe)
    args = {"load": str(tmp_path / "chain" / "1"), "deltas": deltas, "feed": util.feed_of(probe)}
    result = util.run_plain(_SESSION_SERVER, args)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["version"] == 3
    np.testing.assert_array_equal(np.array(out["out"], np.float32), expected)
