"""Interleaved pairs: each block of ours timed next to a block of each peer, a ratio per pair, median and spread.

A shared machine's speed moves by 2-3x within minutes, so a ratio of two engines timed minutes apart is partly a
ratio of machine states. Here every engine of a comparison runs its blocks alternately in time with ours: a round
runs, for each peer in turn, one block of ours and one block of the peer back to back (which of the two goes first
alternates from pair to pair), and each pair gives one ratio, peer ms/step over ours ms/step of the block next to
it. A figure is the **median of its pair ratios**, its spread the interquartile range of those ratios (the middle
half of the pairs); a figure whose spread straddles 1 is **level** (neither engine is faster in most pairs).

A ratio between two peers (a ceiling: FBGEMM over the speed-of-light kernel, say) is taken per round as the ratio
of their two pair ratios, so it too compares blocks run seconds apart.

Engines are anything with ``run(steps) -> seconds``: a step function of this process (``LocalEngine``) or an engine
held by a persistent worker process (``benchmarks/workers.py``). Nothing here imports TensorFlow.

Example:
    >>> s = pair_stats([0.9, 1.1, 1.2, 1.3])
    >>> (s["n"], round(s["median"], 2), s["level"])
    (4, 1.15, False)
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, linear between order statistics (numpy's default rule)."""
    if not values:
        raise ValueError("quantile: no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile: q must be in [0, 1], got {q}")
    xs = sorted(float(v) for v in values)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def pair_stats(ratios: Sequence[float]) -> dict:
    """Median, quartiles, extremes and count of per-pair ratios; ``level`` when the quartiles straddle 1.

    Args:
        ratios: one ratio per pair of adjacent blocks (positive, finite).

    Returns:
        {"n", "median", "q1", "q3", "min", "max", "level", "ratios"}.

    Raises:
        ValueError: no ratios, or one that is not positive and finite (a block that took no time, say).
    """
    if not ratios:
        raise ValueError("pair_stats: no pairs")
    bad = [r for r in ratios if not (math.isfinite(r) and r > 0)]
    if bad:
        raise ValueError(f"pair_stats: ratios must be positive and finite, got {bad[:3]}")
    q1, med, q3 = (quantile(ratios, q) for q in (0.25, 0.5, 0.75))
    return {
        "n": len(ratios),
        "median": med,
        "q1": q1,
        "q3": q3,
        "min": float(min(ratios)),
        "max": float(max(ratios)),
        "level": q1 <= 1.0 <= q3,
        "ratios": [float(r) for r in ratios],
    }


def ratio_of_ratios(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """Per round, ``numerator[i] / denominator[i]``: two peers compared through the ours block of each round."""
    if len(numerator) != len(denominator):
        raise ValueError(f"ratio_of_ratios: {len(numerator)} and {len(denominator)} rounds")
    return [a / b for a, b in zip(numerator, denominator, strict=True)]


def invert(ratios: Sequence[float]) -> list[float]:
    """The pair ratios the other way round (ours / peer instead of peer / ours)."""
    return [1.0 / r for r in ratios]


def agreement(a: float, b: float) -> float:
    """How far two runs' figures are apart: max / min - 1 (0.15 = they agree within 15%)."""
    if a <= 0 or b <= 0:
        raise ValueError(f"agreement: figures must be positive, got {a} and {b}")
    return max(a, b) / min(a, b) - 1.0


class LocalEngine:
    """A step function of this process as an engine: ``run(steps)`` times ``steps`` calls back to back."""

    def __init__(self, step: Callable[[], object], clock: Callable[[], float] = time.perf_counter):
        self.step = step
        self.clock = clock

    def run(self, steps: int) -> float:
        t0 = self.clock()
        for _ in range(steps):
            self.step()
        return self.clock() - t0


# Untimed steps an engine runs right before each of its timed blocks, in seconds (run_pairs' `warm`). An engine
# that sat idle while the others ran starts in a transient: its caches refill in a step, but on this machine a
# two-thread TensorFlow process needed about 100 ms of steps after 50 ms or more of idleness to reach its speed
# (its 60 ms blocks measured 0.81-0.87x the one-thread step's speed, 1.04-1.1x once warm).
WARM_S = 0.15


def warm_steps(steps: dict[str, int], block_s: float, warm_s: float = WARM_S) -> dict[str, int]:
    """Each engine's warm steps: ``warm_s`` of its steps, from its block of ``steps[name]`` steps lasting about
    ``block_s`` seconds (at least 1; none when ``warm_s`` is 0)."""
    if warm_s <= 0:
        return {}
    if block_s <= 0:
        raise ValueError(f"warm_steps: block_s must be positive, got {block_s}")
    return {name: max(1, round(k * warm_s / block_s)) for name, k in steps.items()}


def steps_for(estimate_s: float, block_s: float, lo: int = 1, hi: int = 500) -> int:
    """Steps per block so that a block lasts about ``block_s`` seconds."""
    if estimate_s <= 0:
        return hi
    return int(min(hi, max(lo, round(block_s / estimate_s))))


def size_blocks(engine, block_s: float, warmup: int, probes: int = 3) -> int:
    """Warms ``engine`` (``warmup`` single steps) and returns its steps per block (median of ``probes`` steps)."""
    for _ in range(warmup):
        engine.run(1)
    return steps_for(statistics.median(engine.run(1) for _ in range(probes)), block_s)


def run_pairs(
    base, others: dict, steps: dict[str, int], rounds: int, warm: dict[str, int] | None = None, first: int = 0
) -> dict:
    """Times ``rounds`` rounds; in each, every peer's block next to a block of ``base``.

    Args:
        base: the engine every ratio is taken against (ours).
        others: name -> engine.
        steps: name -> steps per block, with ``"base"`` for ``base``.
        rounds: rounds (= pairs per peer).
        warm: name -> untimed steps run right before each of that engine's timed blocks (``"base"`` for
            ``base``; absent or 0: none; ``warm_steps`` sizes them), so that no block is timed in the transient
            of an engine that sat idle while the others ran (see WARM_S).
        first: the index of the first round (rounds timed in several calls go on alternating as one series).

    Returns:
        name -> {"ratios": [peer ms/step / base ms/step, one per round], "ms": [peer ms/step],
        "base_ms": [the adjacent base block's ms/step]}. Within a round the peers' order rotates, and which of
        the two blocks of a pair runs first alternates, so neither engine is always first after the other.
    """
    names = list(others)
    out = {n: {"ratios": [], "ms": [], "base_ms": []} for n in names}
    warm = warm or {}

    def block(name: str, engine) -> float:  # seconds per step of one timed block, after its warm steps
        if warm.get(name, 0) > 0:
            engine.run(warm[name])
        return engine.run(steps[name]) / steps[name]

    for r in range(first, first + rounds):
        order = names[r % len(names) :] + names[: r % len(names)] if names else []
        for name in order:
            if (r + names.index(name)) % 2 == 0:  # each peer's pairs alternate which block runs first
                tb = block("base", base)
                tp = block(name, others[name])
            else:
                tp = block(name, others[name])
                tb = block("base", base)
            rec = out[name]
            rec["ms"].append(tp * 1e3)
            rec["base_ms"].append(tb * 1e3)
            rec["ratios"].append(tp / tb)
    return out
