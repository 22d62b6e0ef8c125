"""Suite side of the speed-of-light kernel (``speed_of_light.cc``): writes a workload's job, runs it, reads its JSON.

The kernel does one step's work (forward gather/combine, de-duplication, accumulation, row update) in the simplest
fast way, with no framework, on the same ids and upstream gradients as every engine of the suite. Its time is the
yardstick for ours: ``ours / speed_of_light`` per optimizer and workload (1.0 = as fast as a hand-written loop).
``final_tables`` runs it for a few steps from given tables, so the suite can check it does the same work as ours.
With ``keys`` (each table's row keys) the kernel does a dynamic table's step: the features carry their ids' keys
and each step first finds every key's row through a hash index; ``lookup`` is the forward pass alone.

Example:
    >>> res = run(w1(smoke=True), ["sgd"], steps=2, blocks=3, warmup=1)  # doctest: +SKIP
    >>> res["sgd"]["block_ms"]                                            # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

import numpy as np

from benchmarks import bandwidth
from benchmarks.workloads import Workload

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "speed_of_light.cc")
# The optimizers the kernel implements (the lazy optimizers: SGD, Adagrad, lazy Adam), with our names.
OPTIMIZERS = ("sgd", "adagrad", "adam")
# The forward pass alone (no update), for lookup ceilings.
LOOKUP = "lookup"
STORAGES = ("fp32", "bf16")


def build() -> str:
    """Compiles the kernel if needed (OpenMP for the thread count) and returns the binary's path."""
    return bandwidth.native_binary(_SOURCE, "speed_of_light", ["-fopenmp", "-fno-math-errno"])


def upstream_gradients(wl: Workload) -> list[np.ndarray]:
    """The fixed activation gradients every engine uses (the same draws as ``tf_native.make_inputs``)."""
    from benchmarks.peers import tf_native

    return [f["upstream"].numpy() for f in tf_native.make_inputs(wl)["features"]]


def write_keys(directory: str, keys: list[np.ndarray]) -> None:
    """Writes each table's row keys (``keys[t][r]``: row r's int64 key, all distinct) into a job directory, for
    keyed engines (``keys=hashed``)."""
    for t, k in enumerate(keys):
        np.ascontiguousarray(k, np.int64).tofile(os.path.join(directory, f"keys{t}.bin"))


def _write_job(
    tmp: str,
    wl: Workload,
    optimizers: list[str],
    storage: str,
    settings: dict,
    init: list | None = None,
    keys: list[np.ndarray] | None = None,
) -> None:
    from benchmarks.peers import tf_native as tn  # the hyper-parameters every engine of the suite runs

    lines = [f"{k} {v}" for k, v in settings.items()]
    lines += [f"lr {tn.LR}", f"beta1 {tn.BETA1}", f"beta2 {tn.BETA2}", f"epsilon {tn.EPS}"]
    lines += [f"adagrad_init {tn.ADAGRAD_INIT}", f"combiner {wl.combiner}", f"storage {storage}"]
    lines.append("optimizers " + " ".join(optimizers))
    lines += [f"table {t.vocab} {t.dim}" for t in wl.tables]
    for i, (f, up) in enumerate(zip(wl.features, upstream_gradients(wl), strict=True)):
        lines.append(f"feature {f.table} {f.batch} {f.sequence_length}")
        np.ascontiguousarray(f.ids, np.int64).tofile(os.path.join(tmp, f"ids{i}.bin"))
        if f.row_splits is not None:
            np.ascontiguousarray(f.row_splits, np.int64).tofile(os.path.join(tmp, f"splits{i}.bin"))
        np.ascontiguousarray(up, np.float32).tofile(os.path.join(tmp, f"upstream{i}.bin"))
    if keys is not None:
        write_keys(tmp, keys)
        lines.append("keys hashed")
    for t, table in enumerate(init or []):
        np.ascontiguousarray(table, np.float32).tofile(os.path.join(tmp, f"init{t}.bin"))
    with open(os.path.join(tmp, "job.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def _check(optimizers: list[str], storage: str) -> None:
    bad = [o for o in optimizers if o not in (*OPTIMIZERS, LOOKUP)]
    if bad:
        raise ValueError(
            f"optimizers: {bad} not in the speed-of-light kernel; expected some of {(*OPTIMIZERS, LOOKUP)}"
        )
    if storage not in STORAGES:
        raise ValueError(f"storage: {storage!r}; expected one of {STORAGES}")


def run(
    wl: Workload,
    optimizers: list[str],
    storage: str = "fp32",
    threads: int = 1,
    steps: int = 0,
    blocks: int = 7,
    warmup: int = 3,
    block_ms: float = 150.0,
    timeout: int = 1200,
) -> dict:
    """Times the kernel on ``wl``; returns optimizer -> {"block_ms": [...], "steps": n} (ms per step per block).

    ``steps`` 0 lets the kernel size its blocks to ``block_ms``. Raises RuntimeError if it cannot build or run.
    """
    _check(optimizers, storage)
    binary = build()
    with tempfile.TemporaryDirectory(prefix="speed_of_light_") as tmp:
        settings = {"threads": threads, "steps": steps, "blocks": blocks, "warmup": warmup, "block_ms": block_ms}
        _write_job(tmp, wl, optimizers, storage, settings)
        proc = subprocess.run([binary, tmp], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"speed_of_light failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:300]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["results"]


def worker(wl: Workload, threads: int = 1, warmup: int = 3):
    """The kernel as a persistent worker on ``wl`` (``speed_of_light --serve``; ``benchmarks/workers.py``).

    Engines are prepared with ``optimizer=`` (or ``lookup``), ``storage=`` (fp32/bf16), ``threads=`` and
    ``keys=hashed`` for a keyed engine (after ``write_keys(worker.scratch, keys)``). The job directory is removed
    when the worker is closed.
    """
    from benchmarks.workers import Worker

    binary = build()
    tmp = tempfile.mkdtemp(prefix="speed_of_light_serve_")
    _write_job(tmp, wl, list(OPTIMIZERS), "fp32", {"threads": threads, "warmup": warmup})
    # Passive waits: the worker's OpenMP pool must not spin between blocks while another engine runs (spinning
    # threads on a shared 2-core machine slowed a 2-thread block 10-30x here).
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    return Worker([binary, "--serve", tmp], env=env, label="speed_of_light", scratch=tmp)


def final_tables(
    wl: Workload,
    optimizer: str,
    init: list[np.ndarray],
    steps: int,
    storage: str = "fp32",
    keys: list[np.ndarray] | None = None,
) -> list:
    """The tables after ``steps`` kernel steps from ``init`` (for the parity check against ours); keyed with
    ``keys`` (each table's row keys)."""
    _check([optimizer], storage)
    binary = build()
    with tempfile.TemporaryDirectory(prefix="speed_of_light_") as tmp:
        _write_job(tmp, wl, [optimizer], storage, {"check_steps": steps}, init, keys)
        proc = subprocess.run([binary, tmp], capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"speed_of_light failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:300]}")
        return [
            np.fromfile(os.path.join(tmp, f"final_{optimizer}_{t}.bin"), np.float32).reshape(table.vocab, table.dim)
            for t, table in enumerate(wl.tables)
        ]
