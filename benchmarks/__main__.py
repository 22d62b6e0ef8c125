"""``python -m benchmarks``: runs the suite and writes JSON, REPORT.md and PNG plots.

Examples:
    python -m benchmarks                      # everything (about 25 minutes on 2 cores), into a scratch directory
    python -m benchmarks --out benchmarks/results   # ... and replace the committed report, plots and README figures
    python -m benchmarks --smoke --out /tmp/b # tiny sizes, seconds: checks the suite end to end
    python -m benchmarks --only W1 --optimizers sgd,adagrad
    python -m benchmarks --fbgemm-python /opt/fbgemm-venv/bin/python   # FBGEMM peer (benchmarks/peers/setup_fbgemm.sh)
    python -m benchmarks --only dynamic --tfra-python /opt/tfra-venv/bin/python   # dynamic tables + TFRA peer
    python -m benchmarks --only serving_quant       # quantized / pruned serving exports: size, latency, CTR AUC
    python -m benchmarks --only lifecycle     # dynamic tables' eviction sweeps, Bloom admission, CTR with Bloom
    python -m benchmarks --only serving_delta   # deltas to a live servable: bytes, latency, memory, lookups
    python -m benchmarks --only tiered        # a table 10x its DRAM cache against the same table in memory
    python -m benchmarks --only ps_wire_bytes   # parameter-server bytes per step: measured and by formula
    python -m benchmarks --rerender benchmarks/results   # REPORT.md, plots, README again from its suite.json
    python -m benchmarks --headline           # every target's ratio by interleaved pairs (about 8 minutes)
    python -m benchmarks --headline --compare A/headline.json B/headline.json   # do two runs agree within 15%?
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

SECTIONS = (
    "W1",
    "W2",
    "W3",
    "W4",
    "sweeps",
    "threads",
    "accumulator",
    "dynamic",
    "serving_quant",
    "lifecycle",
    "serving_delta",
    "checkpoint",
    "tiered",
    "ps_wire_bytes",
)
# The committed report.  Written only when asked for with --out: a trial run must not overwrite it.
COMMITTED_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument(
        "--smoke", action="store_true", help="tiny sizes and 2 blocks: an end-to-end check, not a measurement"
    )
    p.add_argument("--only", default="", help=f"comma-separated sections among {', '.join(SECTIONS)}")
    p.add_argument("--optimizers", default="", help="comma-separated optimizers (default: all); 'lookup' = serving")
    p.add_argument(
        "--out",
        default=None,
        help="output directory (default: a new scratch directory, printed at the end; "
        "benchmarks/results replaces the committed report and updates the README's speed paragraph)",
    )
    p.add_argument("--threads", type=int, default=1, help="TensorFlow intra/inter-op threads and FBGEMM threads")
    p.add_argument("--blocks", type=int, default=None, help="timed blocks per engine (default 7, smoke 2)")
    p.add_argument("--fbgemm-python", default=None, help="interpreter with torch + fbgemm-gpu-cpu")
    p.add_argument("--tfra-python", default=None, help="interpreter with TFRA (benchmarks/peers/setup_tfra.sh)")
    p.add_argument("--no-fbgemm", action="store_true", help="skip the FBGEMM peer (reported as absent)")
    p.add_argument(
        "--no-speed-of-light", action="store_true", help="skip the speed-of-light kernel (needs a C++ compiler)"
    )
    p.add_argument("--no-report", action="store_true", help="write JSON only (no REPORT.md / plots)")
    p.add_argument(
        "--rerender",
        metavar="DIR",
        default=None,
        help="run nothing: write REPORT.md and the plots again from DIR/suite.json, the targets derived anew from "
        "its measurements (for a change of a target or of the report's layout; benchmarks/results also updates "
        "the README's speed paragraph)",
    )
    args = p.parse_args(argv)
    only = tuple(s for s in args.only.split(",") if s)
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        p.error(f"--only: unknown section(s) {bad}; choose from {SECTIONS}")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    return args


def rerender(out: str) -> list[str]:
    """Writes REPORT.md, the plots and the split JSON files again from ``out``/suite.json; returns the paths.

    The measurements are kept as they are; what is derived from them (every target's status, including the dynamic
    section's) is computed again, so a report and its targets never disagree.
    """
    import json

    from benchmarks import dynamic_benchmark, readme_speed, report

    with open(os.path.join(out, "suite.json"), encoding="utf-8") as f:
        result = json.load(f)
    if isinstance(result.get("dynamic"), dict) and "runs" in result["dynamic"]:
        result["dynamic"]["targets"] = dynamic_benchmark.targets(result["dynamic"])
    written = report.write(result, out)
    if os.path.realpath(out) == os.path.realpath(COMMITTED_OUT):
        written.append(readme_speed.update_readme())
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--headline" in argv:  # its own options (benchmarks/headline.py)
        from benchmarks import headline

        return headline.main([a for a in argv if a != "--headline"])
    args = parse_args(argv)
    if args.rerender:
        for path in rerender(args.rerender):
            print("wrote", path)
        return 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Thread pools are fixed when TensorFlow starts: configure before any op runs.
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    from benchmarks import readme_speed, report, suite

    opts = suite.Options(
        smoke=args.smoke,
        only=tuple(s for s in args.only.split(",") if s),
        optimizers=tuple(s for s in args.optimizers.split(",") if s),
        threads=args.threads,
        fbgemm_python=args.fbgemm_python,
        no_fbgemm=args.no_fbgemm,
        no_speed_of_light=args.no_speed_of_light,
        tfra_python=args.tfra_python,
        blocks=args.blocks or (2 if args.smoke else 7),
        warmup=1 if args.smoke else 3,
    )
    out = args.out or tempfile.mkdtemp(prefix="tf_embed_ops_bench_")
    t0 = time.time()
    result = suite.run(opts, log=lambda m: print(m, flush=True))
    result["meta"]["wall_s"] = time.time() - t0
    # The report is only as good as the machine was quiet: the load at the end says whether it stayed so.
    result["meta"].setdefault("host", {})["load_avg_at_end"] = os.getloadavg()
    written = report.write(result, out, with_report=not args.no_report)
    if os.path.realpath(out) == os.path.realpath(COMMITTED_OUT) and not args.no_report and not args.smoke:
        written.append(readme_speed.update_readme())
    for path in written:
        print("wrote", path)
    if args.out is None:
        print(f"(a scratch directory; `--out {os.path.relpath(COMMITTED_OUT)}` replaces the committed report)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
