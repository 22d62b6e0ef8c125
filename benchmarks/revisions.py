"""``python -m benchmarks.revisions --before DIR``: is a change slower? Our steps at two checkouts, interleaved.

Each checkout (this one, or ``--after DIR``, against ``--before DIR``: a ``git worktree`` of the older commit with
its op library built, ``python setup.py build_ext --inplace``) runs in a worker process of its own that imports
that checkout's ``tf_embed_ops`` and ``benchmarks``, speaks ``benchmarks/workers.py``'s protocol (loaded from this
checkout, so an older checkout needs none of it) and times one block on request. The blocks of the two run
alternately (``pairs.run_pairs``), so each ratio is the median of per-pair ratios, which a machine's drift
between minutes does not move. A case's ratio is after / before: below 1 is faster, *level* when its quartiles
straddle 1.

Both workers run one TensorFlow intra-op thread unless ``--threads N`` says otherwise.

Cases: ``W1:sgd`` style, a workload of ``benchmarks/workloads.py`` (its fused step, ``ours.fused_step``) or
``dyn`` (the dynamic-table W1 step, ``dynamic_benchmark.dynamic_step``), and an optimizer both checkouts know;
``W1:adagrad+tracked`` runs a static workload's step with its tables' touched-row tracking on (docs/tracking.md).
The optimizer ``lookup`` times the forward op alone instead (``ours.lookup_step``, or for ``dyn`` the serving
lookup ``dynamic_benchmark.dynamic_lookup_step``).

Example:
    git worktree add /tmp/before 925b2c1 && (cd /tmp/before && python setup.py -q build_ext --inplace)
    python -m benchmarks.revisions --before /tmp/before --pairs 15
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

DEFAULT_CASES = "W1:sgd,W1:adagrad,W4:sgd,W4:adagrad,dyn:sgd,dyn:adagrad"
_HERE = os.path.dirname(os.path.abspath(__file__))


VARIANTS = ("tracked",)
# The optimizer name of a case that times the forward op alone.
LOOKUP = "lookup"
# The workers' intra-op thread count (--threads), passed through their environment.
_THREADS_ENV = "TF_EMBED_OPS_REVISIONS_THREADS"


def parse_cases(text: str) -> list[tuple[str, str]]:
    """``"W1:sgd,dyn:adagrad"`` -> ``[("W1", "sgd"), ("dyn", "adagrad")]``; an optimizer may carry a variant
    (``"W1:adagrad+tracked"`` -> ``("W1", "adagrad+tracked")``); a malformed case is an error naming it."""
    cases = []
    for case in text.split(","):
        workload, sep, optimizer = case.strip().partition(":")
        if not sep or not workload or not optimizer:
            raise ValueError(f"case {case!r} is not WORKLOAD:OPTIMIZER (e.g. W1:sgd, dyn:adagrad)")
        name, plus, variant = optimizer.partition("+")
        if plus and (not name or variant not in VARIANTS):
            raise ValueError(f"case {case!r}: variant {variant!r}; expected one of {VARIANTS}")
        if variant and workload == "dyn":
            raise ValueError(f"case {case!r}: +{variant} runs a static workload (W1..W4), not dyn")
        if variant and name == LOOKUP:
            raise ValueError(f"case {case!r}: +{variant} runs a training step, not {LOOKUP}")
        cases.append((workload, optimizer))
    return cases


def _serve() -> None:
    """The worker: this process's working directory is the checkout it measures."""
    import importlib.util

    sys.path.insert(0, os.getcwd())
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get(_THREADS_ENV, "1")))
    tf.config.threading.set_inter_op_parallelism_threads(1)
    spec = importlib.util.spec_from_file_location("revision_workers", os.path.join(_HERE, "workers.py"))
    workers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workers)
    import tf_embed_ops
    from benchmarks import dynamic_benchmark, ours, workloads

    checkout = os.path.realpath(os.getcwd())
    if not os.path.realpath(tf_embed_ops.__file__).startswith(checkout + os.sep):
        raise SystemExit(f"{checkout}: imported tf_embed_ops from {tf_embed_ops.__file__}, not from the checkout")

    def make(name: str, params: dict):
        smoke = params.get("smoke") == "1"
        optimizer, _, variant = params["optimizer"].partition("+")
        if params["workload"] == "dyn":
            wl, keys, vocab_keys = dynamic_benchmark.make_workload(smoke)
            if optimizer == LOOKUP:
                step = dynamic_benchmark.dynamic_lookup_step(wl, keys, vocab_keys)
            else:
                step = dynamic_benchmark.dynamic_step(wl, keys, vocab_keys, optimizer)
        elif optimizer == LOOKUP:
            step = ours.lookup_step(workloads.WORKLOADS[params["workload"]](smoke=smoke))
        else:
            step = ours.fused_step(workloads.WORKLOADS[params["workload"]](smoke=smoke), optimizer)
        if variant == "tracked":  # the trackers live as long as the step holds them
            step.keep = [tf_embed_ops.ops.tf_embed_touched_rows_track(t.handle) for t in step.state[0]]
        for _ in range(int(params.get("warmup", "3"))):
            step()
        return step

    workers.serve(sys.stdin, sys.stdout, make)


