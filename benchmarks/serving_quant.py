"""Section ``serving_quant``: quantized and pruned serving exports (``python -m benchmarks --only serving_quant``).

- **Size**: a model with two dim-64 tables exported as float32, float16, bfloat16, int8 and int4; the SavedModel
  directory's bytes and the ratio to float32 (targets: int8 >= 3.5x, int4 >= 6x smaller).
- **Latency**: the exports loaded in one interpreter in which ``tf_embed_ops`` cannot be imported, the
  ``serving_default`` signature timed on one fixed batch, the exports alternating block by block (the order rotated
  every block); the median and the best block per export and their ratios to float32 (target: <= 1.2x).
- **CTR AUC**: the CTR example trained once, exported as float32, int8, int4 and pruned, each export's test AUC
  (tf_embed_ops/examples/ctr_serving.py; target: int8 within 0.001 of float32).
- **FBGEMM**: its int-N inference kernels (`IntNBitTableBatchedEmbeddingBagsCodegen`, fp32 / int8 / int4 weights)
  on the same tables and batch, in its own interpreter right after ours (benchmarks/peers/fbgemm_serving_peer.py),
  only where its CPU build is installed (/opt/fbgemm-venv, benchmarks/peers/setup_fbgemm.sh); otherwise the
  section says it was skipped.

``report_serving_quant.py`` writes ``serving_quant.json`` and the report section.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

MODES = ("float32", "float16", "bfloat16", "int8", "int4")
DIM = 64
FBGEMM_VENV = "/opt/fbgemm-venv"

# The serving interpreter: tf_embed_ops made unimportable before TensorFlow loads the exports.
_LATENCY_CODE = r"""
import json, sys, time
sys.modules["tf_embed_ops"] = None  # `import tf_embed_ops` now raises ImportError
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[2]))
tf.config.threading.set_inter_op_parallelism_threads(int(sys.argv[2]))
spec = json.loads(sys.argv[1])
feed = {k: tf.constant(v, tf.int64) for k, v in spec["feed"].items()}
fns = {name: tf.saved_model.load(path).signatures["serving_default"] for name, path in spec["exports"].items()}
for fn in fns.values():
    for _ in range(spec["warmup"]):
        fn(**feed)
times = {name: [] for name in fns}
names = list(fns)
for block in range(spec["blocks"]):
    for name in names[block % len(names):] + names[:block % len(names)]:  # rotated: no export always goes first
        fn = fns[name]
        t0 = time.perf_counter()
        for _ in range(spec["calls"]):
            fn(**feed)["output_0"].numpy()
        times[name].append((time.perf_counter() - t0) / spec["calls"] * 1e3)
