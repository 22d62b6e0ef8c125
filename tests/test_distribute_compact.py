"""The compact parameter-server protocol of `ShardedTPUEmbedding` gives the numbers of the protocol it replaced.

Before, every server returned partial activations of the full output shape and received the full activation
gradients; now it receives its distinct ids, returns their rows, and receives one summed gradient row per id
(docs/distributed.md). The worker combines the rows and sums the gradient rows in the kernels' order, so:

* activations, tables and slots are bitwise equal to the previous protocol, run here from its public parts
  (`partition.partition_feature`, the servers' plans, the forward and fused ops with the full shapes);
* where the previous protocol was bitwise equal to one process (the sum combiner, a sample whose ids live on
  one shard, tables updated from the same gradients), the compact one is too.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops
from tests.sharded_support import assign_tables, table_values
from tf_embed_ops import embedding_ops
from tf_embed_ops.distribute import ShardedTPUEmbedding, partition
from tf_embed_ops.distribute.sharded_embedding import rounding_for_plan

emb_api = tf.tpu.experimental.embedding
OPTIMIZERS = {
    "sgd": lambda: emb_api.SGD(0.1),
    "adagrad": lambda: emb_api.Adagrad(0.1, initial_accumulator_value=0.2),
    "adam_non_lazy": lambda: emb_api.Adam(0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-3, lazy_adam=False),
    "rowwise_adagrad": lambda: tf_embed_ops.optimizers.RowWiseAdagrad(0.1, weight_decay=0.05),
}


def _feature_config(optimizer_name: str, combiner: str) -> dict:
    """`video` (11 rows, three shards) read by a bag and a sequence feature, `user` (2 rows, two shards), and
    `lang` (1 row: one shard; compact with "sum", kept whole with "mean"/"sqrtn")."""
    video = emb_api.TableConfig(11, 3, name="video", combiner=combiner, optimizer=OPTIMIZERS[optimizer_name]())
    user = emb_api.TableConfig(2, 2, name="user", combiner=combiner, optimizer=emb_api.Adagrad(0.2))
    lang = emb_api.TableConfig(1, 4, name="lang", combiner=combiner, optimizer=emb_api.SGD(0.3))
    return {
        "watched": emb_api.FeatureConfig(video),
        "history": emb_api.FeatureConfig(video, max_sequence_length=3),
        "user": emb_api.FeatureConfig(user),
        "lang": emb_api.FeatureConfig(lang),
    }


def _initial(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "video": rng.normal(size=(11, 3)).astype(np.float32),
        "user": rng.normal(size=(2, 2)).astype(np.float32),
        "lang": rng.normal(size=(1, 4)).astype(np.float32),
    }


def _make(cls, fc, init: dict, **kwargs):
    emb = cls(fc, **kwargs)
    emb.build(per_replica_batch_size=3)
    assign_tables(emb, init)
    return emb


def _batches(seed: int, n: int = 3) -> list:
    """(features, weights) with duplicates (within and across samples), an empty sample and truncation."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        rows = [[3, 3, 10]] + [[int(i) for i in rng.integers(11, size=int(rng.integers(0, 4)))] for _ in range(2)]
        rows[2] = []
        weights = [[float(w) for w in rng.uniform(-2.0, 2.0, size=len(r))] for r in rows]
        history = [[int(i) for i in rng.integers(11, size=int(rng.integers(1, 6)))] for _ in range(3)]
        features = {
            "watched": tf.ragged.constant(rows, tf.int64, ragged_rank=1).to_sparse(),
            "history": tf.ragged.constant(history, tf.int64, ragged_rank=1),
            "user": tf.constant(rng.integers(2, size=3), tf.int64),
            "lang": tf.ragged.constant([[0, 0], [0], []], tf.int64, ragged_rank=1),
        }
        weights = {
            "watched": tf.ragged.constant(weights, tf.float32, ragged_rank=1).to_sparse(),
            "history": None,
            "user": None,
            "lang": tf.ragged.constant([[0.5, 2.0], [-1.5], []], tf.float32, ragged_rank=1),
        }
        out.append((features, weights))
    return out


def _gradient(acts: dict, loss: str) -> dict:
    """dL/dact of 0.5 * sum(act^2) ("square": depends on the activations) or of sum(c * act) ("linear")."""
    if loss == "square":
        return dict(acts)
    return {k: tf.fill(tf.shape(a), 0.75) for k, a in acts.items()}


def _step(emb, features, weights, loss: str) -> dict:
    emb.enqueue(features, weights=weights)
    acts = emb.dequeue()
    emb.apply_gradients(_gradient(acts, loss))
    return acts


