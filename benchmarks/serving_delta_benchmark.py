"""``python -m benchmarks --only serving_delta``: deltas from a trainer to a live servable in another process.

A model with one static table (V rows, dim 64) and one dynamic table; a serving process of plain TensorFlow (it
cannot import tf_embed_ops) loads the full version, then applies deltas of a growing number of touched rows while
a second thread keeps sending lookups. Measured per delta: its bytes against touched rows x (key + row bytes), the
publish time (rows read from the tables, the file written and synced), the apply time in the serving process, the
serving process's peak resident memory while applying against its steady state, and the lookup latency (median,
p99) while applying against at rest. At the end the delta-fed servable is compared with a full version taken at
the same state, output for output (bit-identical or not).

The rows are changed by writing the training tables directly (random values on random rows, random new keys in
the dynamic table, some keys evicted), so that the figures are those of the delta path alone; the tracker's cost
is measured in the fused-step section.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from tf_embed_ops.examples.json_lines_child import WITHOUT_TF_EMBED_OPS, JsonLinesChild

SERVER = (
    WITHOUT_TF_EMBED_OPS
    + r"""
import json, os, sys, threading, time
import numpy as np
import tensorflow as tf

def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

models = {}
for line in sys.stdin:
    cmd = json.loads(line)
    out = {}
    if cmd["op"] == "load":
        models[cmd["as"]] = tf.saved_model.load(cmd["path"])
    m = models.get(cmd.get("as", "live"))
    feed = {k: tf.constant(v, tf.int64) for k, v in cmd.get("feed", {}).items()}
    if cmd["op"] == "load":
        for _ in range(20):  # warm up: traces, allocator
            m.signatures["serving_default"](**feed)
        out = {"rss": rss("VmRSS")}
    elif cmd["op"] == "apply":
        latencies, stop = [], threading.Event()
        def load_loop():
            while not stop.is_set():
                t = time.perf_counter()
                m.signatures["serving_default"](**feed)
                latencies.append(time.perf_counter() - t)
        # At rest: the same lookup thread, for as long as the previous apply took (at least 0.5 s).
        worker = threading.Thread(target=load_loop)
        worker.start()
        time.sleep(cmd["rest_s"])
        stop.set(); worker.join()
        rest, latencies, stop = latencies, [], threading.Event()
        steady = rss("VmRSS")
        reset_peak()
        worker = threading.Thread(target=load_loop)
        worker.start()
        t = time.perf_counter()
        version = int(m.signatures["apply_delta"](path=tf.constant(cmd["path"]))["version"])
        apply_s = time.perf_counter() - t
        stop.set(); worker.join()
        out = {"version": version, "apply_s": apply_s, "at": time.time(), "steady_rss": steady,
               "peak_rss": rss("VmHWM"), "rest": rest, "during": latencies}
    elif cmd["op"] == "outputs":
        out = {"out": m.signatures["serving_default"](**feed)["output_0"].numpy().tobytes().hex()}
    elif cmd["op"] == "quit":
        break
    print(json.dumps(out), flush=True)
