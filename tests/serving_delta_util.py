"""Shared fixtures of the serving-delta tests: models with static and dynamic tables, reference deltas computed by
comparing table contents (independent of any tracker), and a serving process that cannot import tf_embed_ops."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import numpy as np
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops.examples import json_lines_child
from tf_embed_ops.serving import delta_format, read_manifest

_emb = tf.tpu.experimental.embedding
V, DIM = 64, 4

SIGNATURE = {"ids": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64)}


def dynamic_model(dtype=tf.float32):
    """A model over one static table (V rows) and one dynamic table, both fed the same ragged ids."""
    static = te.TableConfig(
        V, DIM, name="static", combiner="sum", optimizer=te.optimizers.Adagrad(0.2), storage_dtype=dtype
    )
    dynamic = te.DynamicTableConfig("dynamic", DIM, optimizer=te.optimizers.Adagrad(0.2), combiner="mean", seed=1)
    layer = te.keras.TPUEmbedding({"d": _emb.FeatureConfig(dynamic), "s": _emb.FeatureConfig(static)})
    ids = keras.Input(shape=(None,), dtype="int64", ragged=True, name="ids")
    acts = layer({"d": ids, "s": ids})
    total = keras.layers.Concatenate()([acts["d"], acts["s"]])
    out = keras.layers.Dense(1, name="head")(total)
    model = keras.Model({"ids": ids}, out)
    model.compile(keras.optimizers.Adam(0.05), "mse")
    return model, layer, layer.dynamic_tables[dynamic]


def batches(seed, n=32, high=30):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 4, size=n)
    ids = tf.RaggedTensor.from_row_lengths(tf.constant(rng.integers(0, high, int(lengths.sum())), tf.int64), lengths)
    y = rng.normal(size=(n, 1)).astype(np.float32)
    return {"ids": ids}, y


def fit(model, seed, high=30):
    x, y = batches(seed, high=high)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=1, verbose=0, shuffle=False)


class Snapshot:
    """Table contents at one moment; `touched_since` is the reference delta (rows whose bytes differ, keys
    inserted or changed, keys gone)."""

    def __init__(self, publisher):
        self._pub = publisher
        self.static = {n: v.numpy().copy() for n, v in publisher._static_tables()}
        self.dynamic = {}
        for n, t in publisher._dynamic_tables().items():
            c = t.export()
            self.dynamic[n] = dict(zip(c["keys"].numpy().tolist(), c["weights"].numpy(), strict=True))

    def touched_since(self, before: Snapshot) -> dict:
        out = {}
        for n, now in self.static.items():
            changed = np.nonzero((now.view(np.uint8) != before.static[n].view(np.uint8)).reshape(len(now), -1).any(1))
            out[n] = (changed[0], np.zeros([0], np.int64))
        for n, now in self.dynamic.items():
            prev = before.dynamic[n]
            keys = [k for k, row in now.items() if k not in prev or not np.array_equal(prev[k], row)]
            gone = [k for k in prev if k not in now]
            out[n] = (np.array(sorted(keys), np.int64), np.array(sorted(gone), np.int64))
        return out


def served_state(loaded) -> dict:
    """Everything a served model holds, as numpy (variables, and each dynamic table's key -> slot map)."""
    out = {"version": int(loaded.signatures["served_version"]()["version"])}
    for i, t in enumerate(loaded.tables):
        if hasattr(t, "index"):
            keys, slots = tf.raw_ops.LookupTableExportV2(
                table_handle=t.index.resource_handle, Tkeys=tf.int64, Tvalues=tf.int64
            )
            order = np.argsort(keys.numpy())
            out[f"t{i}"] = (keys.numpy()[order], slots.numpy()[order], t.values.numpy(), t.state.numpy())
        else:
            out[f"t{i}"] = t.numpy()
    for i, v in enumerate(loaded.dense):
        out[f"d{i}"] = v.numpy()
    return out


def assert_same_state(a: dict, b: dict) -> None:
    """Two `served_state`s equal, array for array."""
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], tuple):
            for x, y in zip(a[k], b[k], strict=True):
                np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_array_equal(a[k], b[k])


# The serving process: plain TensorFlow, with tf_embed_ops made unimportable. It reads a JSON list of steps on
# stdin and prints one JSON result per step.
# The start of a serving process's code: plain TensorFlow, with tf_embed_ops made unimportable.
WITHOUT_TF_EMBED_OPS = json_lines_child.WITHOUT_TF_EMBED_OPS + "import json\nimport tensorflow as tf\n"

SERVER = (
    WITHOUT_TF_EMBED_OPS
    + r"""steps = json.loads(sys.stdin.read())
model = None
for step in steps:
    try:
        if "load" in step:
            model = tf.saved_model.load(step["load"])
            out = {"loaded": step["load"]}
        elif "apply" in step:
            out = {"version": int(model.signatures["apply_delta"](path=tf.constant(step["apply"]))["version"])}
        elif "version" in step:
            out = {"version": int(model.signatures["served_version"]()["version"])}
        elif "serve" in step:
            feed = {k: tf.constant(v, tf.int64) for k, v in step["serve"].items()}
            res = model.signatures["serving_default"](**feed)
            out = {k: v.numpy().tolist() for k, v in res.items()}
        out["ok"] = True
    except tf.errors.OpError as e:
        out = {"ok": False, "error": e.message}
    print(json.dumps(out), flush=True)
assert not any(m.split(".")[0] == "tf_embed_ops" for m in sys.modules)
"""
)


def run_plain(code: str, payload, timeout: int | None = None) -> subprocess.CompletedProcess:
    """Runs `code` (a serving process: WITHOUT_TF_EMBED_OPS + ...) in a fresh interpreter, from / and without
    PYTHONPATH, `payload` as JSON on its stdin."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
        env=env,
    )


def run_server(steps: list, timeout: int = 600) -> list:
    result = run_plain(SERVER, steps, timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def feed_of(x) -> dict:
    return {"ids_values": x["ids"].values.numpy().tolist(), "ids_row_splits": x["ids"].row_splits.numpy().tolist()}


class DiffTracker:
    """A stand-in for the touched-row tracker with its API (cursor, changed_since), built from `Snapshot`s: the
    rows whose bytes changed since a cursor. Lets the publisher's own logic be tested against a reference."""

    def __init__(self, publisher):
        self._pub = publisher

    def cursor(self):
        return Snapshot(self._pub)

    def changed_since(self, cursor):
        import types

        now = Snapshot(self._pub)
        touched = now.touched_since(cursor)
        kinds = {n: "static" for n in now.static} | {n: "dynamic" for n in now.dynamic}
        tables = {
            n: types.SimpleNamespace(kind=kinds[n], full=False, rows=rows, evicted=evicted)
            for n, (rows, evicted) in touched.items()
        }
        return types.SimpleNamespace(tables=tables, cursor=now)


def consistent_chain(directory: str) -> list:
    """The chain a publisher killed at any point left in `directory`, asserted consistent: it is what the manifest
    lists, starts with a full version, its versions increase, and every delta builds on the version before (its
    file, checksum verified, says so)."""
    chain = read_manifest(directory)["chain"]
    assert chain[0]["kind"] == "full"
    for previous, entry in zip(chain, chain[1:], strict=False):
        assert entry["version"] > previous["version"]
        if entry["kind"] == "delta":
            assert entry["base"] == previous["version"]
            parsed = delta_format.read_delta(os.path.join(directory, entry["path"]))  # checksum verified
            assert (parsed["version"], parsed["base_version"]) == (entry["version"], entry["base"])
    return chain