def compare(before: str, after: str, cases: list, pairs_per_case: int, block_s: float, smoke: bool, log=print) -> dict:
    """{"WORKLOAD_OPTIMIZER": {"after_over_before": pair statistics, "before_ms", "after_ms", "steps_per_block"}}."""
    from benchmarks import pairs, workers

    argv = [sys.executable, os.path.abspath(__file__), "--serve"]
    params = {"smoke": "1" if smoke else "0"}
    results = {}
    with (
        workers.Worker(argv, cwd=before, label="before") as old,
        workers.Worker(argv, cwd=after, label="after") as new,
    ):
        for workload, optimizer in cases:
            name = f"{workload}_{optimizer}"
            for w in (old, new):
                w.prepare(name, workload=workload, optimizer=optimizer, **params)
            base, other = old.engine(name), new.engine(name)
            steps = pairs.size_blocks(other, block_s, warmup=2)
            per_block = {"base": steps, "after": steps}
            warm = pairs.warm_steps(per_block, block_s)
            run = pairs.run_pairs(base, {"after": other}, per_block, pairs_per_case, warm)["after"]
            results[name] = {
                "after_over_before": pairs.pair_stats(run["ratios"]),
                "before_ms": statistics.median(run["base_ms"]),
                "after_ms": statistics.median(run["ms"]),
                "steps_per_block": steps,
            }
            s = results[name]["after_over_before"]
            verdict = "level" if s["level"] else ("faster" if s["median"] < 1 else "slower")
            log(
                f"{name}: after / before {s['median']:.3f} [{s['q1']:.3f}-{s['q3']:.3f}], {s['n']} pairs, {verdict}"
                f" ({results[name]['before_ms']:.2f} -> {results[name]['after_ms']:.2f} ms)"
            )
            for w in (old, new):
                w.drop(name)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.revisions", description=__doc__.splitlines()[0])
    p.add_argument("--before", help="the older checkout (its op library built)")
    p.add_argument("--after", default=os.path.dirname(_HERE), help="the newer checkout (default: this one)")
    p.add_argument(
        "--cases", default=DEFAULT_CASES, help=f"comma-separated WORKLOAD:OPTIMIZER (default {DEFAULT_CASES})"
    )
    p.add_argument("--pairs", type=int, default=15, help="pairs per case")
    p.add_argument("--block-ms", type=float, default=300.0, help="target length of one block")
    p.add_argument("--smoke", action="store_true", help="tiny workloads: an end-to-end check, not a measurement")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--threads", type=int, default=1, help="TensorFlow intra-op threads in both workers (default 1)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        _serve()
        return 0
    if not args.before:
        p.error("--before is required")
    for flag, path in (("--before", args.before), ("--after", args.after)):
        if not os.path.isdir(os.path.join(path, "tf_embed_ops")) or not os.path.isdir(os.path.join(path, "benchmarks")):
            p.error(f"{flag} {path!r} is not a tf_embed_ops checkout (no tf_embed_ops/ and benchmarks/ in it)")
    if args.pairs < 1:
        p.error(f"--pairs must be >= 1, got {args.pairs}")
    if args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    os.environ[_THREADS_ENV] = str(args.threads)
    try:
        cases = parse_cases(args.cases)
    except ValueError as e:
        p.error(str(e))
    results = compare(args.before, args.after, cases, args.pairs, args.block_ms / 1e3, args.smoke)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
