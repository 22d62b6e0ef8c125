"""Helpers of the tests/dynamic/test_state_*.py files: tables, content made in numpy, a training lookup."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops.dynamic import config as config_lib
from tf_embed_ops.dynamic import ops as _ops
from tf_embed_ops.dynamic.table import EXPORT_TENSORS, DynamicTable, ShardedDynamicTable
from tf_embed_ops.embedding_ops import normalize_feature

__all__ = [
    "EXPORT_TENSORS",
    "DynamicTable",
    "ShardedDynamicTable",
    "config",
    "content",
    "random_content",
    "train_lookup",
]


def config(name="t", dim=4, optimizer="adagrad", **kwargs) -> config_lib.DynamicTableConfig:
    opt = {
        "sgd": te.optimizers.SGD(learning_rate=0.1),
        "adagrad": te.optimizers.Adagrad(learning_rate=0.1, initial_accumulator_value=0.25),
        "adam": te.optimizers.Adam(learning_rate=0.1),
        "rowwise": te.optimizers.RowWiseAdagrad(learning_rate=0.1),
        None: None,
    }[optimizer]
    kwargs.setdefault("max_rows", 1000)
    kwargs.setdefault("initial_capacity", 8)
    kwargs.setdefault("initializer", tf.keras.initializers.RandomUniform(-1.0, 1.0))
    kwargs.setdefault("seed", 3)
    return config_lib.DynamicTableConfig(name, dim, optimizer=opt, combiner="sum", **kwargs)


def content(table) -> dict[str, np.ndarray]:
    """The table's export as numpy arrays."""
    return {k: v.numpy() for k, v in table.export().items()}


def random_content(rng, n, dim, num_slots, pending=0, key_range=2**62, slot_columns=None) -> dict[str, np.ndarray]:
    """A valid sorted content of n rows and `pending` admission counters (disjoint keys).

    The slots are side by side, `slot_columns` columns (default `num_slots * dim`: slots one value per column)."""
    slot_columns = num_slots * dim if slot_columns is None else slot_columns
    keys = np.unique(rng.integers(-key_range, key_range, n + pending + 8, dtype=np.int64))
    rng.shuffle(keys)
    rows, pend = np.sort(keys[:n]), np.sort(keys[n : n + pending])
    return {
        "keys": rows,
        "weights": rng.standard_normal([n, dim]).astype(np.float32),
        "slots": rng.uniform(0.1, 2.0, [n, slot_columns]).astype(np.float32),
        "counts": rng.integers(1, 50, n).astype(np.int64),
        "last_steps": rng.integers(0, 20, n).astype(np.int64),
        "pending_keys": pend,
        "pending_counts": rng.integers(1, 2, pending).astype(np.int64),
        "pending_last_steps": rng.integers(0, 20, pending).astype(np.int64),
    }


def train_lookup(table, keys, step=None):
    """The training lookup (inserts admitted new keys) of one feature over `table`; returns the activations."""
    feature = tf.tpu.experimental.embedding.FeatureConfig(table=table.config, name="f")
    proto = config_lib.dynamic_config_proto([feature])
    ids = tf.constant(keys)
    feats = [normalize_feature(ids) if ids.dtype != tf.string else _string_feature(ids)]
    step = table.step.read_value() if step is None else tf.constant(step, tf.int64)
    return _ops.dynamic_embedding_activations(feats, [table.handle], step, proto, ["sum"], training=True)[0]


def _string_feature(ids):
    positions = normalize_feature(tf.range(tf.size(ids, out_type=tf.int64)))
    return positions._replace(ids=ids)
