"""Fused embedding training step vs the TensorFlow-native path, side by side in one process.

Workload (issue 3): one table of 1M x 64 float32, 16,384 zipf(s=1.05) ids per step, one id per sample.  A step
is forward + gradient + update.  "ours" runs EmbeddingActivations, the loss gradient and
SendTPUEmbeddingGradients ("sgd_midlevel": the same through embedding_lookup_and_update, the Keras layer's
path); the peers run tf.nn.embedding_lookup + GradientTape and then:
  * Adagrad: tf.unique / unsorted_segment_sum + tf.raw_ops.ResourceSparseApplyAdagradV2,
  * Adam (lazy): gather / scatter of the touched rows (unique + segment sum) with the TPU equations,
  * Keras 3 Adam on a tf.Variable (what a user gets from model.fit with a plain Embedding table).
Measurements alternate ours / peer per round so drift hits both; the median over rounds is reported.

Usage: python benchmarks/fused_step_benchmark.py [--steps 30] [--rounds 5] [--quick]
Writes benchmarks/results/fused_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2 as opb
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as cpb

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tf_embed_ops import embedding_ops as eo

VOCAB, DIM, BATCH, ZIPF_S = 1_000_000, 64, 16_384, 1.05
LR = 0.01


def zipf_ids(rng, n, vocab, s):
    """Bounded zipf(s) ids in [0, vocab) by inverse-CDF sampling (numpy's zipf needs s > 1 and is unbounded)."""
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-s)
    cdf /= cdf[-1]
    return np.searchsorted(cdf, rng.random(n)).astype(np.int64)


def make_config(optimizer: str) -> cpb.TPUEmbeddingConfiguration:
    config = cpb.TPUEmbeddingConfiguration()
    config.mode = cpb.TPUEmbeddingConfiguration.TRAINING
    td = config.table_descriptor.add()
    td.name, td.vocabulary_size, td.dimension = "table", VOCAB, DIM
    p = td.optimization_parameters
    p.learning_rate.constant = LR
    p.gradient_accumulation_status = opb.GradientAccumulationStatus.ENABLED
    if optimizer == "sgd":
        p.stochastic_gradient_descent.SetInParent()
    elif optimizer == "adagrad":
        p.adagrad.SetInParent()
    elif optimizer == "adagrad_momentum":
        p.adagrad_momentum.momentum = 0.9
        p.adagrad_momentum.exponent = 2.0
        p.adagrad_momentum.beta2 = 1.0
        p.adagrad_momentum.epsilon = 1e-10
    elif optimizer in ("adam_lazy", "adam_non_lazy"):
        p.adam.beta1, p.adam.beta2, p.adam.epsilon = 0.9, 0.999, 1e-7
        p.adam.use_sum_inside_sqrt = True
        p.adam.use_non_lazy_adam = optimizer == "adam_non_lazy"
    elif optimizer == "ftrl":
        p.ftrl.lr_power = -0.5
    fd = config.feature_descriptor.add()
    fd.name, fd.table_id = "ids", 0
    fd.input_shape.append(BATCH)
    return config


SLOT_INIT = {
    "sgd": [],
    "adagrad": [0.1],
    "adagrad_momentum": [0.0, 0.0],
    "adam_lazy": [0.0, 0.0],
    "adam_non_lazy": [0.0, 0.0],
    "ftrl": [0.1, 0.0],
}


def ours_step_fn(optimizer, table, target):
    config = make_config(optimizer)
    slots = [tf.Variable(tf.fill([VOCAB, DIM], v)) for v in SLOT_INIT[optimizer]]

    @tf.function(jit_compile=False)
    def step(ids):
        feature = eo.normalize_feature(ids)
        (act,) = eo.embedding_activations([feature], [table], config)
        with tf.GradientTape() as tape:
            tape.watch(act)
            loss = tf.reduce_sum(act * target)
        grad = tape.gradient(loss, act)
        eo.send_tpu_embedding_gradients([grad], [], [feature], [table], [slots], config)

    return step


def ours_midlevel_step_fn(optimizer, table, target):
    """The same step through embedding_lookup_and_update (the Keras layer's path: update hung on a trigger)."""
    config = make_config(optimizer)
    slots = [tf.Variable(tf.fill([VOCAB, DIM], v)) for v in SLOT_INIT[optimizer]]
    trigger = tf.Variable(0.0)

    @tf.function(jit_compile=False)
    def step(ids):
        feature = eo.normalize_feature(ids)
        with tf.GradientTape() as tape:
            (act,) = eo.embedding_lookup_and_update([feature], [table], [slots], config, trigger=trigger)
            loss = tf.reduce_sum(act * target)
        return tape.gradient(loss, trigger)

    return step


def native_gradient(table, target, ids) -> tf.IndexedSlices:
    """The peers' gradient of `sum(lookup * target)` with respect to the table (tf.nn.embedding_lookup + tape)."""
    with tf.GradientTape() as tape:
        act = tf.nn.embedding_lookup(table, ids)
        loss = tf.reduce_sum(act * target)
    return tape.gradient(loss, table)


def native_adagrad_step_fn(table, target):
    acc = tf.Variable(tf.fill([VOCAB, DIM], 0.1))

    @tf.function
    def step(ids):
        grad = native_gradient(table, target, ids)
        unique, idx = tf.unique(grad.indices)
        summed = tf.math.unsorted_segment_sum(grad.values, idx, tf.size(unique))
        tf.raw_ops.ResourceSparseApplyAdagradV2(
            var=table.handle, accum=acc.handle, lr=LR, epsilon=0.0, grad=summed, indices=unique, update_slots=True
        )

    return step


