"""TFRA peer: times TensorFlow Recommenders-Addons' dynamic embedding on the keys the suite generated.

Runs in its own interpreter (TFRA pins an older TensorFlow; `setup_tfra.sh` makes the venv), never beside our
TensorFlow. The suite writes a job (JSON) and the keys (`.npy`), calls `<tfra-python> tfra_peer.py JOB.json`, and
reads one JSON object from stdout.

One training step is TFRA's documented Keras path: `de.keras.layers.Embedding` (a `de.Variable` hash table, CPU
`cuckoo` map) looked up under a tape, then `de.DynamicEmbeddingOptimizer` around the Keras optimizer, which
gathers the rows and slots from their hash tables, applies the optimizer and writes them back. The lookup-only
step is `de.Variable.lookup` (no insert). The table is prefilled with every key of the vocabulary first, as ours
and the TF-native peer are.

Job format::

    {"keys": "keys.npy", "prefill": "prefill.npy", "upstream_seed": 7, "dim": 64, "optimizers": ["sgd", "adagrad"],
     "learning_rate": 0.01, "adagrad_init": 0.1, "steps": 0, "blocks": 7, "warmup": 3, "block_ms": 150}

Output: ``{"peer": "tfra", "tensorflow": ver, "tfra": ver, "results": {name: {"block_ms": [...]} | {"error": s}}}``
with names ``sgd``, ``adagrad`` (training steps) and ``lookup``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

# TFRA 0.8 drives tf.keras optimizers; with TensorFlow 2.16 that needs Keras 2 (tf_keras).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _time(fn, steps: int, blocks: int, warmup: int, block_ms: float) -> list[float]:
    for _ in range(warmup):
        fn()
    if steps <= 0:
        t0 = time.perf_counter()
        fn()
        one = (time.perf_counter() - t0) * 1e3
        steps = int(min(200, max(1, round(block_ms / max(one, 1e-3)))))
    out = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(steps):
            r = fn()
        _ = np.asarray(r)  # read back: nothing stays queued outside the timed region
        out.append((time.perf_counter() - t0) * 1e3 / steps)
    return out


def main(path: str) -> int:
    import tensorflow as tf
    import tensorflow_recommenders_addons as tfra
    import tensorflow_recommenders_addons.dynamic_embedding as de

    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("TFRA_THREADS", "1")))
    tf.config.threading.set_inter_op_parallelism_threads(int(os.environ.get("TFRA_THREADS", "1")))
    with open(path) as f:
        job = json.load(f)
    base = os.path.dirname(path)
    keys = tf.constant(np.load(os.path.join(base, job["keys"])), tf.int64)
    prefill = np.load(os.path.join(base, job["prefill"]))
    dim = int(job["dim"])
    rng = np.random.default_rng(job.get("upstream_seed", 7))
    upstream = tf.constant(rng.standard_normal([int(keys.shape[0]), dim]).astype(np.float32) * 1e-3)
    lr = float(job["learning_rate"])
    values = np.random.default_rng(5).uniform(-0.05, 0.05, [prefill.shape[0], dim]).astype(np.float32)
    results = {}

    def layer_for(name):
        layer = de.keras.layers.Embedding(
            dim,
            key_dtype=tf.int64,
            value_dtype=tf.float32,
            initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=1),
            init_capacity=int(prefill.shape[0]),
            name=name,
        )
        layer.params.upsert(tf.constant(prefill, tf.int64), tf.constant(values))
        return layer

    for opt_name in job["optimizers"]:
        try:
            layer = layer_for(f"t_{opt_name}")
            keras_opt = {
                "sgd": lambda: tf.keras.optimizers.SGD(lr),
                "adagrad": lambda: tf.keras.optimizers.Adagrad(
                    lr, initial_accumulator_value=float(job["adagrad_init"]), epsilon=1e-7
                ),
            }[opt_name]()
            opt = de.DynamicEmbeddingOptimizer(keras_opt)

            @tf.function
            def step(layer=layer, opt=opt):
                with tf.GradientTape() as tape:
                    emb = layer(keys)
                grads = tape.gradient(emb, layer.trainable_variables, output_gradients=upstream)
                opt.apply_gradients(zip(grads, layer.trainable_variables, strict=True))
                return emb

            blocks = _time(step, int(job["steps"]), int(job["blocks"]), int(job["warmup"]), float(job["block_ms"]))
            results[opt_name] = {"block_ms": blocks, "size": int(layer.params.size().numpy())}
        except Exception as e:  # reported, never hidden
            results[opt_name] = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"}
    try:
        layer = layer_for("t_lookup")

        @tf.function
        def lookup(layer=layer):
            return layer.params.lookup(keys)

        results["lookup"] = {
            "block_ms": _time(lookup, int(job["steps"]), int(job["blocks"]), int(job["warmup"]), float(job["block_ms"]))
        }
    except Exception as e:
        results["lookup"] = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"}
    print(json.dumps({"peer": "tfra", "tensorflow": tf.__version__, "tfra": tfra.__version__, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
