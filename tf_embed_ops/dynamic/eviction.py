"""A dynamic table's eviction now: a policy applied at once, a user score's round, and the reading of the table's
eviction log from a reader's own cursor (`DynamicTable.evict`, `DynamicTable.evicted_keys`)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_embed_ops.dynamic import ops as _ops
from tf_embed_ops.dynamic import policies

__all__ = ["evict", "read_log", "score_round"]


def evict(handle: tf.Tensor, where: str, policy: Any, step: Any) -> tf.Tensor:
    """Applies `policy` to the table at `handle` now (`step`: what TTL measures age against); returns how many rows
    it evicted.

    Raises:
      ValueError: `policy` is not an eviction policy (`where` names the table).
    """
    if not isinstance(policy, policies.EvictionPolicy):
        raise ValueError(
            f"{where}: policy must be te.dynamic.LRU, LFU, TTL, L2Norm, DecayedLFU, CountAndAge or Score, got "
            f"{policy!r}"
        )
    if isinstance(policy, policies.Score):
        return score_round(handle, where, policy, step)
    attrs = policy.attrs()
    return _ops.dynamic_table_evict(
        handle,
        step,
        policy=attrs["eviction"],
        max_rows=attrs["eviction_max_rows"],
        ttl_steps=attrs["eviction_ttl_steps"],
        min_norm=attrs["eviction_min_norm"],
        decay=attrs["eviction_decay"],
        min_count=attrs["eviction_min_count"],
    )


def score_round(handle: tf.Tensor, where: str, policy: Any, step: Any) -> tf.Tensor:
    """One eviction round of a user score: the statistics of every row, one call of the score function over them,
    then the lowest scores go (`TfEmbed>DynamicTableEvictByScore`, which checks the scores again)."""
    step = tf.cast(step, tf.int64)
    stats = _ops.dynamic_table_row_stats(handle)
    count = tf.cast(stats.counts, tf.float32)
    scores = policy.fn(
        count,
        tf.cast(stats.last_steps, tf.float32),
        stats.norms,
        tf.fill(tf.shape(count), tf.cast(step, tf.float32)),
    )
    where = f"{where}: the Score function"
    try:
        scores = tf.convert_to_tensor(scores)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where} must return a float32 tensor of shape [n]; got {scores!r} ({e})") from None
    if scores.dtype != tf.float32:
        raise ValueError(
            f"{where} returned dtype {scores.dtype.name}; it must return float32 scores, one per row (shape "
            "[n]); nothing was evicted"
        )
    if scores.shape.rank is not None and scores.shape.rank != 1:
        raise ValueError(
            f"{where} returned shape {scores.shape}; it must return one score per row (shape [n]); nothing was evicted"
        )
    return _ops.dynamic_table_evict_by_score(handle, stats.keys, scores, step, policy.max_rows)


def read_log(
    handle: tf.Tensor, where: str, cursor: tf.Variable, capacity: Any, include_refused: bool, strict: bool
) -> tuple[tf.Tensor, tf.Tensor]:
    """The keys evicted since `cursor` (a reader's own variable, advanced) with the step of each eviction; refused
    admissions too with `include_refused`. `strict`: raise when the log (of `capacity` entries) dropped entries the
    cursor had not read."""
    entries = _ops.dynamic_table_read_log(handle, cursor.read_value())
    checks = []
    if strict:
        checks.append(
            tf.debugging.assert_equal(
                entries.dropped,
                tf.constant(0, tf.int64),
                message=(
                    f"{where}: evicted_keys() fell behind the eviction log, which keeps "
                    f"{capacity} entries (eviction_log_capacity); this many "
                    "evictions were dropped before they were read. Call evicted_keys() more often, raise "
                    "eviction_log_capacity, or call evicted_keys(strict=False) to skip them"
                ),
            )
        )
    with tf.control_dependencies(checks):
        advance = cursor.assign(entries.next_cursor)
    keep = tf.ones_like(entries.kinds, tf.bool) if include_refused else tf.not_equal(entries.kinds, _ops.LOG_REFUSED)
    with tf.control_dependencies([advance]):
        return tf.boolean_mask(entries.keys, keep), tf.boolean_mask(entries.steps, keep)
