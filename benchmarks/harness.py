"""Timing harness: alternating blocks of steps, median and interquartile range per engine.

Engines that are compared are timed in the same process, interleaved block by block (A B C, B C A, C A B, ...), so
a slow phase of the machine (another process, frequency change) lands on all of them instead of on one. Each block
runs ``steps`` steps back to back and yields one ms/step figure; the reported figure is the median over blocks, the
spread the interquartile range. Warmup steps (tracing, first-touch page faults, cache fill) come first, untimed.

Example:
    >>> res = time_alternating({"noop": lambda: None}, steps=2, blocks=3, warmup=1)
    >>> sorted(res["noop"]) == ["block_ms", "iqr_ms", "median_ms", "q1_ms", "q3_ms"]
    True
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np


def summarize(block_ms: list[float]) -> dict:
    """Median, quartiles and IQR (ms per step) of a list of per-block figures."""
    arr = np.asarray(block_ms, dtype=np.float64)
    q1, med, q3 = (float(x) for x in np.percentile(arr, [25, 50, 75]))
    return {"block_ms": [float(x) for x in arr], "median_ms": med, "q1_ms": q1, "q3_ms": q3, "iqr_ms": q3 - q1}


def time_alternating(
    engines: dict[str, Callable[[], object]],
    steps: int | dict[str, int],
    blocks: int,
    warmup: int,
    sync: Callable[[object], None] | None = None,
) -> dict[str, dict]:
    """Times each engine's step function in interleaved blocks.

    Args:
        engines: name -> a zero-argument function that runs one step. An engine that raises during warmup is
            dropped and reported as ``{"error": message}``.
        steps: steps per block, one count for all or per engine (engines far apart in speed each get blocks of
            similar length).
        blocks: blocks per engine (the number of samples for the median).
        warmup: untimed steps per engine before the first block.
        sync: called on a step's return value at the end of each block (e.g. to read a tensor back, so that
            asynchronous execution cannot leak out of the timed region).

    Returns:
        name -> ``summarize(...)`` of its block times, or ``{"error": ...}``.
    """
    results: dict[str, dict] = {}
    live: dict[str, Callable[[], object]] = {}
    for name, fn in engines.items():
        try:
            out = None
            for _ in range(warmup):
                out = fn()
            if sync is not None and out is not None:
                sync(out)
            live[name] = fn
        except Exception as e:  # an engine that cannot run is reported, the others still are
            results[name] = {"error": f"{type(e).__name__}: {_first_line(e)}"}
    times: dict[str, list[float]] = {name: [] for name in live}
    names = list(live)
    for b in range(blocks):
        order = names[b % len(names) :] + names[: b % len(names)] if names else []
        for name in order:
            fn = live[name]
            t0 = time.perf_counter()
            out = None
            n = steps[name] if isinstance(steps, dict) else steps
            for _ in range(n):
                out = fn()
            if sync is not None and out is not None:
                sync(out)
            times[name].append((time.perf_counter() - t0) * 1e3 / n)
    for name in names:
        results[name] = summarize(times[name])
    return results


def steps_for(estimate_ms: float, target_block_ms: float = 200.0, lo: int = 1, hi: int = 200) -> int:
    """Steps per block so that a block lasts about ``target_block_ms`` (timer noise stays far below a block)."""
    if estimate_ms <= 0:
        return hi
    return int(min(hi, max(lo, round(target_block_ms / estimate_ms))))


def estimate_ms(fn: Callable[[], object], budget_ms: float = 300.0, max_calls: int = 20) -> float:
    """A rough ms/step of an already-warm step function, from a few calls (to size the blocks)."""
    samples = []
    start = time.perf_counter()
    for _ in range(max_calls):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
        if (time.perf_counter() - start) * 1e3 > budget_ms:
            break
    return statistics.median(samples)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""


def time_engines(engines: dict, opts) -> dict:
    """Warms every engine, sizes its blocks (``opts``: warmup, smoke, block_ms, blocks), then times them alternating;
    an engine that cannot run is reported with its error (``error_text``)."""
    steps: dict[str, int] = {}
    warm: dict = {}
    errors: dict = {}
    for name, fn in engines.items():
        try:
            for _ in range(opts.warmup):
                fn()
            steps[name] = 1 if opts.smoke else steps_for(estimate_ms(fn), opts.block_ms)
            warm[name] = fn
        except Exception as e:
            errors[name] = {"error": error_text(e)}
    res = time_alternating(warm, steps, opts.blocks, warmup=0)
    for name, r in res.items():
        r["steps_per_block"] = steps.get(name)
    res.update(errors)
    return res


def error_text(e: BaseException) -> str:
    """The message of ``e`` for a report: its last line, without TensorFlow's node dump, named by its type."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    # TF's staging errors start with "in user code:" and end with the real message.
    text = lines[-1] if lines else ""
    # Drop TF's node dump after the message proper ("... for '{{node ...}} = ...' with input shapes: ...").
    text = text.split(" for '{{node ")[0]
    name = type(e).__name__
    return text[:400] if text.startswith(name) else f"{name}: {text[:400]}"
