"""Test helpers for the fused embedding ops: TPUEmbeddingConfiguration protos built directly from plain dicts,
and features of every input kind built from ragged Python rows together with their numpy-reference entries."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import numpy_reference as ref
import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2 as opb
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as cpb

INPUT_KINDS = ["dense", "dense_2d", "ragged", "sparse", "sparse_rank3", "ragged_sequence", "sparse_sequence"]


def make_config(tables, features):
    """tables: dicts with name, vocab, dim, opt (reference dict), lr (float or ("dynamic", tag)), optional
    quantization (lo, hi, n) and accumulation (bool).  features: (name, table_id, input_shape)."""
    config = cpb.TPUEmbeddingConfiguration()
    config.mode = cpb.TPUEmbeddingConfiguration.TRAINING
    for t in tables:
        td = config.table_descriptor.add()
        td.name, td.vocabulary_size, td.dimension = t["name"], t["vocab"], t["dim"]
        p = td.optimization_parameters
        lr = t.get("lr", 0.1)
        if isinstance(lr, tuple):
            p.learning_rate.dynamic.tag = lr[1]
        else:
            p.learning_rate.constant = lr
        _set_optimizer(p, t.get("opt", {"name": "sgd"}))
        if "quantization" in t:
            lo, hi, n = t["quantization"]
            q = p.simulated_quantization
            q.enabled, q.num_buckets = True, n
            q.clipping_limits.lower.value, q.clipping_limits.upper.value = lo, hi
        p.gradient_accumulation_status = (
            opb.GradientAccumulationStatus.ENABLED
            if t.get("accumulation", True)
            else opb.GradientAccumulationStatus.DISABLED
        )
    for name, table_id, shape in features:
        fd = config.feature_descriptor.add()
        fd.name, fd.table_id = name, table_id
        fd.input_shape.extend(shape)
    return config


def _set_optimizer(p, opt):
    name = opt["name"]
    if name == "sgd":
        p.stochastic_gradient_descent.SetInParent()
    elif name == "adagrad":
        p.adagrad.SetInParent()
    elif name == "adagrad_momentum":
        m = p.adagrad_momentum
        m.momentum, m.use_nesterov = opt.get("momentum", 0.0), opt.get("use_nesterov", False)
        m.exponent, m.beta2, m.epsilon = opt.get("exponent", 2.0), opt.get("beta2", 1.0), opt.get("epsilon", 1e-10)
    elif name == "adam":
        m = p.adam
        m.beta1, m.beta2, m.epsilon = opt.get("beta1", 0.9), opt.get("beta2", 0.999), opt.get("epsilon", 1e-7)
        m.use_non_lazy_adam = opt.get("use_non_lazy_adam", False)
        m.use_sum_inside_sqrt = opt.get("use_sum_inside_sqrt", True)
    elif name == "ftrl":
        m = p.ftrl
        m.l1, m.l2, m.beta = opt.get("l1", 0.0), opt.get("l2", 0.0), opt.get("beta", 0.0)
        m.lr_power = opt.get("lr_power", -0.5)
        m.multiply_linear_by_lr = opt.get("multiply_linear_by_lr", False)
    else:
        raise ValueError(name)
    if "gradient_clip" in opt:
        p.gradient_clipping_limits.lower.value, p.gradient_clipping_limits.upper.value = opt["gradient_clip"]
    if "weight_clip" in opt:
        p.clipping_limits.lower.value, p.clipping_limits.upper.value = opt["weight_clip"]
    if opt.get("weight_decay"):
        p.weight_decay_factor = opt["weight_decay"]
        p.multiply_weight_decay_factor_by_learning_rate = opt.get("multiply_weight_decay_by_lr", False)


def initial_slots(opt, vocab, dim, rng):
    """Random but valid slot values (accumulators/velocities positive)."""
    out = []
    for slot in ref.SLOTS[opt["name"]]:
        if slot in ("accumulators", "velocities"):
            out.append(rng.uniform(0.1, 1.0, (vocab, dim)).astype(np.float32))
        else:
            out.append(rng.normal(0, 0.1, (vocab, dim)).astype(np.float32))
    return out


def make_feature(kind, rows, weights=None, max_sequence_length=2, rank3_inner=2):
    """Returns (tf input, tf weights or None, reference entries, sample_shape, normalize kwargs).

    rows: ragged list of id lists.  Dense kinds need exactly one id per row and take no weights.
    """
    batch = len(rows)
    if kind in ("dense", "dense_2d"):
        assert all(len(r) == 1 for r in rows) and weights is None
        ids = np.array([r[0] for r in rows], np.int64)
        x = tf.constant(ids if kind == "dense" else ids[:, None])
        entries, shape = ref.entries_from_rows(rows)
        return x, None, entries, shape, {}
    if kind in ("ragged", "ragged_sequence"):
        x = tf.RaggedTensor.from_row_lengths(
            tf.constant([i for r in rows for i in r], tf.int64), tf.constant([len(r) for r in rows], tf.int64)
        )
        w = None
        if weights is not None:
            w = tf.RaggedTensor.from_row_lengths(
                tf.constant([v for r in weights for v in r], tf.float32), tf.constant([len(r) for r in rows], tf.int64)
            )
        seq = max_sequence_length if kind == "ragged_sequence" else 0
        entries, shape = ref.entries_from_rows(rows, weights, seq)
        return x, w, entries, shape, {"max_sequence_length": seq}
    if kind in ("sparse", "sparse_sequence"):
        indices = [(b, k) for b, r in enumerate(rows) for k in range(len(r))]
        width = max([len(r) for r in rows] + [1])
        x = tf.SparseTensor(np.array(indices, np.int64).reshape(-1, 2), [i for r in rows for i in r], [batch, width])
        x = tf.SparseTensor(x.indices, tf.cast(x.values, tf.int64), x.dense_shape)
        w = None
        if weights is not None:
            w = tf.SparseTensor(x.indices, tf.constant([v for r in weights for v in r], tf.float32), x.dense_shape)
        seq = max_sequence_length if kind == "sparse_sequence" else 0
        entries, shape = ref.entries_from_rows(rows, weights, seq)
        return x, w, entries, shape, {"max_sequence_length": seq}
    if kind == "sparse_rank3":
        assert batch % rank3_inner == 0
        outer = batch // rank3_inner
        width = max([len(r) for r in rows] + [1])
        indices = [(b // rank3_inner, b % rank3_inner, k) for b, r in enumerate(rows) for k in range(len(r))]
        values = tf.constant([i for r in rows for i in r], tf.int64)
        x = tf.SparseTensor(np.array(indices, np.int64).reshape(-1, 3), values, [outer, rank3_inner, width])
        w = None
        if weights is not None:
            w = tf.SparseTensor(x.indices, tf.constant([v for r in weights for v in r], tf.float32), x.dense_shape)
        flat_entries, _ = ref.entries_from_rows(rows, weights)
        entries = [((p[0] // rank3_inner, p[0] % rank3_inner), i, wt) for p, i, wt in flat_entries]
        return x, w, entries, (outer, rank3_inner), {}
    raise ValueError(kind)


def script_digest(script: str, threads: int, isa: str | None = None) -> str:
    """The last line `script` prints (a digest of what it computed), run by a fresh interpreter as
    `python -c script <threads> <tests dir>` with TF_EMBED_OPS_ISA unset, or set to `isa`."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_EMBED_OPS_ISA", None)
    if isa is not None:
        env["TF_EMBED_OPS_ISA"] = isa
    here = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run(
        [sys.executable, "-c", script, str(threads), here], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def embedding_state(emb) -> dict[str, np.ndarray]:
    """Copies of every table and slot of a built `TPUEmbedding`, by "table/slot"."""
    return {f"{t}/{s}": v.numpy().copy() for t, slots in emb.variables.items() for s, v in slots.items()}


def assert_embedding_unchanged(emb, before: dict[str, np.ndarray]) -> None:
    """Every table and slot of `emb` is bitwise what `embedding_state` copied into `before`."""
    after = embedding_state(emb)
    assert after.keys() == before.keys()
    for k in before:
        np.testing.assert_array_equal(after[k].view(np.uint32), before[k].view(np.uint32), err_msg=k)
