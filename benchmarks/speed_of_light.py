"""Suite side of the speed-of-light kernel (``speed_of_light.cc``): writes a workload's job, runs it, reads its JSON.

The kernel does one step's work (forward gather/combine, de-duplication, accumulation, row update) in the simplest
fast way, with no framework, on the same ids and upstream gradients as every engine of the suite. Its time is the
yardstick for ours: ``ours / speed_of_light`` per optimizer and workload (1.0 = as fast as a hand-written loop).
``final_tables`` runs it for a few steps from given tables, so the suite can check it does the same work as ours.
With ``keys`` (each table's row keys) the kernel does a dynamic table's step: the features carry their ids' keys
and each step first finds every key's row through a hash index (``key_index``: ``"wide"``, each key beside its row
number, or ``"compact"``, a dynamic table's layout within its memory budget: row numbers in the index, keys in
per-row records that also count each lookup); ``lookup`` is the forward pass alone.
``InProcessKernel`` steps the kernel in this process instead (the same source built as a shared library), called
directly or run by TensorFlow: as the one op of a ``tf.function``, or as two (its forward half, then its backward
half, as a training step is run).

Example:
    >>> res = run(w1(smoke=True), ["sgd"], steps=2, blocks=3, warmup=1)  # doctest: +SKIP
    >>> res["sgd"]["block_ms"]                                            # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import tempfile

import numpy as np

from benchmarks import bandwidth
from benchmarks.workloads import Workload

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "speed_of_light.cc")
_OP_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "speed_of_light_op.cc")
# The optimizers the kernel implements (the lazy optimizers: SGD, Adagrad, lazy Adam), with our names.
OPTIMIZERS = ("sgd", "adagrad", "adam")
# The forward pass alone (no update), for lookup ceilings.
LOOKUP = "lookup"
STORAGES = ("fp32", "bf16")
# A keyed engine's index layouts (speed_of_light_job.h), with the library's number and the worker's `keys=` word
# for each.
KEY_INDEXES = {"wide": 1, "compact": 2}
WORKER_KEYS = {"wide": "hashed", "compact": "compact"}


def build() -> str:
    """Compiles the kernel if needed (OpenMP for the thread count) and returns the binary's path."""
    return bandwidth.native_binary(_SOURCE, "speed_of_light", ["-fopenmp", "-fno-math-errno"])


def library() -> str:
    """Compiles the kernel as a shared library (``InProcessKernel``'s) if needed and returns its path."""
    return bandwidth.native_binary(
        _SOURCE,
        "speed_of_light_library",
        ["-fopenmp", "-fno-math-errno", "-fPIC", "-shared", "-DSPEED_OF_LIGHT_LIBRARY"],
    )


def op_library() -> str:
    """Compiles the kernel's TensorFlow op (``speed_of_light_op.cc``, linked to ``library()``) if needed and returns
    its path."""
    import tensorflow as tf

    return bandwidth.native_binary(
        _OP_SOURCE,
        "speed_of_light_op",
        # -mno-avx512f: TensorFlow's Eigen headers do not compile for AVX-512 with g++ 12; the op only calls the
        # kernel, which the library builds for this CPU.
        ["-fPIC", "-shared", "-mno-avx512f", *tf.sysconfig.get_compile_flags()],
        [library(), *tf.sysconfig.get_link_flags()],
    )


