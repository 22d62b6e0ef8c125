"""Helpers of the dynamic-table op tests: configs built from the optimizer catalogue's schema, tables with unique
names, features of every input kind (int64 or string keys), content snapshots for "nothing changed" checks."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2 as opb
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as cpb

from tf_embed_ops import embedding_ops
from tf_embed_ops._optimizer_schema import OptimizerSchema, schemas
from tf_embed_ops.dynamic import ops as dyn

_names = itertools.count()

# Options applied on top of an optimizer (one variant each), as fields of OptimizationParameters.
OPTION_VARIANTS = {
    "clipping": {"gradient_clip": (-0.2, 0.25), "weight_clip": (-0.9, 0.8)},
    "weight_decay": {"weight_decay": 0.03},
    "weight_decay_by_lr": {"weight_decay": 0.2, "weight_decay_by_lr": True},
    "dynamic_lr": {"dynamic_lr": True},
}


def optimizer_cases():
    """(id, schema, hyper-parameter overrides, options) for every optimizer of the catalogue: its defaults, each
    bool hyper-parameter flipped, and each option variant."""
    cases = []
    for s in schemas():
        cases.append((f"{s.kind}-default", s, {}, {}))
        for h in s.hyper_parameters:
            if h.type == "bool":
                cases.append(
                    (f"{s.kind}-{h.python_name}={not h.python_default}", s, {h.python_name: not h.python_default}, {})
                )
        for name, options in OPTION_VARIANTS.items():
            cases.append((f"{s.kind}-{name}", s, {}, options))
    return cases


def schema(kind: str) -> OptimizerSchema:
    return next(s for s in schemas() if s.kind == kind)


def uses_dynamic_lr(s: OptimizerSchema, options: dict) -> bool:
    return s.needs_dynamic_learning_rate or bool(options.get("dynamic_lr"))


def make_config(tables, features) -> cpb.TPUEmbeddingConfiguration:
    """tables: dicts with name, vocab, dim, schema, and optional overrides, options, lr (float); a table whose
    optimizer needs it, or with options["dynamic_lr"], takes dynamic tag 0.  features: (name, table_id)."""
    config = cpb.TPUEmbeddingConfiguration()
    config.mode = cpb.TPUEmbeddingConfiguration.TRAINING
    for t in tables:
        td = config.table_descriptor.add()
        td.name, td.vocabulary_size, td.dimension = t["name"], t["vocab"], t["dim"]
        p = td.optimization_parameters
        s, options = t["schema"], t.get("options", {})
        if uses_dynamic_lr(s, options):
            p.learning_rate.dynamic.tag = 0
        else:
            p.learning_rate.constant = t.get("lr", 0.1)
        values = {h.python_name: h.python_default for h in s.hyper_parameters}
        values.update(t.get("overrides", {}))
        s.fill(p, values)
        p.gradient_accumulation_status = opb.GradientAccumulationStatus.ENABLED
        if "gradient_clip" in options:
            p.gradient_clipping_limits.lower.value, p.gradient_clipping_limits.upper.value = options["gradient_clip"]
        if "weight_clip" in options:
            p.clipping_limits.lower.value, p.clipping_limits.upper.value = options["weight_clip"]
        if "weight_decay" in options:
            p.weight_decay_factor = options["weight_decay"]
            p.multiply_weight_decay_factor_by_learning_rate = bool(options.get("weight_decay_by_lr"))
    for name, table_id in features:
        fd = config.feature_descriptor.add()
        fd.name, fd.table_id = name, table_id
    return config


def slot_defaults(s: OptimizerSchema) -> list[float]:
    return [slot.default_initial_value for slot in s.slots]


def slot_widths(s: OptimizerSchema, dim: int) -> list[int]:
    """Floats per row of each slot (the schema's shapes: dim, or 1 for a per-row slot)."""
    return [slot.shape(1, dim)[1] for slot in s.slots]


def new_table(dim, slot_initial_values=(), *, name=None, max_rows=1000, initial_capacity=16, **kwargs) -> tf.Tensor:
    """A fresh dynamic table (a unique shared_name, so eager kernels never share one by accident)."""
    n = next(_names)
    name = name or f"t{n}"
    return dyn.dynamic_table_handle(
        table_name=name,
        dim=dim,
        initial_capacity=initial_capacity,
        max_rows=max_rows,
        slot_initial_values=list(slot_initial_values),
        shared_name=f"{name}_{n}",
        **kwargs,
    )


def import_rows(handle, keys, weights, slots, step=0):
    """Imports rows for `keys` (in the given order: the rows are allocated in that order) with counts 1.

    slots: one [n, width] array per slot (a 1-D array of n values is a per-row slot)."""
    keys = np.asarray(keys, np.int64)
    n = len(keys)
    slots = [np.asarray(s, np.float32).reshape(n, -1) for s in slots]
    empty = np.zeros([0], np.int64)
    dyn.dynamic_table_import(
        handle,
        (keys, weights, slots, np.ones(n, np.int64), np.full(n, step, np.int64), empty, empty, empty),
    )


def snapshot(handle, num_slots=0) -> list[np.ndarray]:
    """The exported content plus the counters, as numpy arrays (for before/after equality)."""
    c = dyn.dynamic_table_export(handle, num_slots)
    contents = [t.numpy() for t in (*c[:2], *c.slots, *c[3:])]
    stats = [int(s) for s in dyn.dynamic_table_stats(handle)]
    return [*contents, np.array(stats)]


def assert_unchanged(before, handle, num_slots=0):
    after = snapshot(handle, num_slots)
    assert len(before) == len(after)
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


def string_feature(rows, weights=None) -> embedding_ops.FeatureInput:
    """A ragged feature of string keys (normalize_feature takes integer ids only)."""
    splits = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
    keys = tf.constant([k for r in rows for k in r] or np.zeros([0], str), tf.string)
    w = tf.zeros([0], tf.float32) if weights is None else tf.constant([v for r in weights for v in r], tf.float32)
    return embedding_ops.FeatureInput(tf.constant(splits), keys, w, tf.constant([len(rows)], tf.int64))


def int_feature(kind: str, rows, weights=None) -> embedding_ops.FeatureInput:
    """rows (ragged lists of ids) as a dense / ragged / ragged_sequence / sparse feature (dense: one id per row, no
    weights)."""
    if kind == "dense":
        return embedding_ops.normalize_feature(tf.constant([r[0] for r in rows], tf.int64))
    lengths = tf.constant([len(r) for r in rows], tf.int64)
    values = tf.constant([i for r in rows for i in r], tf.int64)
    x = tf.RaggedTensor.from_row_lengths(values, lengths)
    w = None
    if weights is not None:
        w = tf.RaggedTensor.from_row_lengths(tf.constant([v for r in weights for v in r], tf.float32), lengths)
    if kind == "ragged":
        return embedding_ops.normalize_feature(x, w)
    if kind == "ragged_sequence":  # sample shape [batch, 2]: the first two ids of each row, the rest dropped
        return embedding_ops.normalize_feature(x, w, max_sequence_length=2)
    if kind == "sparse":
        return embedding_ops.normalize_feature(x.to_sparse(), None if w is None else w.to_sparse())
    raise ValueError(kind)


# The start of a `digest_in_subprocess` script: its thread count set, this module and the dynamic ops imported, and
# `rng`, `n` ids a batch, `dim` and the `out` list of bytes it hashes.
DIGEST_SCRIPT_START = r"""
import hashlib, sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
sys.path.insert(0, sys.argv[2])
from dynamic_ops_test_util import int_feature, make_config, new_table, schema, slot_defaults
from tf_embed_ops.dynamic import ops as dyn

rng = np.random.default_rng(11)
n, dim = 30000, 32  # large enough that every loop splits over 2 threads
out = []
"""


def digest_in_subprocess(script: str, threads: int) -> str:
    """The last stdout line of `script` run in a fresh interpreter as `script threads this_directory` (a process
    fixes its intra-op pool size once, so 1- and 2-thread runs need their own processes)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", script, str(threads), here], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]