"""
)


def _model(vocab: int, dim: int, dynamic_keys: int):
    import keras
    import tensorflow as tf

    import tf_embed_ops as te

    emb = tf.tpu.experimental.embedding
    static = te.TableConfig(vocab, dim, name="static", optimizer=te.optimizers.SGD(0.1))
    dynamic = te.DynamicTableConfig("dynamic", dim, optimizer=te.optimizers.SGD(0.1))
    layer = te.keras.TPUEmbedding({"s": emb.FeatureConfig(static), "d": emb.FeatureConfig(dynamic)})
    ids = {"s": keras.Input(shape=(), dtype="int64", name="s"), "d": keras.Input(shape=(), dtype="int64", name="d")}
    acts = layer(ids)
    out = keras.layers.Dense(1, name="head")(keras.layers.Concatenate()([acts["s"], acts["d"]]))
    model = keras.Model(ids, out)
    table = layer.dynamic_tables[dynamic]
    rng = np.random.default_rng(0)
    keys = np.arange(dynamic_keys, dtype=np.int64) * 7 + 3
    table.import_(tf.constant(keys), tf.constant(rng.normal(size=(dynamic_keys, dim)).astype(np.float32)))
    signature = {"s": tf.TensorSpec([None], tf.int64), "d": tf.TensorSpec([None], tf.int64)}
    return model, layer, table, keys, signature


def _pct(values: list, q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q)) if values else float("nan")


def run(opts, log=print) -> dict:
    """Runs the section; returns {"params", "points": [...], "bit_identical"}."""
    import tensorflow as tf

    from tf_embed_ops.serving import Publisher

    smoke = opts.smoke
    vocab, dim = (20_000, 64) if smoke else (2_000_000, 64)
    dynamic_keys = 2_000 if smoke else 200_000
    touched_curve = [100, 1_000, 10_000] if smoke else [1_000, 10_000, 100_000, 1_000_000]
    directory = tempfile.mkdtemp(prefix="serving_delta_")
    model, layer, table, keys, signature = _model(vocab, dim, dynamic_keys)
    static_var = [v for c, v in layer.embedding_tables.items() if c.name == "static"][0]
    static_var = getattr(static_var, "value", static_var)
    rng = np.random.default_rng(1)
    probe = {"s": rng.integers(vocab, size=512).tolist(), "d": rng.choice(keys, size=512).tolist()}
    pub = Publisher(model, directory, signature, dense_every=10**9, dynamic_headroom=0.5)
    t = time.perf_counter()
    pub.publish_full()
    full_s = time.perf_counter() - t
    server = JsonLinesChild(SERVER, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, close_timeout=120)
    points = []
    try:
        loaded = server.ask(op="load", path=os.path.join(directory, "1"), feed=probe, **{"as": "live"})
        log(
            f"serving_delta: full version of {vocab:,} x {dim} + {dynamic_keys:,} keys in {full_s:.1f} s, "
            f"serving process {loaded['rss'] / 2**20:.0f} MiB"
        )
        # A first, empty delta: the serving process traces apply_delta once (not part of the figures).
        warm = pub.write_delta({}, dense=False)
        server.ask(
            op="apply",
            path=os.path.join(directory, pub_entry(directory, warm)["path"]),
            feed=probe,
            rest_s=0.1,
            **{"as": "live"},
        )
        live = keys.copy()
        next_key = int(keys.max()) + 7
        cases = [("static", n) for n in touched_curve] + [("dynamic", min(dynamic_keys // 2, touched_curve[-1] // 10))]
        for kind, n in cases:
            if kind == "static":
                rows = np.sort(rng.choice(vocab, size=n, replace=False)).astype(np.int64)
                values = rng.normal(size=(n, dim)).astype(np.float32)
                static_var.scatter_update(tf.IndexedSlices(tf.constant(values), tf.constant(rows)))
                touched = {"static": (rows, np.zeros([0], np.int64))}
                evicted = np.zeros([0], np.int64)
                changed = rows
            else:
                # A tenth of the touched keys are new, a twentieth of the live ones are evicted.
                new = np.arange(next_key, next_key + 7 * (n // 10), 7, dtype=np.int64)
                next_key += 7 * (n // 10)
                old = rng.choice(live, size=n - new.size, replace=False)
                evicted = rng.choice(np.setdiff1d(live, old), size=n // 20, replace=False)
                changed = np.concatenate([old, new])
                _upsert(table, changed, rng.normal(size=(changed.size, dim)).astype(np.float32))
                table.evict_keys(tf.constant(evicted))
                live = np.union1d(np.setdiff1d(live, evicted), new)
                touched = {"dynamic": (changed, evicted)}
            t = time.perf_counter()
            version = pub.write_delta(touched, dense=False)
            publish_s = time.perf_counter() - t
            entry = pub_entry(directory, version)
            result = server.ask(
                op="apply",
                path=os.path.join(directory, entry["path"]),
                feed=probe,
                rest_s=max(0.5, points[-1]["apply_s"] if points else 0.5),
                **{"as": "live"},
            )
            bound = changed.size * (8 + dim * 4) + evicted.size * 8
            point = {
                "table": kind,
                "touched_rows": int(changed.size),
                "evicted": int(evicted.size),
                "bytes": entry["bytes"],
                "bytes_ratio": entry["bytes"] / bound,
                "publish_s": publish_s,
                "apply_s": result["apply_s"],
                "publish_to_servable_s": publish_s + result["apply_s"],
                "steady_rss": result["steady_rss"],
                "peak_rss": result["peak_rss"],
                "memory_ratio": result["peak_rss"] / result["steady_rss"],
                "rest_median_ms": _pct(result["rest"], 50),
                "rest_p99_ms": _pct(result["rest"], 99),
                "during_median_ms": _pct(result["during"], 50),
                "during_p99_ms": _pct(result["during"], 99),
                "during_calls": len(result["during"]),
            }
            point["latency_ratio_median"] = point["during_median_ms"] / point["rest_median_ms"]
            point["latency_ratio_p99"] = point["during_p99_ms"] / point["rest_p99_ms"]
            points.append(point)
            log(
                f"serving_delta {kind} {changed.size:>9,} rows: {entry['bytes'] / 2**20:8.1f} MiB "
                f"(x{point['bytes_ratio']:.4f} of keys+rows), publish {publish_s:.2f} s + apply "
                f"{result['apply_s']:.2f} s = {point['publish_to_servable_s']:.2f} s; "
                f"memory x{point['memory_ratio']:.3f}; "
                f"lookup median x{point['latency_ratio_median']:.2f} p99 x{point['latency_ratio_p99']:.2f}"
            )
        # Bit identity: a full version taken now, served next to the delta-fed one.
        full = pub.publish_full()
        server.ask(op="load", path=os.path.join(directory, str(full)), feed=probe, **{"as": "full"})
        a = server.ask(op="outputs", feed=probe, **{"as": "live"})["out"]
        b = server.ask(op="outputs", feed=probe, **{"as": "full"})["out"]
        identical = a == b
        log(f"serving_delta: delta-fed servable {'bit-identical to' if identical else 'DIFFERS from'} a full version")
    finally:
        server.close()
    import shutil

    shutil.rmtree(directory, ignore_errors=True)
    return {
        "params": {"vocab": vocab, "dim": dim, "dynamic_keys": dynamic_keys, "full_publish_s": full_s},
        "points": points,
        "bit_identical": identical,
        "load_average": os.getloadavg(),
    }


def _upsert(table, keys: np.ndarray, values: np.ndarray) -> None:
    """Gives `keys` these rows in a dynamic table (new keys inserted), as training would."""
    import tensorflow as tf

    contents = {k: v.numpy() for k, v in table.export().items()}
    merged = dict(zip(contents["keys"].tolist(), contents["weights"], strict=True))
    for k, v in zip(keys.tolist(), values, strict=True):
        merged[k] = v
    order = sorted(merged)
    table.import_(tf.constant(order, tf.int64), tf.constant(np.stack([merged[k] for k in order])))


def pub_entry(directory: str, version: int) -> dict:
    from tf_embed_ops.serving import read_manifest

    return [e for e in read_manifest(directory)["chain"] if e["version"] == version][0]
