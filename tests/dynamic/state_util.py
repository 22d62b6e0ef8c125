"""Helpers of the tests/dynamic/test_state_*.py files: tables, content made in numpy, a training lookup."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops.dynamic import config as config_lib
from tf_embed_ops.dynamic import ops as _ops
from tf_embed_ops.dynamic.sharded_table import ShardedDynamicTable
from tf_embed_ops.dynamic.table import EXPORT_TENSORS, DynamicTable
from tf_embed_ops.embedding_ops import normalize_feature
from tf_embed_ops.keras import TPUEmbedding

__all__ = [
    "EXPORT_TENSORS",
    "SERVING_SIGNATURE",
    "DynamicTable",
    "ShardedDynamicTable",
    "config",
    "content",
    "random_content",
    "serving_data",
    "serving_model",
    "train_lookup",
    "trained_serving_model",
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


def random_sharded_table(cfg, rng, n, directory) -> tuple[ShardedDynamicTable, dict[str, np.ndarray]]:
    """A 2-shard table holding `random_content` of n rows (restored from one table's checkpoint in `directory`), and
    that content."""
    whole = DynamicTable(cfg)
    c = random_content(rng, n, cfg.dim, whole.num_slots)
    whole.import_(**c)
    sharded = ShardedDynamicTable(cfg, 2)
    path = tf.train.Checkpoint(t=whole).write(str(directory / "ckpt"))
    tf.train.Checkpoint(t=sharded).read(path).assert_consumed()
    return sharded, c


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


def serving_model():
    """A Keras model over two dynamic tables (int64 and string keys) and a static one, for serving tests."""
    emb_api = tf.tpu.experimental.embedding
    users = config(name="users", dim=4, optimizer=None, initial_capacity=4)
    words = config(name="words", dim=3, optimizer=None, key_dtype=tf.string, initial_capacity=4)
    static = emb_api.TableConfig(10, 2, name="static", combiner="sum")
    features = {
        "user": emb_api.FeatureConfig(table=users, name="user"),
        "words": emb_api.FeatureConfig(table=words, name="words"),
        "slot": emb_api.FeatureConfig(table=static, name="slot"),
    }
    layer = TPUEmbedding(features, emb_api.SGD(0.1), name="embedding")
    inputs = {
        "user": keras.Input(shape=(), dtype="int64", name="user"),
        "words": keras.Input(shape=(None,), dtype="string", ragged=True, name="words"),
        "slot": keras.Input(shape=(), dtype="int64", name="slot"),
    }
    acts = layer(inputs)
    x = keras.layers.Concatenate()([acts["user"], acts["words"], acts["slot"]])
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(x))


def serving_data(n, seed):
    """(features, labels) of `n` samples for `serving_model`."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(12)]
    x = {
        "user": tf.constant(rng.integers(-(2**40), 2**40, n), tf.int64),
        "words": tf.ragged.constant([list(rng.choice(vocab, int(rng.integers(1, 4)))) for _ in range(n)]),
        "slot": tf.constant(rng.integers(0, 10, n), tf.int64),
    }
    return x, tf.constant(rng.normal(size=(n, 1)), tf.float32)


SERVING_SIGNATURE = {
    "user": tf.TensorSpec([None], tf.int64),
    "words": tf.RaggedTensorSpec([None, None], tf.string, ragged_rank=1, row_splits_dtype=tf.int64),
    "slot": tf.TensorSpec([None], tf.int64),
}


def trained_serving_model():
    """`serving_model` after two epochs of SGD."""
    model = serving_model()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    x, y = serving_data(32, 0)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=2, verbose=0)
    return model
