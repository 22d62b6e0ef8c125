"""Steps/s of `tf_embed_ops.distribute.fit` on in-process localhost clusters (2 parameter servers, 1 or 2
workers), and of Keras' own `model.fit` on one machine for the same model and batches.

Model: a `ShardedEmbeddingLayer` (one 100,000 x 16 table, Adagrad; 1,024 zipf(1.05) ids per step, one per sample)
feeding Dense(16, relu) and Dense(1), binary cross-entropy, Keras Adam.  Epoch 1 (tracing, connection set-up) is
not timed; the steps of epochs 2..N are, with a callback on the chief (wall time between epoch begin and end,
which includes the epoch's final join).

Every configuration runs in its own Python process (in-process servers cannot be shut down).  All tasks share
this machine's cores: the numbers show the overheads of scheduling steps over gRPC, not a multi-host speed-up.

Usage: python benchmarks/distributed_fit.py [--workers 0 1 2] [--steps 50] [--epochs 4]
(`0` = Keras `model.fit` without a cluster).  Prints a markdown table; writes
benchmarks/results/distributed_fit.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB, DIM, BATCH, ZIPF_S = 100_000, 16, 1024, 1.05


def _data(steps: int) -> tuple:
    rng = np.random.default_rng(0)
    ranks = np.arange(1, VOCAB + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-ZIPF_S)
    cdf /= cdf[-1]
    ids = np.searchsorted(cdf, rng.random(steps * BATCH)).astype(np.int64)
    labels = (rng.random(steps * BATCH) < 0.3).astype(np.float32)[:, None]
    return ids, labels


def run_one(workers: int, steps: int, epochs: int) -> dict:
    """Child process: trains `epochs` epochs of `steps` steps; returns steps/s over epochs 2..N."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    sys.path.insert(0, ROOT)
    from tf_embed_ops import distribute as ted

    emb_api = tf.tpu.experimental.embedding
    ids, labels = _data(steps)

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.start)

    def build():
        table = emb_api.TableConfig(VOCAB, DIM, name="items")
        layer = ted.ShardedEmbeddingLayer(
            {"items": emb_api.FeatureConfig(table)}, emb_api.Adagrad(0.05), num_shards=None if workers else 2
        )
        inp = keras.Input(shape=(), dtype="int64", name="items")
        hidden = keras.layers.Dense(16, activation="relu")(layer({"items": inp})["items"])
        model = keras.Model({"items": inp}, keras.layers.Dense(1)(hidden))
        model.compile(keras.optimizers.Adam(1e-3), keras.losses.BinaryCrossentropy(from_logits=True))
        return model

    timer = Timer()
    if workers == 0:
        model = build()
        model.fit({"items": ids}, labels, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=[timer])
    else:
        strategy = ted.create_local_cluster(num_workers=workers, num_ps=2)
        with strategy.scope():
            model = build()

        def dataset_fn(input_context):
            return tf.data.Dataset.from_tensor_slices(({"items": ids}, labels)).batch(BATCH).repeat()

        ted.fit(model, dataset_fn, epochs=epochs, steps_per_epoch=steps, callbacks=[timer], verbose=0)
    timed = timer.seconds[1:]
    return {"workers": workers, "steps_per_s": steps * len(timed) / sum(timed), "epoch_seconds": timer.seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.workers[0], args.steps, args.epochs)))
        return
    rows = []
    for workers in args.workers:
        proc = subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                "--workers",
                str(workers),
                "--steps",
                str(args.steps),
                "--epochs",
                str(args.epochs),
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=True,
        )
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    result = {
        "when_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "steps": args.steps,
        "epochs": args.epochs,
        "rows": rows,
    }
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "benchmarks", "results", "distributed_fit.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| workers | parameter servers | steps/s | samples/s |\n|---:|---:|---:|---:|")
    for row in rows:
        name = "Keras `model.fit`, no cluster" if row["workers"] == 0 else str(row["workers"])
        ps = "–" if row["workers"] == 0 else "2"
        print(f"| {name} | {ps} | {row['steps_per_s']:.1f} | {row['steps_per_s'] * BATCH / 1e3:.1f} k |")


if __name__ == "__main__":
    main()
