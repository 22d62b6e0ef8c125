"""Publish-time pruning: which rows of a table a servable keeps.

A `Prune` is applied to a copy of the table's rows at export; the training table is never changed. A row is kept
when it passes every threshold that is set (`min_count`, `max_age_steps`, `min_l2_norm`); then, if `max_rows` is
set, only the `max_rows` survivors with the highest `score` are kept, per shard for a sharded dynamic table. Ties
in the score go to the smaller id (or key), so the selection is deterministic.

A pruned id reads the table's default row in the servable: zeros, what a dynamic table serves for a key it does
not hold.

Criteria and table kinds: a dynamic table (`te.DynamicTableConfig`) tracks each row's update count and the step of
its last update, so every criterion applies. A static table tracks neither: `min_count`, `max_age_steps` and the
scores ``"count"`` / ``"recency"`` are refused there (a `ValueError` naming the table).

Example:
    >>> Prune(min_count=3, max_rows=1_000_000)          # rows seen at least 3 times, at most 1M per shard
    >>> select(Prune(min_l2_norm=0.1), "user", weights)  # the indices of the rows kept, ascending
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

__all__ = ["SCORES", "Prune", "check_applicable", "needs_norms", "row_norms", "select"]

SCORES = ("l2_norm", "count", "recency")
_NEEDS_STATS = ("min_count", "max_age_steps")


@dataclasses.dataclass(frozen=True)
class Prune:
    """Rows a servable drops from one table (see the module docstring).

    Attributes:
      min_count: keep rows updated at least this many times (dynamic tables).
      max_age_steps: keep rows updated within this many steps of the table's current step (dynamic tables).
      min_l2_norm: keep rows whose L2 norm is at least this.
      max_rows: keep at most this many rows (per shard), those with the highest `score`.
      score: what `max_rows` ranks by: ``"l2_norm"`` (default), ``"count"`` or ``"recency"`` (the step of the last
        update; both dynamic tables only).

    Raises:
      ValueError: a negative or non-finite threshold, a non-integer count, age or row cap, or an unknown score.
    """

    min_count: int | None = None
    max_age_steps: int | None = None
    min_l2_norm: float | None = None
    max_rows: int | None = None
    score: str = "l2_norm"

    def __post_init__(self) -> None:
        for name in ("min_count", "max_age_steps", "max_rows"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"te.serving.Prune: {name} must be an integer or None; got {value!r}")
            if value < 0:
                raise ValueError(f"te.serving.Prune: {name} must be >= 0; got {value!r}")
        if self.min_l2_norm is not None:
            value = self.min_l2_norm
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"te.serving.Prune: min_l2_norm must be a number or None; got {value!r}")
            if not math.isfinite(float(value)) or value < 0:
                raise ValueError(f"te.serving.Prune: min_l2_norm must be finite and >= 0; got {value!r}")
        if self.score not in SCORES:
            raise ValueError(f"te.serving.Prune: score must be one of {SCORES}; got {self.score!r}")

    def criteria(self) -> dict:
        """The criteria that are set, {name: value} (for metadata and reports)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}
        if self.max_rows is None:
            out.pop("score")
        return {k: (float(v) if k == "min_l2_norm" else v if k == "score" else int(v)) for k, v in out.items()}


def check_applicable(prune: Any, table_name: str, dynamic: bool) -> Prune:
    """`prune` if it is a `Prune` whose criteria apply to the table's kind.

    Raises:
      ValueError: naming the table, for anything but a `Prune`, or for count/age criteria on a static table.
    """
    if not isinstance(prune, Prune):
        raise ValueError(f"prune for table {table_name!r}: expected a te.serving.Prune; got {prune!r}")
    if not dynamic:
        for name in _NEEDS_STATS:
            if getattr(prune, name) is not None:
                raise ValueError(
                    f"prune for table {table_name!r}: {name}={getattr(prune, name)!r} needs per-row update counts "
                    "and steps, which only dynamic tables (te.DynamicTableConfig) track; a static table can be "
                    "pruned by min_l2_norm and max_rows"
                )
        if prune.max_rows is not None and prune.score != "l2_norm":
            raise ValueError(
                f"prune for table {table_name!r}: score={prune.score!r} needs per-row statistics, which only "
                "dynamic tables track; a static table ranks rows by 'l2_norm'"
            )
    return prune


def needs_norms(prune: Prune) -> bool:
    """Whether `prune` reads the rows' L2 norms (`min_l2_norm`, or `max_rows` ranked by ``"l2_norm"``)."""
    return prune.min_l2_norm is not None or (prune.max_rows is not None and prune.score == "l2_norm")


def row_norms(weights: np.ndarray) -> np.ndarray:
    """The L2 norm of each row of `weights` [n, dim], float64 (row by row: a chunk's norms are the whole
    table's norms of those rows)."""
    # float64: the threshold comparison should not depend on float32 rounding of the sum.
    return np.sqrt(np.sum(np.square(np.asarray(weights, np.float32).astype(np.float64)), axis=1))


def select(
    prune: Prune,
    table_name: str,
    weights: np.ndarray,
    order_keys: np.ndarray | None = None,
    counts: np.ndarray | None = None,
    last_steps: np.ndarray | None = None,
    step: int | None = None,
    norms: np.ndarray | None = None,
) -> np.ndarray:
    """The indices of the rows `prune` keeps, ascending.

    Args:
      prune: the criteria.
      table_name: for error messages.
      weights: the rows [n, dim] (float32).
      order_keys: [n] ids or keys that break score ties (smaller first); default the row index.
      counts: [n] update counts (dynamic tables).
      last_steps: [n] step of each row's last update (dynamic tables).
      step: the table's current step (dynamic tables).
      norms: [n] the rows' `row_norms`, given in place of the rows (`weights` then [n, 0]: a table whose rows are
        read chunk by chunk, never whole).

    Returns:
      int64 indices into `weights`, ascending.

    Raises:
      ValueError: a criterion that needs counts or steps when they are not given (naming the table).
    """
    weights = np.asarray(weights, np.float32)
    n = weights.shape[0]
    keep = np.ones([n], bool)
    if needs_norms(prune) and norms is None:
        norms = row_norms(weights)
    if prune.min_l2_norm is not None:
        keep &= norms >= float(prune.min_l2_norm)
    ranked = prune.score if prune.max_rows is not None else None
    if prune.min_count is not None or ranked == "count":
        if counts is None:
            raise ValueError(f"prune for table {table_name!r}: the table has no update counts")
        counts = np.asarray(counts, np.int64)
    if prune.max_age_steps is not None or ranked == "recency":
        if last_steps is None or step is None:
            raise ValueError(f"prune for table {table_name!r}: the table has no last-update steps")
        last_steps = np.asarray(last_steps, np.int64)
    if prune.min_count is not None:
        keep &= counts >= int(prune.min_count)
    if prune.max_age_steps is not None:
        keep &= (int(step) - last_steps) <= int(prune.max_age_steps)
    kept = np.flatnonzero(keep)
    if prune.max_rows is not None and kept.shape[0] > prune.max_rows:
        score = {"l2_norm": norms, "count": counts, "recency": last_steps}[prune.score][kept]
        ties = (np.arange(n) if order_keys is None else np.asarray(order_keys))[kept]
        primary = -score.astype(np.float64) if prune.score == "l2_norm" else -score.astype(np.int64)
        order = np.lexsort((ties, primary))  # the highest score first, then the smaller id
        kept = np.sort(kept[order[: int(prune.max_rows)]])
    return kept.astype(np.int64)
