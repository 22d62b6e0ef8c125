"""Shared inputs of the row-wise Adagrad tests: bags of ids per feature and step, all features on one table, and
our fused backward op run over them (raw op path, sum combiner)."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

import tf_embed_ops.config as tec
from tf_embed_ops import embedding_ops

E = tf.tpu.experimental.embedding


@dataclasses.dataclass
class Steps:
    """S steps of F features over a [rows, dim] table: per step and feature (ids, bag offsets [B + 1], grad [B, D])."""

    w0: np.ndarray
    batches: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]]

    @property
    def rows(self) -> int:
        return self.w0.shape[0]

    @property
    def dim(self) -> int:
        return self.w0.shape[1]


def make_steps(rows=50, dim=20, num_features=1, steps=3, batch=8, seed=0) -> Steps:
    """Random bags (0 to 3 ids, so empty bags and duplicates occur) and gradients, seeded."""
    rng = np.random.default_rng(seed)
    w0 = rng.normal(size=(rows, dim)).astype(np.float32)
    batches = []
    for _ in range(steps):
        features = []
        for _ in range(num_features):
            lens = rng.integers(0, 4, size=batch)
            offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            ids = rng.integers(0, rows, size=int(offsets[-1])).astype(np.int64)
            features.append((ids, offsets, rng.normal(size=(batch, dim)).astype(np.float32)))
        batches.append(features)
    return Steps(w0, batches)


def run_ours(steps: Steps, optimizer, learning_rates=(), initial_accumulator=0.0):
    """Applies every step with the fused backward op; returns (weights, row accumulators [rows, 1])."""
    table = E.TableConfig(vocabulary_size=steps.rows, dim=steps.dim, name="t", optimizer=optimizer, combiner="sum")
    num_features = len(steps.batches[0])
    features = tuple(E.FeatureConfig(table=table, name=f"f{i}") for i in range(num_features))
    config = tec.from_feature_config(features)
    weights = tf.Variable(steps.w0)
    (shape,) = tec.slot_shapes(optimizer, steps.rows, steps.dim).values()
    accumulators = tf.Variable(np.full(shape, initial_accumulator, np.float32))
    for step in steps.batches:
        inputs = [
            embedding_ops.normalize_feature(tf.RaggedTensor.from_row_splits(ids, offsets)) for ids, offsets, _ in step
        ]
        grads = [g for _, _, g in step]
        embedding_ops.send_tpu_embedding_gradients(
            grads, list(learning_rates), inputs, [weights], [[accumulators]], config, combiners=["sum"] * num_features
        )
    return weights.numpy(), accumulators.numpy()


def row_gradients(step) -> dict[int, np.ndarray]:
    """{row: summed gradient} of one step (sum pooling: every id of bag b receives grad[b])."""
    out: dict[int, np.ndarray] = {}
    for ids, offsets, grad in step:
        for b in range(len(offsets) - 1):
            for i in ids[offsets[b] : offsets[b + 1]]:
                out[int(i)] = out.get(int(i), np.zeros(grad.shape[1])) + grad[b].astype(np.float64)
    return out


def run_ours_per_step_rates(steps: Steps, optimizer, rates):
    """As run_ours, for an optimizer with a callable (dynamic) learning rate: step s runs at rates[s]."""
    table = E.TableConfig(vocabulary_size=steps.rows, dim=steps.dim, name="t", optimizer=optimizer, combiner="sum")
    config = tec.from_feature_config((E.FeatureConfig(table=table, name="f"),))
    weights = tf.Variable(steps.w0)
    accumulators = tf.Variable(np.zeros((steps.rows, 1), np.float32))
    for step, rate in zip(steps.batches, rates, strict=True):
        ((ids, offsets, grad),) = step
        feature = embedding_ops.normalize_feature(tf.RaggedTensor.from_row_splits(ids, offsets))
        embedding_ops.send_tpu_embedding_gradients(
            [grad], [rate], [feature], [weights], [[accumulators]], config, combiners=["sum"]
        )
    return weights.numpy(), accumulators.numpy()
