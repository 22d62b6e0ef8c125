"""te.TPUEmbeddingV2's SparseCore limits take what `compute_sparse_core_stats` returns (int32 scalar tensors, as
TensorFlow's helper returns and TensorFlow's class accepts) and numpy integers; bad limits are refused naming the
field, the stacked table and the value, before anything is built."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te

emb_api = tf.tpu.experimental.embedding


def _fc():
    table = emb_api.TableConfig(64, 2, name="t", optimizer=emb_api.SGD(1.0))
    return {"f": emb_api.FeatureConfig(table=table, output_shape=[8])}


def _features(seed=0):
    rng = np.random.default_rng(seed)
    return {"f": tf.ragged.constant([list(rng.integers(0, 64, size=5)) for _ in range(8)], dtype=tf.int64)}


def test_the_stats_tensors_size_the_limits_directly():
    features = _features()
    max_ids, max_unique = te.TPUEmbeddingV2.compute_sparse_core_stats(features, _fc(), num_tpu_chips=1)
    assert max_ids["t"].dtype == tf.int32 and max_ids["t"].shape == ()
    sized = emb_api.SparseCoreEmbeddingConfig(max_ids_per_table=max_ids, max_unique_ids_per_table=max_unique)
    acts, _ = te.TPUEmbeddingV2(_fc(), sparse_core_embedding_config=sized)(features)  # fits exactly
    assert acts["f"].shape == (8, 2)
    tight = emb_api.SparseCoreEmbeddingConfig(max_ids_per_table={"t": max_ids["t"] - 1})
    with pytest.raises(tf.errors.InvalidArgumentError, match="max ids per sparse core"):
        te.TPUEmbeddingV2(_fc(), sparse_core_embedding_config=tight)(features)


@pytest.mark.parametrize(
    "value", [np.int32(300), np.int64(300), tf.constant(300), tf.constant(300, tf.int64), tf.Variable(300)]
)
def test_numpy_ints_and_integer_tensors_are_accepted_for_every_limit(value):
    config = emb_api.SparseCoreEmbeddingConfig(
        max_ids_per_table={"t": value}, max_unique_ids_per_table={"t": value}, max_ids_per_chip_per_sample=value
    )
    emb = te.TPUEmbeddingV2(_fc(), sparse_core_embedding_config=config)
    assert emb._max_ids == {"t": 300} and emb._max_unique_ids == {"t": 300}
    assert type(emb._max_ids["t"]) is int
    emb(_features())


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_ids_per_table", 0),
        ("max_ids_per_table", -3),
        ("max_ids_per_table", tf.constant(0)),
        ("max_ids_per_table", tf.constant(2.0)),
        ("max_ids_per_table", tf.constant([4, 4])),
        ("max_ids_per_table", np.float32(4)),
        ("max_ids_per_table", True),
        ("max_ids_per_table", 2**31),
        ("max_unique_ids_per_table", "8"),
        ("max_unique_ids_per_table", np.int64(2**40)),
        ("max_ids_per_chip_per_sample", tf.constant(-1)),
    ],
)
def test_bad_limits_are_refused_naming_the_field_the_table_and_the_value(field, value):
    kwargs = {field: value} if field == "max_ids_per_chip_per_sample" else {field: {"t": value}}
    config = emb_api.SparseCoreEmbeddingConfig(**kwargs)
    where = field if field == "max_ids_per_chip_per_sample" else rf"{field}\['t'\]"
    with pytest.raises(
        ValueError, match=rf"SparseCoreEmbeddingConfig\.{where} must be an integer in \[1, 2147483647\]"
    ):
        te.TPUEmbeddingV2(_fc(), sparse_core_embedding_config=config)