class InProcessKernel:
    """The kernel stepping in this process, one thread, on its own tables (the library, through ctypes).

    ``step`` runs a step directly; ``tensorflow_step`` returns a ``tf.function`` whose body is the kernel's step as
    a TensorFlow op, so TensorFlow runs it as it runs our fused step. The headline times the two on the same
    tables: the second over the first is what TensorFlow's call costs a step that does the kernel's work
    (docs/benchmarks.md, "Headline ratios").

    Example:
        >>> kernel = InProcessKernel(w1(smoke=True), "sgd")  # doctest: +SKIP
        >>> kernel.step()                                     # one step  # doctest: +SKIP
        >>> kernel.tensorflow_step()()                        # one step, run by TensorFlow  # doctest: +SKIP
        >>> kernel.close()                                    # doctest: +SKIP
    """

    def __init__(
        self,
        wl: Workload,
        optimizer: str,
        warmup: int = 3,
        init: list | None = None,
        storage: str = "fp32",
        keys: list[np.ndarray] | None = None,
        key_index: str = "wide",
    ):
        """``init``: each table's starting rows (float32 [vocab, dim]), else the kernel's own pattern; ``storage``
        the tables' and slots' type (``STORAGES``); ``keys`` each table's row keys (int64, distinct) for the keyed
        step (a dynamic table's: each id's key found through a hash index first), ``key_index`` its layout
        (``KEY_INDEXES``)."""
        _check([optimizer], storage, key_index)
        if warmup < 0:
            raise ValueError(f"warmup: must be >= 0, got {warmup}")
        if init is not None and [np.shape(t) for t in init] != [(t.vocab, t.dim) for t in wl.tables]:
            raise ValueError(
                f"init: shapes {[np.shape(t) for t in init]}; expected {[(t.vocab, t.dim) for t in wl.tables]}"
            )
        if keys is not None and [np.shape(k) for k in keys] != [(t.vocab,) for t in wl.tables]:
            raise ValueError(f"keys: shapes {[np.shape(k) for k in keys]}; expected {[(t.vocab,) for t in wl.tables]}")
        import tensorflow as tf

        # The op's library loads the kernel's as it is loaded, and ctypes then shares that handle.
        self._ops = tf.load_op_library(op_library())
        lib = ctypes.CDLL(library())
        lib.speed_of_light_open.restype = ctypes.c_void_p
        lib.speed_of_light_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
        lib.speed_of_light_steps.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.speed_of_light_read_table.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        lib.speed_of_light_close.argtypes = [ctypes.c_void_p]
        with tempfile.TemporaryDirectory(prefix="speed_of_light_local_") as tmp:
            _write_job(tmp, wl, [optimizer], storage, {"threads": 1}, init, keys, key_index)
            hashed = 0 if keys is None else KEY_INDEXES[key_index]
            state = lib.speed_of_light_open(tmp.encode(), optimizer.encode(), hashed, warmup)
        if not state:  # the library said why on stderr (a key file absent, a key repeated)
            raise RuntimeError(f"speed_of_light: the in-process kernel could not open {wl.name}'s job")
        self._lib, self._state, self._shapes = lib, state, [(t.vocab, t.dim) for t in wl.tables]

    def step(self) -> None:
        """One step of the kernel."""
        if self._state is None:
            raise RuntimeError("InProcessKernel: step after close")
        self._lib.speed_of_light_steps(self._state, 1)

    def tensorflow_step(self, halves: bool = False):
        """A ``tf.function`` that runs one step as a TensorFlow op (``SpeedOfLightStep``), or with ``halves`` as two
        (``SpeedOfLightForward``, then ``SpeedOfLightBackward``: a training step's split, as ours runs it); valid
        until ``close``."""
        import tensorflow as tf

        if self._state is None:
            raise RuntimeError("InProcessKernel: tensorflow_step after close")
        ops = self._ops
        state = tf.constant(self._state, tf.int64)

        @tf.function
        def step():
            ops.speed_of_light_step(state)

        @tf.function
        def step_in_halves():
            # Both ops are stateful, so the function runs them in this order.
            ops.speed_of_light_forward(state)
            ops.speed_of_light_backward(state)

        return step_in_halves if halves else step

    def table(self, t: int) -> np.ndarray:
        """Table ``t``'s rows now (a copy)."""
        if self._state is None:
            raise RuntimeError("InProcessKernel: table after close")
        if not 0 <= t < len(self._shapes):
            raise ValueError(f"table: {t} is not one of the workload's {len(self._shapes)} tables")
        out = np.empty(self._shapes[t], np.float32)
        self._lib.speed_of_light_read_table(self._state, t, out.ctypes.data)
        return out

    def close(self) -> None:
        """Frees the kernel's tables (idempotent)."""
        if self._state is not None:
            self._lib.speed_of_light_close(self._state)
            self._state = None

    def __del__(self):
        if getattr(self, "_state", None) is not None:
            self.close()