def _previous_protocol_step(emb, features, weights, loss: str) -> dict:
    """One step as the protocol before the compact one ran it: partial activations of the full output shape
    from every server, the full activation gradients to every server."""
    inputs, shapes = emb.normalize_inputs(features, weights)
    emb.merge_output_shapes(shapes)
    flat = emb.static_features
    parts = []
    for inp, feature in zip(inputs, flat, strict=True):
        bounds = emb.shard_boundaries[feature.table]
        parts.append([inp] if len(bounds) == 2 else partition.partition_feature(inp, feature.table.combiner, bounds))
    partials = [[] for _ in inputs]
    for plan in emb.server_plans:
        tables, _ = emb.shard_variables(plan)
        acts = embedding_ops.embedding_activations(
            [parts[f][plan.task] for f in plan.features], tables, plan.config, combiners=emb.shard_combiners(plan)
        )
        for f, act in zip(plan.features, acts, strict=True):
            partials[f].append(act)
    acts = [p[0] if len(p) == 1 else tf.add_n(p) for p in partials]
    acts = tf.nest.pack_sequence_as(emb.feature_config, emb.reshape_activations(acts))
    flat_gradients = tf.nest.flatten(_gradient(acts, loss))
    rates = [tf.cast(fn(), tf.float32) for fn in emb.dynamic_learning_rates]
    rounding = emb.rounding_arguments()
    ops = []
    for plan in emb.server_plans:
        # The full activation gradient of every feature the server reads, with its partitioned ids.
        tables, slots = emb.shard_variables(plan)
        arguments = {
            "gradients": [flat_gradients[f] for f in plan.features],
            "learning_rates": [rates[tag] for tag in plan.tags],
            "features": [parts[f][plan.task] for f in plan.features],
            "tables": tables,
            "slots": slots,
            "config": plan.config,
            "combiners": emb.shard_combiners(plan),
        }
        ops.append(embedding_ops.send_tpu_embedding_gradients(**arguments, **rounding_for_plan(plan, rounding)))
    emb.advance_rounding_step([op for op in ops if op is not None])
    return acts


def _assert_bitwise(a: np.ndarray, b: np.ndarray, what: str) -> None:
    # Every bit, except the sign of a zero (0 + -0 is +0 where the kernel copied a single -0 product).
    assert a.shape == b.shape, what
    same = (a.view(np.int32) == b.view(np.int32)) | ((a == 0) & (b == 0))
    assert same.all(), f"{what}: {np.argwhere(~same)[:5].tolist()} differ: {a[~same][:5]} vs {b[~same][:5]}"


@pytest.mark.parametrize("use_function", [False, True])
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_compact_protocol_equals_the_previous_protocol_bitwise(combiner, optimizer_name, use_function):
    init = _initial(11)
    compact = _make(ShardedTPUEmbedding, _feature_config(optimizer_name, combiner), init, num_shards=3)
    previous = _make(ShardedTPUEmbedding, _feature_config(optimizer_name, combiner), init, num_shards=3)
    shards = {t.name: len(v.variables) for t, v in compact.embedding_tables.items()}
    assert shards == {"video": 3, "user": 2, "lang": 1}
    step_compact = tf.function(_step, autograph=False) if use_function else _step
    step_previous = tf.function(_previous_protocol_step, autograph=False) if use_function else _previous_protocol_step
    for features, weights in _batches(5):
        acts = step_compact(compact, features, weights, "square")
        expected = step_previous(previous, features, weights, "square")
        for k in expected:
            _assert_bitwise(acts[k].numpy(), expected[k].numpy(), f"activation {k}")
    after, expected_after = table_values(compact), table_values(previous)
    assert sorted(after) == sorted(expected_after)
    for name in expected_after:
        _assert_bitwise(after[name], expected_after[name], name)


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_compact_protocol_equals_one_process_bitwise_where_the_previous_one_did(optimizer_name):
    """Sum combiner: one id per output sample (the sequence and single-id features) gives the single process's
    activation bits, and tables trained from the same gradients get the single process's bits."""
    init = _initial(12)
    sharded = _make(ShardedTPUEmbedding, _feature_config(optimizer_name, "sum"), init, num_shards=3)
    single = _make(tf_embed_ops.TPUEmbedding, _feature_config(optimizer_name, "sum"), init)
    for features, weights in _batches(6):
        acts = _step(sharded, features, weights, "linear")
        single_acts = _step(single, features, weights, "linear")
        for k in ("history", "user"):
            _assert_bitwise(acts[k].numpy(), single_acts[k].numpy(), f"activation {k}")
        for k in ("watched", "lang"):  # samples across shards: the shards' partial sums add in another order
            np.testing.assert_allclose(acts[k].numpy(), single_acts[k].numpy(), rtol=1e-6, atol=1e-6)
    after, expected = table_values(sharded), table_values(single)
    for name in expected:
        _assert_bitwise(after[name], expected[name], name)
