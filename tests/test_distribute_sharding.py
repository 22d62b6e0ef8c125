"""DIV sharding arithmetic, per-server configurations and the worker-side id partition, against plain references.

No cluster: these are the pieces `ShardedTPUEmbedding` is built from.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2

from tf_embed_ops import embedding_ops
from tf_embed_ops.distribute import div_shard_boundaries, div_shard_sizes, num_table_shards
from tf_embed_ops.distribute.partition import partition_feature, row_gradients
from tf_embed_ops.distribute.server_plan import plan_servers


def _reference_owner(vocab: int, shards: int, row: int) -> int:
    """Owner of `row` from docs/semantics.md's wording: shard h holds floor(V/H) + (h < V % H) contiguous rows."""
    start = 0
    for h in range(shards):
        size = vocab // shards + (1 if h < vocab % shards else 0)
        if row < start + size:
            return h
        start += size
    raise AssertionError("row beyond the table")


@pytest.mark.parametrize("vocab,shards", [(1, 1), (10, 1), (10, 3), (10, 4), (7, 7), (1000, 3), (5, 2), (12, 4)])
def test_div_shards_match_spec_layout(vocab, shards):
    sizes = div_shard_sizes(vocab, shards)
    bounds = div_shard_boundaries(vocab, shards)
    assert sum(sizes) == vocab and len(sizes) == shards and min(sizes) >= 1
    assert bounds[0] == 0 and bounds[-1] == vocab
    for row in range(vocab):
        owner = _reference_owner(vocab, shards, row)
        assert bounds[owner] <= row < bounds[owner + 1]
    # The first V mod N shards are exactly one row larger than the rest.
    big = vocab % shards
    assert sizes[:big] == [vocab // shards + 1] * big and sizes[big:] == [vocab // shards] * (shards - big)


@pytest.mark.parametrize("vocab,servers,expected", [(10, 3, 3), (2, 4, 2), (1, 4, 1), (4, 4, 4)])
def test_num_table_shards_never_empty(vocab, servers, expected):
    assert num_table_shards(vocab, servers) == expected


@pytest.mark.parametrize(
    "vocab,shards,argument",
    [
        (0, 1, "vocabulary_size"),
        (3, 0, "num_shards"),
        (3, 4, "num_shards"),
        (True, 1, "vocabulary_size"),
        (3.0, 1, "vocabulary_size"),
        (3, True, "num_shards"),
    ],
)
def test_div_shard_sizes_rejects_bad_arguments(vocab, shards, argument):
    with pytest.raises(ValueError, match=argument):
        div_shard_sizes(vocab, shards)


def _config(tables, features):
    """tables: [(name, vocab, dim, dynamic_tag or None)], features: [table index]."""
    config = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration()
    for name, vocab, dim, tag in tables:
        t = config.table_descriptor.add(name=name, vocabulary_size=vocab, dimension=dim)
        t.optimization_parameters.adagrad.SetInParent()
        if tag is None:
            t.optimization_parameters.learning_rate.constant = 0.1
        else:
            t.optimization_parameters.learning_rate.dynamic.tag = tag
    for i, table_id in enumerate(features):
        config.feature_descriptor.add(name=f"f{i}", table_id=table_id, input_shape=[4])
    return config


def test_server_plans_restrict_tables_features_and_tags():
    # Table 0 (tag 1) over 3 servers, table 1 (constant) over 2, table 2 (tag 0) on 1 server only.
    config = _config([("a", 10, 4, 1), ("b", 2, 2, None), ("c", 1, 3, 0)], features=[0, 2, 1, 0])
    bounds = [div_shard_boundaries(10, 3), div_shard_boundaries(2, 2), div_shard_boundaries(1, 1)]
    plans = plan_servers(config, bounds)
    assert [p.task for p in plans] == [0, 1, 2]
    assert [p.tables for p in plans] == [[0, 1, 2], [0, 1], [0]]
    assert [p.features for p in plans] == [[0, 1, 2, 3], [0, 2, 3], [0, 3]]
    assert [p.row_offsets for p in plans] == [[0, 0, 0], [4, 1], [7]]
    # Local tags are dense and in local table order: server 0 sees a (global tag 1) then c (global tag 0).
    assert [p.tags for p in plans] == [[1, 0], [1], [1]]
    for plan in plans:
        sub = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration.FromString(plan.config)
        for local, t in enumerate(plan.tables):
            desc = sub.table_descriptor[local]
            assert desc.name == config.table_descriptor[t].name
            assert desc.vocabulary_size == bounds[t][plan.task + 1] - bounds[t][plan.task]
            assert desc.optimization_parameters.HasField("adagrad")
            lr = desc.optimization_parameters.learning_rate
            if config.table_descriptor[t].optimization_parameters.learning_rate.HasField("dynamic"):
                global_tag = config.table_descriptor[t].optimization_parameters.learning_rate.dynamic.tag
                assert plan.tags[lr.dynamic.tag] == global_tag
            else:
                assert lr.constant == pytest.approx(0.1)
        assert [plan.tables[f.table_id] for f in sub.feature_descriptor] == [
            config.feature_descriptor[f].table_id for f in plan.features
        ]


def test_server_plans_reject_boundaries_not_spanning_the_table():
    config = _config([("a", 10, 4, None)], features=[0])
    with pytest.raises(ValueError, match="table_boundaries\\[0\\].*10"):
        plan_servers(config, [[0, 4, 9]])
    with pytest.raises(ValueError, match="one entry per table"):
        plan_servers(config, [])


# ---------------------------------------------------------------------------------------------- partition


def _feature(kind: str, rows: list, weights: list | None, max_len: int = 0):
    """Builds the TF input of `kind` and its normalised form; also returns the reference entries."""
    if kind == "dense":
        x = tf.constant([r[0] for r in rows], tf.int64)
        return embedding_ops.normalize_feature(x)
    ragged = tf.ragged.constant(rows, dtype=tf.int64, ragged_rank=1)
    w = None if weights is None else tf.ragged.constant(weights, dtype=tf.float32, ragged_rank=1)
    if kind == "sparse":
        ragged, w = ragged.to_sparse(), (None if w is None else w.to_sparse())
    return embedding_ops.normalize_feature(ragged, weights=w, max_sequence_length=max_len)


def _reference_entries(rows, weights, combiner, max_len):
    """{(sample, id): factor w_i / norm_s} summed, from the combiner definition (0 for a zero norm)."""
    out = {}
    for b, row in enumerate(rows):
        ws = weights[b] if weights is not None else [1.0] * len(row)
        samples = [
            ((b, k) if max_len else (b,), i, w)
            for k, (i, w) in enumerate(zip(row, ws, strict=True))
            if not max_len or k < max_len
        ]
        groups = {}
        for s, i, w in samples:
            groups.setdefault(s, []).append((i, w))
        for s, members in groups.items():
            norm = {"sum": 1.0, "mean": sum(w for _, w in members), "sqrtn": math.sqrt(sum(w * w for _, w in members))}[
                combiner
            ]
            for i, w in members:
                out[(s, i)] = out.get((s, i), 0.0) + (0.0 if norm == 0 else w / norm)
    return out


ROWS = [[1, 1, 9], [0], [], [5, 6, 7, 3], [9]]
WEIGHTS = [[0.5, 1.5, 2.0], [3.0], [], [1.0, 0.25, 2.0, 1.0], [0.0]]


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize(
    "kind,max_len,weighted",
    [
        ("dense", 0, False),
        ("ragged", 0, False),
        ("ragged", 0, True),
        ("sparse", 0, True),
        ("sparse", 2, True),
        ("ragged", 3, False),
    ],
)
def test_partition_keeps_every_id_sample_and_combiner_factor(kind, max_len, weighted, combiner):
    rows = [[r[0]] for r in ROWS if r] if kind == "dense" else ROWS
    weights = WEIGHTS if weighted and kind != "dense" else None
    feature = _feature(kind, rows, weights, max_len)
    bounds = [0, 4, 7, 10]
    parts = partition_feature(feature, combiner, bounds)
    sample_shape = tuple(int(x) for x in feature.sample_shape.numpy())

    got = {}
    for shard, part in enumerate(parts):
        indices, ids, w = part.sample_indices_or_row_splits.numpy(), part.ids.numpy(), part.weights.numpy()
        assert indices.shape == (len(ids), len(sample_shape) + 1)
        assert np.all(part.sample_shape.numpy() == sample_shape)
        assert np.all((ids >= 0) & (ids < bounds[shard + 1] - bounds[shard])), f"shard {shard} local ids {ids}"
        for coords, local, factor in zip(indices, ids, w, strict=True):
            if kind == "dense":
                sample = tuple(int(c) for c in coords[:-1])
                key = ((sample[0],), int(local) + bounds[shard])
            else:
                key = (tuple(int(c) for c in coords[:-1]), int(local) + bounds[shard])
            got[key] = got.get(key, 0.0) + float(factor)
    if kind == "dense":
        expected = {((b,), r[0]): 1.0 for b, r in enumerate(rows)}
    else:
        expected = _reference_entries(rows, weights, combiner, max_len)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-6), key


