"""``python -m benchmarks --only serving_delta``: deltas from a trainer to a live servable in another process.

A model with one static table (V rows, dim 64) and one dynamic table; a serving process of plain TensorFlow (it
cannot import tf_embed_ops) loads the full version, then applies deltas of a growing number of touched rows while a
second thread keeps sending lookups. Each point applies deltas of one size, one after another, until its lookups
while applying number MIN_CALLS; before each apply the same thread times lookups at rest for as long as the last
apply took (the thread makes a few calls before its first window: a thread's first lookup costs about three later
ones, and would be the p99 of a short window). Measured per point: a delta's bytes against touched rows x (key +
row bytes), the publish time (rows read from the tables, the file written and synced) and the apply time in the
serving process (medians), the serving process's peak resident memory while applying against its steady state (the
worst apply), and the lookup latency (median, p99 of the pooled calls) while applying against at rest. The serving
process applies an empty delta and one delta a table first, unmeasured: a process's first writes cost more, once.
At the end the delta-fed servable is compared with a full version taken at the same state, output for output
(bit-identical or not).

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

WARM_CALLS = 5

def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

def windows(m, feed, rest_s, work):
    # Lookups from one thread, for rest_s at rest, then while work() runs. The thread makes WARM_CALLS calls
    # first, uncounted: a thread's first call costs several later ones, and in a window of a few calls it would be
    # the p99. A call is counted at rest if it lies in the rest window, during if it overlaps work().
    calls, failed, stop, warm = [], [], threading.Event(), threading.Event()
    def timed():
        try:
            while not stop.is_set():
                t = time.perf_counter()
                m.signatures["serving_default"](**feed)
                calls.append((t, time.perf_counter()))
                if len(calls) == WARM_CALLS:
                    warm.set()
        except Exception as e:
            failed.append(e)
        finally:
            warm.set()
    worker = threading.Thread(target=timed)
    worker.start()
    warm.wait()
    rest_start = time.perf_counter()
    time.sleep(rest_s)
    out = {"steady_rss": rss("VmRSS")}
    reset_peak()
    start = time.perf_counter()
    try:
        out["result"] = work()
    finally:
        end = time.perf_counter()
        stop.set(); worker.join()
    if failed:
        raise failed[0]
    out["seconds"] = end - start
    out["rest"] = [b - a for a, b in calls if a >= rest_start and b <= start]
    out["during"] = [b - a for a, b in calls if b > start and a < end]
    # The window's peak includes its start: a page the lookups gave back between the steady read and the reset
    # left VmHWM 4 KB under the steady state.
    out["peak_rss"] = max(rss("VmHWM"), out["steady_rss"])
    return out

def on_private_thread(ds):
    # One private thread, one intra-op thread: as the servable's apply_delta runs its chunks.
    specs = tf.nest.flatten(ds.element_spec)
    kw = dict(output_types=[s.dtype for s in specs], output_shapes=[s.shape for s in specs])
    v = tf.raw_ops.MaxIntraOpParallelismDataset(
        input_dataset=tf.data.experimental.to_variant(ds), max_intra_op_parallelism=tf.constant(1, tf.int64), **kw)
    v = tf.raw_ops.PrivateThreadPoolDataset(input_dataset=v, num_threads=tf.constant(1, tf.int64), **kw)
    return tf.data.experimental.from_variant(v, ds.element_spec)

def busy(rows, dim, chunk_rows):
    # One private thread copying random rows of a separate table, chunk by chunk, for `seconds`: what any apply
    # that writes rows beside the lookups costs them at least, with no lock or row shared with them. Traced here,
    # before any window.
    table = tf.Variable(tf.zeros([rows, dim]))
    def one(i):
        src = tf.random.uniform([chunk_rows], 0, rows, tf.int64, seed=1)
        dst = tf.random.uniform([chunk_rows], 0, rows, tf.int64, seed=2)
        done = table.scatter_update(tf.IndexedSlices(tf.gather(table, src), dst))
        with tf.control_dependencies([done]):
            return tf.constant(1, tf.int64)
    @tf.function(input_signature=[tf.TensorSpec([], tf.float64)])
    def run(seconds):
        deadline = tf.timestamp() + seconds
        ds = tf.data.Dataset.range(1 << 62).take_while(lambda i: tf.timestamp() < deadline).map(one)
        ds = on_private_thread(ds.batch(1 << 62)).concatenate(tf.data.Dataset.from_tensors(tf.zeros([0], tf.int64)))
        return tf.size(ds.take(1).get_single_element())
    run(tf.constant(0.0, tf.float64))
    return run

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
        path = tf.constant(cmd["path"])
        w = windows(m, feed, cmd["rest_s"], lambda: int(m.signatures["apply_delta"](path=path)["version"]))
        out = {"version": w.pop("result"), "apply_s": w.pop("seconds"), **w}
    elif cmd["op"] == "busy":
        run = busy(cmd["rows"], cmd["dim"], cmd["chunk_rows"])
        seconds = tf.constant(cmd["seconds"], tf.float64)
        w = windows(m, feed, cmd["rest_s"], lambda: int(run(seconds)))
        del run  # and its table
        out = {"apply_s": w.pop("seconds"), "chunks": w.pop("result"), "rest": w["rest"], "during": w["during"]}
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


# A point's lookup figures rest on at least this many calls while applying (and about as many at rest): each
# point applies deltas of its size until it has them, between MIN_REPEATS and MAX_REPEATS deltas. The p99 of the
# 25 calls one short apply spans is their slowest call, not a percentile.
MIN_CALLS, MIN_REPEATS, MAX_REPEATS = 1000, 2, 150
# Rows of the separate table the floor's thread copies (64 MiB at dim 64: well past the caches, and allocated
# only for its window, so it leaves the memory figures alone).
BUSY_ROWS = 1 << 18


def run(opts, log=print) -> dict:
    """Runs the section; returns {"params", "points": [...], "bit_identical"}."""
    from tf_embed_ops.serving import Publisher
    from tf_embed_ops.serving.servable import APPLY_CHUNK_BYTES

    smoke = opts.smoke
    vocab, dim = (20_000, 64) if smoke else (2_000_000, 64)
    dynamic_keys = 2_000 if smoke else 200_000
    touched_curve = [100, 1_000, 10_000] if smoke else [1_000, 10_000, 100_000, 1_000_000]
    min_calls, min_repeats = (20, 1) if smoke else (MIN_CALLS, MIN_REPEATS)
    chunk_rows = APPLY_CHUNK_BYTES // (dim * 4)
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
    changes = _Changes(rng, vocab, dim, static_var, table, keys)
    points = []
    try:
        loaded = server.ask(op="load", path=os.path.join(directory, "1"), feed=probe, **{"as": "live"})
        log(
            f"serving_delta: full version of {vocab:,} x {dim} + {dynamic_keys:,} keys in {full_s:.1f} s, "
            f"serving process {loaded['rss'] / 2**20:.0f} MiB"
        )

        def apply(touched, rest_s):
            t = time.perf_counter()
            version = pub.write_delta(touched, dense=False)
            publish_s = time.perf_counter() - t
            entry = pub_entry(directory, version)
            path = os.path.join(directory, entry["path"])
            result = server.ask(op="apply", path=path, feed=probe, rest_s=rest_s, **{"as": "live"})
            return entry, publish_s, result

        # Not measured: an empty delta (the serving process traces apply_delta), then one delta a table (the first
        # writes of a process cost more, once: its first non-empty apply takes tens of milliseconds more).
        warmup = [apply({}, 0.01)[2]["apply_s"]]
        for kind in ("static", "dynamic"):
            warmup.append(apply(changes.make(kind, min(1_000, touched_curve[0]))[0], 0.01)[2]["apply_s"])
        log("serving_delta: warm-up applies (empty, static, dynamic) " + ", ".join(f"{s:.3f} s" for s in warmup))
        cases = [("static", n) for n in touched_curve] + [("dynamic", min(dynamic_keys // 2, touched_curve[-1] // 10))]
        rest_s = 0.05
        for kind, n in cases:
            runs, floor = [], []
            while len(runs) < MAX_REPEATS and (
                len(runs) < min_repeats or sum(len(r["during"]) for _, _, r, _ in runs) < min_calls
            ):
                touched, changed, evicted = changes.make(kind, n)
                # The at-rest window, just before its apply, lasts as long as the last apply took.
                entry, publish_s, result = apply(touched, rest_s)
                rest_s = max(0.01, result["apply_s"])
                runs.append((entry, publish_s, result, (changed.size, evicted.size)))
                # The machine's turn, next to ours: one thread copying rows for as long as the apply took.
                ask = {"rows": BUSY_ROWS, "dim": dim, "chunk_rows": chunk_rows, "seconds": rest_s, "rest_s": rest_s}
                floor.append(server.ask(op="busy", feed=probe, **ask, **{"as": "live"}))
            points.append(_point(kind, dim, runs, floor))
            p = points[-1]
            log(
                f"serving_delta {kind} {p['touched_rows']:>9,} rows x {p['repeats']}: {p['bytes'] / 2**20:8.1f} MiB "
                f"(x{p['bytes_ratio']:.4f} of keys+rows), publish {p['publish_s']:.2f} s + apply "
                f"{p['apply_s']:.2f} s = {p['publish_to_servable_s']:.2f} s; memory x{p['memory_ratio']:.3f}; "
                f"lookup median x{p['latency_ratio_median']:.2f} p99 x{p['latency_ratio_p99']:.2f} "
                f"({p['during_calls']} calls applying, {p['rest_calls']} at rest)"
                + f"; floor p99 x{p['floor_latency_ratio_p99']:.2f}"
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
        "params": {
            "vocab": vocab,
            "dim": dim,
            "dynamic_keys": dynamic_keys,
            "full_publish_s": full_s,
            "warmup_apply_s": warmup,
            "min_calls": min_calls,
        },
        "points": points,
        "bit_identical": identical,
        "load_average": os.getloadavg(),
        "measured_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _point(kind: str, dim: int, runs: list, floor: list) -> dict:
    """One point's figures from its deltas: medians of the times, the worst memory, lookups pooled over the
    windows (each at-rest window just before its apply); `floor_*`, the same of the busy thread's windows."""
    entry, _, _, (touched, evicted) = runs[0]
    worst = max((r for _, _, r, _ in runs), key=lambda r: r["peak_rss"] / r["steady_rss"])
    bound = touched * (8 + dim * 4) + evicted * 8
    point = {
        "table": kind,
        "touched_rows": int(touched),
        "evicted": int(evicted),
        "repeats": len(runs),
        "bytes": entry["bytes"],
        "bytes_ratio": entry["bytes"] / bound,
        "publish_s": float(np.median([p for _, p, _, _ in runs])),
        "apply_s": float(np.median([r["apply_s"] for _, _, r, _ in runs])),
        "publish_to_servable_s": float(np.median([p + r["apply_s"] for _, p, r, _ in runs])),
        "steady_rss": worst["steady_rss"],
        "peak_rss": worst["peak_rss"],
        "memory_ratio": worst["peak_rss"] / worst["steady_rss"],
        **_lookups([r for _, _, r, _ in runs], ""),
    }
    point.update(_lookups(floor, "floor_"))
    return point


