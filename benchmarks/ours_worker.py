"""Our fused step in a worker process of its own thread count (``benchmarks/workers.py``'s protocol).

TensorFlow's thread pools are fixed when it starts, so ours at two threads runs in a child process, timed block by
block next to ours at one thread in the parent (``benchmarks/headline.py``'s thread pairs).

Usage: python -m benchmarks.ours_worker --threads 2
       then on stdin: prepare NAME workload=W1 optimizer=sgd [smoke=1] [warmup=3] | time NAME STEPS | drop NAME
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ours_worker", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="TensorFlow intra/inter-op threads")
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error("--threads must be >= 1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    from benchmarks import ours, workers
    from benchmarks import workloads as wls

    def make(name: str, params: dict):
        workload = params.get("workload", "W1")
        if workload not in wls.WORKLOADS:
            raise ValueError(f"workload: {workload!r}; expected one of {sorted(wls.WORKLOADS)}")
        wl = wls.WORKLOADS[workload](smoke=params.get("smoke", "0") == "1")
        step = ours.fused_step(wl, params.get("optimizer", "sgd"))
        for _ in range(int(params.get("warmup", "3"))):
            step()
        return step

    workers.serve(sys.stdin, sys.stdout, make)
    return 0


if __name__ == "__main__":
    sys.exit(main())