assert not [m for m in sys.modules if m.startswith("tf_embed_ops") and sys.modules[m] is not None]
print(json.dumps(times))
"""


def _model(vocab_user: int, vocab_item: int):
    import keras
    import tensorflow as tf

    from tf_embed_ops import keras as te_keras

    emb = tf.tpu.experimental.embedding
    user = emb.TableConfig(vocab_user, DIM, name="user", combiner="sum", optimizer=emb.Adagrad(0.05))
    item = emb.TableConfig(vocab_item, DIM, name="item", combiner="mean", optimizer=emb.Adagrad(0.05))
    fc = {"user": emb.FeatureConfig(user, name="user"), "items": emb.FeatureConfig(item, name="items")}
    layer = te_keras.TPUEmbedding(fc, emb.SGD(0.1), name="embedding")
    inputs = {
        "user": keras.Input(shape=(), dtype="int64", name="user"),
        "items": keras.Input(shape=(None,), dtype="int64", ragged=True, name="items"),
    }
    acts = layer(inputs)
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([acts["user"], acts["items"]]))
    model = keras.Model(inputs, out)
    # Trained-looking rows: the initializer's, with a per-row scale spread (rows of very different norms).
    rng = np.random.default_rng(0)
    for table, var in layer.embedding_tables.items():
        rows = rng.normal(size=(table.vocabulary_size, DIM)) * rng.lognormal(-2.0, 0.7, size=(table.vocabulary_size, 1))
        var.assign(rows.astype(np.float32))
    return model


def _signature():
    import tensorflow as tf

    return {
        "user": tf.TensorSpec([None], tf.int64),
        "items": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64),
    }


def _feed(batch: int, vocab_user: int, vocab_item: int, items_per_sample: int) -> dict:
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 2 * items_per_sample, batch)
    return {
        "user": rng.integers(vocab_user, size=batch).tolist(),
        "items_values": rng.integers(vocab_item, size=int(lengths.sum())).tolist(),
        "items_row_splits": np.concatenate([[0], np.cumsum(lengths)]).tolist(),
    }


def bench_size_and_latency(opts, log) -> dict:
    """Exports of one model in every mode: bytes, ratios and serving latency in a plugin-free interpreter."""
    from tf_embed_ops import keras as te_keras
    from tf_embed_ops.serving import metadata

    vocab_user, vocab_item = (4000, 2000) if opts.smoke else (100_000, 50_000)
    batch, items = (64, 4) if opts.smoke else (512, 8)
    model = _model(vocab_user, vocab_item)
    directory = tempfile.mkdtemp(prefix="serving_quant_")
    try:
        exports, sizes = {}, {}
        for mode in MODES:
            exports[mode] = os.path.join(directory, mode)
            t0 = time.perf_counter()
            te_keras.export_for_serving(
                model, exports[mode], _signature(), quantization=None if mode == "float32" else mode
            )
            sizes[mode] = {
                "saved_model_bytes": metadata.saved_model_bytes(exports[mode]),
                "table_bytes": sum(t["bytes"] for t in metadata.read_export_metadata(exports[mode]).values()),
                "export_s": time.perf_counter() - t0,
            }
        base = sizes["float32"]["saved_model_bytes"]
        for mode in MODES:
            sizes[mode]["ratio_vs_float32"] = base / sizes[mode]["saved_model_bytes"]
        log(
            "serving_quant sizes: "
            + ", ".join(
                f"{m} {s['saved_model_bytes'] / 2**20:.1f} MiB ({s['ratio_vs_float32']:.2f}x)" for m, s in sizes.items()
            )
        )
        spec = {
            "exports": exports,
            "feed": _feed(batch, vocab_user, vocab_item, items),
            "warmup": 3 if opts.smoke else 20,
            "blocks": opts.blocks,
            "calls": 5 if opts.smoke else 50,
        }
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.run(
            [sys.executable, "-c", _LATENCY_CODE, json.dumps(spec), str(opts.threads)],
            capture_output=True,
            text=True,
            timeout=1800,
            env=env,
            cwd=directory,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"the serving interpreter failed: {proc.stderr[-2000:]}")
        times = json.loads(proc.stdout.strip().splitlines()[-1])
        # Median and best block: on a shared machine the best block is the least disturbed one.
        latency = {
            m: {"median_ms": float(np.median(t)), "min_ms": float(np.min(t)), "blocks_ms": t} for m, t in times.items()
        }
        for mode in MODES:
            latency[mode]["ratio_vs_float32"] = latency[mode]["median_ms"] / latency["float32"]["median_ms"]
            latency[mode]["min_ratio_vs_float32"] = latency[mode]["min_ms"] / latency["float32"]["min_ms"]
        log(
            "serving_quant latency: "
            + ", ".join(f"{m} {v['median_ms']:.3f} ms ({v['ratio_vs_float32']:.2f}x)" for m, v in latency.items())
        )
        tables = {"user": [vocab_user, DIM, "sum"], "item": [vocab_item, DIM, "mean"]}
        fbgemm = bench_fbgemm(opts, log, {**spec, "tables": tables, "exports": {}})
        return {
            "fbgemm": fbgemm,
            "tables": tables,
            "batch": batch,
            "items_per_sample_mean": items,
            "sizes": sizes,
            "latency": latency,
            "load_avg": os.getloadavg(),
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def bench_ctr_auc(opts, log) -> dict:
    """The CTR example trained once; its float32 / int8 / int4 / pruned exports' test AUC."""
    from tf_embed_ops.examples import ctr_serving

    args = argparse.Namespace(
        smoke=opts.smoke, train_size=40000, test_size=10000, epochs=3, batch_size=256, learning_rate=0.003, quiet=True
    )
    t0 = time.perf_counter()
    results = ctr_serving.run(args)
    for name, r in results.items():
        log(f"serving_quant ctr: {name} test AUC {r['test_auc']:.4f}, {r['saved_model_bytes'] / 2**10:.0f} KiB")
    return {"variants": results, "seconds": time.perf_counter() - t0}


def bench_fbgemm(opts, log, spec: dict) -> dict:
    """FBGEMM's int-N inference kernels on the same tables and batch (embedding lookups only), where its CPU build
    is installed; otherwise a note that says why they were not run."""
    python = opts.fbgemm_python or os.path.join(FBGEMM_VENV, "bin", "python")
    if opts.no_fbgemm:
        return {"available": False, "note": "skipped: --no-fbgemm"}
    if not os.path.exists(python):
        return {"available": False, "note": f"skipped: no {python} (benchmarks/peers/setup_fbgemm.sh)"}
    peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "fbgemm_serving_peer.py")
    proc = subprocess.run(
        [python, peer, json.dumps(spec), str(opts.threads)], capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        return {"available": False, "note": f"FBGEMM peer failed: {proc.stderr.strip()[-300:]}"}
    times = json.loads(proc.stdout.strip().splitlines()[-1])
    out = {m: {"median_ms": float(np.median(t)), "blocks_ms": t} for m, t in times.items()}
    for m in out:
        out[m]["ratio_vs_fp32"] = out[m]["median_ms"] / out["fp32"]["median_ms"]
    log(
        "serving_quant fbgemm: "
        + ", ".join(f"{m} {v['median_ms']:.3f} ms ({v['ratio_vs_fp32']:.2f}x)" for m, v in out.items())
    )
    return {
        "available": True,
        "note": "IntNBitTableBatchedEmbeddingBagsCodegen (CPU), embedding lookups of both tables only, "
        "float32 output, its own interpreter right after ours",
        "latency": out,
    }


def run(opts, log=print) -> dict:
    """The section's results: {"size_latency", "fbgemm", "ctr"}; a part that fails records its error."""
    out = {}
    for key, fn in (("size_latency", bench_size_and_latency), ("ctr", bench_ctr_auc)):
        try:
            out[key] = fn(opts, log)
        except Exception as e:  # a broken part must not lose the others' figures
            out[key] = {"error": f"{type(e).__name__}: {e}"}
            log(f"serving_quant {key}: failed: {out[key]['error']}")
    return out