def _lookups(results: list, prefix: str) -> dict:
    """Lookup latency while applying against at rest, pooled over the windows of `results`."""
    rest = [x for r in results for x in r["rest"]]
    during = [x for r in results for x in r["during"]]
    out = {
        "rest_median_ms": _pct(rest, 50),
        "rest_p99_ms": _pct(rest, 99),
        "rest_calls": len(rest),
        "during_median_ms": _pct(during, 50),
        "during_p99_ms": _pct(during, 99),
        "during_calls": len(during),
    }
    out["latency_ratio_median"] = out["during_median_ms"] / out["rest_median_ms"]
    out["latency_ratio_p99"] = out["during_p99_ms"] / out["rest_p99_ms"]
    return {prefix + k: v for k, v in out.items()}


class _Changes:
    """Changes to the training tables, as a delta's `touched` (written directly: the figures are the delta
    path's, not the tracker's)."""

    def __init__(self, rng, vocab: int, dim: int, static_var, table, keys: np.ndarray):
        self.rng, self.vocab, self.dim, self.static_var, self.table = rng, vocab, dim, static_var, table
        self.live = keys.copy()
        self.next_key = int(keys.max()) + 7

    def make(self, kind: str, n: int) -> tuple:
        """Changes `n` rows of one table; returns (touched, changed keys or rows, evicted keys)."""
        import tensorflow as tf

        rng, dim = self.rng, self.dim
        if kind == "static":
            rows = np.sort(rng.choice(self.vocab, size=n, replace=False)).astype(np.int64)
            values = rng.normal(size=(n, dim)).astype(np.float32)
            self.static_var.scatter_update(tf.IndexedSlices(tf.constant(values), tf.constant(rows)))
            return {"static": (rows, np.zeros([0], np.int64))}, rows, np.zeros([0], np.int64)
        # A tenth of the touched keys are new, a twentieth of the live ones are evicted.
        new = np.arange(self.next_key, self.next_key + 7 * (n // 10), 7, dtype=np.int64)
        self.next_key += 7 * (n // 10)
        old = rng.choice(self.live, size=n - new.size, replace=False)
        evicted = rng.choice(np.setdiff1d(self.live, old), size=n // 20, replace=False)
        changed = np.concatenate([old, new])
        _upsert(self.table, changed, rng.normal(size=(changed.size, dim)).astype(np.float32))
        self.table.evict_keys(tf.constant(evicted))
        self.live = np.union1d(np.setdiff1d(self.live, evicted), new)
        return {"dynamic": (changed, evicted)}, changed, evicted


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