@pytest.mark.parametrize("bad_id", [-1, 10, 1 << 40])
def test_partition_rejects_ids_outside_the_table(bad_id):
    feature = _feature("ragged", [[1, bad_id]], None)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[0, 10\)"):
        partition_feature(feature, "sum", [0, 5, 10])


@pytest.mark.parametrize("bounds", [[0], [1, 5], [0, 5, 5], [0, 6, 4]])
def test_partition_rejects_malformed_boundaries(bounds):
    with pytest.raises(ValueError, match="boundaries"):
        partition_feature(_feature("ragged", [[1]], None), "sum", bounds)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_row_gradients_match_the_combiner_backward(combiner):
    feature = _feature("ragged", ROWS, WEIGHTS)
    grad = np.arange(len(ROWS) * 2, dtype=np.float32).reshape(len(ROWS), 2) + 1.0
    ids, rows = row_gradients(feature, combiner, tf.constant(grad))
    factors = _reference_entries(ROWS, WEIGHTS, combiner, 0)
    expected = {}
    for ((b,), i), f in factors.items():
        expected[i] = expected.get(i, 0.0) + f * grad[b]
    got = {}
    for i, r in zip(ids.numpy(), rows.numpy(), strict=True):
        got[int(i)] = got.get(int(i), 0.0) + r
    assert sorted(got) == sorted(expected)
    for i in expected:
        np.testing.assert_allclose(got[i], expected[i], rtol=1e-6)