def write_keys(directory: str, keys: list[np.ndarray]) -> None:
    """Writes each table's row keys (``keys[t][r]``: row r's int64 key, all distinct) into a job directory, for
    keyed engines (``keys=hashed`` or ``keys=compact``)."""
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
    key_index: str = "wide",
) -> None:
    from benchmarks.peers import tf_native as tn  # the hyper-parameters every engine of the suite runs

    lines = [f"{k} {v}" for k, v in settings.items()]
    lines += [f"lr {tn.LR}", f"beta1 {tn.BETA1}", f"beta2 {tn.BETA2}", f"epsilon {tn.EPS}"]
    lines += [f"adagrad_init {tn.ADAGRAD_INIT}", f"combiner {wl.combiner}", f"storage {storage}"]
    lines.append("optimizers " + " ".join(optimizers))
    lines += [f"table {t.vocab} {t.dim}" for t in wl.tables]
    for i, (f, up) in enumerate(zip(wl.features, tn.upstream_gradients(wl), strict=True)):
        lines.append(f"feature {f.table} {f.batch} {f.sequence_length}")
        np.ascontiguousarray(f.ids, np.int64).tofile(os.path.join(tmp, f"ids{i}.bin"))
        if f.row_splits is not None:
            np.ascontiguousarray(f.row_splits, np.int64).tofile(os.path.join(tmp, f"splits{i}.bin"))
        np.ascontiguousarray(up, np.float32).tofile(os.path.join(tmp, f"upstream{i}.bin"))
    if keys is not None:
        write_keys(tmp, keys)
        lines.append("keys " + WORKER_KEYS[key_index])
    for t, table in enumerate(init or []):
        np.ascontiguousarray(table, np.float32).tofile(os.path.join(tmp, f"init{t}.bin"))
    with open(os.path.join(tmp, "job.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def _check(optimizers: list[str], storage: str, key_index: str = "wide") -> None:
    bad = [o for o in optimizers if o not in (*OPTIMIZERS, LOOKUP)]
    if bad:
        raise ValueError(
            f"optimizers: {bad} not in the speed-of-light kernel; expected some of {(*OPTIMIZERS, LOOKUP)}"
        )
    if storage not in STORAGES:
        raise ValueError(f"storage: {storage!r}; expected one of {STORAGES}")
    if key_index not in KEY_INDEXES:
        raise ValueError(f"key_index: {key_index!r}; expected one of {tuple(KEY_INDEXES)}")


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
    ``keys=hashed`` or ``keys=compact`` (``WORKER_KEYS``) for a keyed engine (after ``write_keys(worker.scratch,
    keys)``). The job directory is removed
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
    key_index: str = "wide",
) -> list:
    """The tables after ``steps`` kernel steps from ``init`` (for the parity check against ours); keyed with
    ``keys`` (each table's row keys) through a ``key_index`` index."""
    _check([optimizer], storage, key_index)
    binary = build()
    with tempfile.TemporaryDirectory(prefix="speed_of_light_") as tmp:
        _write_job(tmp, wl, [optimizer], storage, {"check_steps": steps}, init, keys, key_index)
        proc = subprocess.run([binary, tmp], capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"speed_of_light failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:300]}")
        return [
            np.fromfile(os.path.join(tmp, f"final_{optimizer}_{t}.bin"), np.float32).reshape(table.vocab, table.dim)
            for t, table in enumerate(wl.tables)
        ]
