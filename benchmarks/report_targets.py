"""The report's targets: each a ratio of two run records (a speedup) or a record's fraction of the bandwidth bound,
with its goal, and what the speed-of-light kernel says the most this machine could show (docs/benchmarks.md).
Adding a target is one line in ``TARGETS``."""

from __future__ import annotations

import dataclasses

from benchmarks import report_format as fmt

__all__ = ["TARGETS", "Target", "targets"]


@dataclasses.dataclass(frozen=True)
class Target:
    """One target of the report: ``measured = num's median_ms / den's median_ms`` (a speedup: a peer's time, or
    ours at one thread, over ours), or, with ``fraction``, that record's fraction of the bandwidth bound.

    Records are picked by matching fields (``_rec``).  Met when measured >= goal; "not measured" when a record is
    missing or failed.  Adding a target is one line in ``TARGETS``.
    """

    name: str
    goal: float
    how: str
    num: dict | None = None
    den: dict | None = None
    fraction: dict | None = None


def _rec(workload: str, optimizer: str, engine: str = "ours", section: str | None = None, **extra) -> dict:
    """The fields that pick one run record (section defaults to the workload's own section)."""
    return {"section": section or workload, "workload": workload, "optimizer": optimizer, "engine": engine, **extra}


# The speed targets, measured against the speed-of-light kernel (benchmarks/speed_of_light.cc: the step's work as
# one hand-written loop) on W1 and W4 for the lazy optimizers it implements; against FBGEMM for SGD and Adagrad;
# serving lookups against tf.nn.embedding_lookup; two threads against one; plus the earlier Keras 3 Adam targets.
_SOL_OPTIMIZERS = ("sgd", "adagrad", "adam")
TARGETS: list[Target] = (
    [
        Target(
            f"{w} {fmt.OPT_LABELS[o]}: >= 0.8x the speed-of-light kernel",
            0.8,
            "speed-of-light ms / ours ms",
            _rec(w, o, "speed_of_light"),
            _rec(w, o),
        )
        for w in ("W1", "W4")
        for o in _SOL_OPTIMIZERS
    ]
    + [
        Target(
            f"{w} SGD: >= 1.3x FBGEMM EXACT_SGD",
            1.3,
            "FBGEMM EXACT_SGD ms / ours ms",
            _rec(w, "sgd", "fbgemm"),
            _rec(w, "sgd"),
        )
        for w in ("W1", "W2", "W4")
    ]
    + [
        Target(
            "W1 element-wise Adagrad: >= 2.5x FBGEMM",
            2.5,
            "FBGEMM EXACT_ADAGRAD ms / ours ms",
            _rec("W1", "adagrad", "fbgemm"),
            _rec("W1", "adagrad"),
        ),
        Target(
            "W1 RowWiseAdagrad: >= 1.0x FBGEMM EXACT_ROWWISE_ADAGRAD",
            1.0,
            "FBGEMM EXACT_ROWWISE_ADAGRAD ms / our RowWiseAdagrad ms",
            _rec("W1", "adagrad", "fbgemm_rowwise"),
            _rec("W1", "rowwise_adagrad"),
        ),
        Target(
            "W1 serving lookup: >= 2x tf.nn.embedding_lookup",
            2.0,
            "tf.nn.embedding_lookup ms / our lookup ms (Lookup section)",
            _rec("W1", "lookup", "tf_lookup", section="lookup"),
            _rec("W1", "lookup", section="lookup"),
        ),
    ]
    + [
        Target(
            f"{w} {fmt.OPT_LABELS[o]}: 2 threads >= 1.6x 1 thread",
            1.6,
            "ours ms at 1 thread / ours ms at 2 threads (Threads section)",
            _rec(w, o, section="threads", threads=1),
            _rec(w, o, section="threads", threads=2),
        )
        for w in ("W1", "W4")
        for o in ("sgd", "adagrad", "adam")
    ]
    + [
        Target(
            "W1 Adam (lazy): >= 100x Keras 3 Adam",
            100.0,
            "Keras 3 Adam ms / our lazy Adam ms",
            _rec("W1", "adam", "keras"),
            _rec("W1", "adam"),
        ),
        Target(
            "W1 Adam (non-lazy): >= 100x Keras 3 Adam",
            100.0,
            "same update rule on every row",
            _rec("W1", "adam_nonlazy", "keras"),
            _rec("W1", "adam_nonlazy"),
        ),
        Target(
            "W1 Adam (non-lazy): within 2x of the bandwidth bound",
            0.5,
            "bound ms / ours ms (>= 0.5; every row is read and written: a streaming pass the bound models well)",
            fraction=_rec("W1", "adam_nonlazy"),
        ),
    ]
)


def _ceiling(runs: list[dict], t: Target) -> float | None:
    """The most the target's ratio could show on this machine, from the speed-of-light kernel's time.

    A speedup over a peer: the peer's time over the kernel's (no engine beats a hand-written loop of the same
    work); a ratio to the kernel: 1; two threads over one: the kernel's own 2-thread speedup. Where the kernel has
    no such step (an optimizer or a lookup it does not implement), the peer's time over our bandwidth bound.
    """
    if t.fraction is not None:
        return 1.0
    num, den = fmt.find(runs, **t.num), fmt.find(runs, **t.den)
    if t.num.get("engine") == "speed_of_light":
        return 1.0
    if t.num.get("engine") == "ours":  # threads: ours at 1 over ours at 2 -> the kernel's 1 over its 2
        kernel = "speed_of_light"
        return fmt.ratio(fmt.find(runs, **{**t.num, "engine": kernel}), fmt.find(runs, **{**t.den, "engine": kernel}))
    sol = fmt.find(runs, **{**t.den, "engine": "speed_of_light"})
    if num and sol and "median_ms" in num and "median_ms" in sol:
        return num["median_ms"] / sol["median_ms"]
    bound = (den or {}).get("bound", {}).get("bound_ms")
    if num and "median_ms" in num and bound:
        return num["median_ms"] / bound
    return None


# A thread-count target whose two runs cannot be compared (see _states_differ): neither met nor missed.
NOT_COMPARABLE = "not comparable"


def _states_differ(t: Target, ceiling: float | None) -> bool:
    """True when a thread-count target's 1-thread and 2-thread runs (two processes, minutes apart) saw different
    machine states: the speed-of-light kernel, timed beside ours in each, sped up by more than its thread count,
    which one machine state cannot give."""
    threads = t.den.get("threads") if t.num is not None and t.num.get("engine") == "ours" else None
    return threads is not None and ceiling is not None and ceiling > threads


def targets(result: dict) -> list[dict]:
    """Every target of ``TARGETS`` with its measured value, met / missed / not measured / not comparable, and its
    ceiling."""
    runs = result["runs"]
    out = []
    for t in TARGETS:
        if t.fraction is not None:
            rec = fmt.find(runs, **t.fraction)
            measured = rec.get("fraction_of_bound") if rec and "error" not in rec else None
        else:
            measured = fmt.ratio(fmt.find(runs, **t.num), fmt.find(runs, **t.den))
        status = "not measured" if measured is None else ("met" if measured >= t.goal else "missed")
        ceiling = _ceiling(runs, t)
        if measured is not None and _states_differ(t, ceiling):
            status = NOT_COMPARABLE
        out.append(
            {
                "target": t.name,
                "measured": measured,
                "goal": t.goal,
                "status": status,
                "how": t.how,
                "ceiling": ceiling,
            }
        )
    return out