def native_lazy_adam_step_fn(table, target):
    m = tf.Variable(tf.zeros([VOCAB, DIM]))
    v = tf.Variable(tf.zeros([VOCAB, DIM]))

    @tf.function
    def step(ids):
        grad = native_gradient(table, target, ids)
        unique, idx = tf.unique(grad.indices)
        g = tf.math.unsorted_segment_sum(grad.values, idx, tf.size(unique))
        m_new = 0.9 * tf.gather(m, unique) + 0.1 * g
        v_new = 0.999 * tf.gather(v, unique) + 0.001 * g * g
        m.scatter_update(tf.IndexedSlices(m_new, unique))
        v.scatter_update(tf.IndexedSlices(v_new, unique))
        table.scatter_sub(tf.IndexedSlices(LR * m_new / tf.sqrt(v_new + 1e-14), unique))

    return step


def keras_adam_step_fn(table, target):
    import keras

    optimizer = keras.optimizers.Adam(LR)
    optimizer.build([table])

    @tf.function
    def step(ids):
        grad = native_gradient(table, target, ids)
        optimizer.apply_gradients([(grad, table)])

    return step


def time_steps(step, id_batches, steps):
    """(wall ms, process CPU ms) per step.  CPU time (all threads) is the steadier figure on a shared machine:
    it counts the work done, not the time spent waiting for a core."""
    step(id_batches[0])  # trace + warm up
    step(id_batches[1 % len(id_batches)])
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        step(id_batches[i % len(id_batches)])
    return (time.perf_counter() - wall) / steps * 1e3, (time.process_time() - cpu) / steps * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 10 steps, fewer Keras steps")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds = 10, 3

    rng = np.random.default_rng(0)
    id_batches = [tf.constant(zipf_ids(rng, BATCH, VOCAB, ZIPF_S)) for _ in range(8)]
    unique_per_step = statistics.mean(len(np.unique(b.numpy())) for b in id_batches)
    target = tf.constant(rng.normal(size=(BATCH, DIM)).astype(np.float32))
    init = rng.normal(0, 0.05, size=(VOCAB, DIM)).astype(np.float32)

    # (ours optimizer, peer name, peer factory); the peer of SGD/AdagradMomentum/FTRL/non-lazy Adam is the
    # closest native path (raw-op Adagrad or gather/scatter Adam), named in the output.
    pairs = [
        ("sgd", "native_adagrad_rawop", native_adagrad_step_fn),
        ("sgd_midlevel", "native_adagrad_rawop", native_adagrad_step_fn),
        ("adagrad", "native_adagrad_rawop", native_adagrad_step_fn),
        ("adagrad_momentum", "native_adagrad_rawop", native_adagrad_step_fn),
        ("adam_lazy", "native_lazy_adam_gather_scatter", native_lazy_adam_step_fn),
        ("adam_lazy", "keras3_adam", keras_adam_step_fn),
        ("adam_non_lazy", "keras3_adam", keras_adam_step_fn),
        ("ftrl", "native_adagrad_rawop", native_adagrad_step_fn),
    ]
    results = []
    for optimizer, peer_name, peer_factory in pairs:
        ours_table = tf.Variable(init)
        peer_table = tf.Variable(init)
        if optimizer.endswith("_midlevel"):
            ours = ours_midlevel_step_fn(optimizer.removesuffix("_midlevel"), ours_table, target)
        else:
            ours = ours_step_fn(optimizer, ours_table, target)
        peer = peer_factory(peer_table, target)
        peer_steps = max(3, args.steps // 10) if peer_name == "keras3_adam" else args.steps
        ours_steps = max(3, args.steps // 10) if optimizer == "adam_non_lazy" else args.steps
        ours_t, peer_t = [], []
        for _ in range(args.rounds):
            ours_t.append(time_steps(ours, id_batches, ours_steps))
            peer_t.append(time_steps(peer, id_batches, peer_steps))
        o, p = statistics.median(t[0] for t in ours_t), statistics.median(t[0] for t in peer_t)
        oc, pc = statistics.median(t[1] for t in ours_t), statistics.median(t[1] for t in peer_t)
        row = {
            "optimizer": optimizer,
            "peer": peer_name,
            "ours_ms_per_step": round(o, 3),
            "peer_ms_per_step": round(p, 3),
            "speedup": round(p / o, 2),
            "ours_cpu_ms_per_step": round(oc, 3),
            "peer_cpu_ms_per_step": round(pc, 3),
            "cpu_speedup": round(pc / oc, 2),
            "ours_unique_rows_per_s": round(unique_per_step / (o / 1e3)),
        }
        results.append(row)
        print(
            f"{optimizer:>17} vs {peer_name:<32} wall: ours {o:8.3f} peer {p:9.3f} ms/step x{p / o:6.1f} | "
            f"cpu: ours {oc:8.3f} peer {pc:9.3f} ms/step x{pc / oc:6.1f} | "
            f"{row['ours_unique_rows_per_s'] / 1e6:5.2f} M unique rows/s",
            flush=True,
        )
        del ours_table, peer_table

    out = {
        "workload": {
            "vocab": VOCAB,
            "dim": DIM,
            "ids_per_step": BATCH,
            "zipf_s": ZIPF_S,
            "mean_unique_rows_per_step": round(unique_per_step),
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "tensorflow": tf.__version__,
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        },
        "steps": args.steps,
        "rounds": args.rounds,
        "results": results,
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "fused_step.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
    print("wrote", path)


if __name__ == "__main__":
    main()
