"""Helpers of the tiered-table tests: an optimizer per schema entry, a table pair (in memory / tiered) with the
same initial rows, a training step, and the record size the cache budget is counted in."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops import _optimizer_schema
from tf_embed_ops import config as te_config

_emb = tf.tpu.experimental.embedding
# What the C++ cache counts per cached row beside the record (its docs: cache_bytes // (record bytes + 34)).
CACHE_OVERHEAD_BYTES = 34
CRC_BYTES = 4
# The tiered dynamic tables' batches: at most 8 distinct keys each over 21 keys (duplicates inside a batch, keys
# shared across batches), so a cache of 8 rows evicts rows, writes them back and reads them again.
DYNAMIC_BATCHES = [
    [3, 900, 900, 7, 1 << 40, 12],
    [12, 13, 40, 41, 3, 66],
    [70, 71, 72, 900, 7, 7, 5],
    [5, 12, 40, 1 << 40, 3, 33, 34],
    [80, 81, 82, 83, 84, 85, 3],
    [900, 70, 13, 41, 5, 66, 81],
]


def schemas() -> list:
    """Every optimizer of the schema (TensorFlow's five and the catalogue)."""
    return list(_optimizer_schema.schemas())


def make_optimizer(schema, **overrides):
    """The schema's optimizer class with its defaults, learning rate 0.05 (a constant callable where the schema
    wants a callable) and `overrides`."""
    cls = getattr(te.optimizers, schema.python_class)
    learning_rate = (lambda: 3.0) if schema.needs_dynamic_learning_rate else 0.05
    return cls(learning_rate=learning_rate, **overrides)


def record_bytes(optimizer, dim: int, dtype=tf.float32, slot_dtype=None) -> int:
    """Bytes of one row's record (docs/tiered_storage.md, "The row file"): the row and each slot in their storage
    dtypes, each padded to a multiple of 4 bytes, then the CRC."""
    slot_dtype = dtype if slot_dtype is None else slot_dtype
    widths = [w for _, w in te_config.slot_shapes(optimizer, 1, dim).values()] if optimizer is not None else []
    buffers = [dim * tf.as_dtype(dtype).size] + [w * tf.as_dtype(slot_dtype).size for w in widths]
    return sum(-(-b // 4) * 4 for b in buffers) + CRC_BYTES


def cache_bytes_for(rows: int, optimizer, dim: int, dtype=tf.float32, slot_dtype=None) -> int:
    """The `cache_bytes` of a cache of exactly `rows` rows."""
    return rows * (record_bytes(optimizer, dim, dtype, slot_dtype) + CACHE_OVERHEAD_BYTES)


def initial_rows(vocab: int, dim: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(vocab, dim)).astype(np.float32)


def table_pair(directory, optimizer, vocab: int, dim: int, cache_rows: int, name: str = "t", **options):
    """Two `te.TableConfig`s with the same initial rows and options: in memory, and tiered in `directory`."""
    rows = initial_rows(vocab, dim)
    common = dict(initializer=tf.constant_initializer(rows), optimizer=optimizer, name=name, **options)
    cache = cache_bytes_for(
        cache_rows, optimizer, dim, options.get("storage_dtype", tf.float32), options.get("slot_storage_dtype")
    )
    memory = te.TableConfig(vocab, dim, **common)
    tiered = te.TableConfig(vocab, dim, storage=te.Tiered(cache_bytes=cache, directory=str(directory)), **common)
    return memory, tiered


def chunked_dynamic_pair(directory, optimizer, dim: int, cache_rows: int, chunk_rows: int, **options):
    """The same `te.DynamicTableConfig` "t" (seed 11) in memory and tiered in `directory`: a cache of `cache_rows`
    rows, checkpoint chunks of `chunk_rows` float32 records."""
    slot_width = sum(w for _, w in te_config.slot_shapes(optimizer, 1, dim).values())
    cache = cache_bytes_for(cache_rows, optimizer, dim, options.get("storage_dtype", tf.float32))
    common = dict(optimizer=optimizer, seed=11, **options)
    storage = te.Tiered(cache_bytes=cache, directory=str(directory), chunk_bytes=chunk_rows * 4 * (dim + slot_width))
    return te.DynamicTableConfig("t", dim, **common), te.DynamicTableConfig("t", dim, storage=storage, **common)


def embedding(table, **kwargs) -> te.TPUEmbedding:
    """A built `te.TPUEmbedding` of one feature "f" over `table`."""
    emb = te.TPUEmbedding({"f": _emb.FeatureConfig(table, name="f")}, **kwargs)
    emb.build()
    return emb


def keras_model(table, key_dtype: str = "int64"):
    """A compiled Keras model of `te.keras.TPUEmbedding` (one feature "f" of `key_dtype` ids over `table`) and a
    seeded Dense(2) head."""
    import keras  # pylint: disable=import-outside-toplevel

    from tf_embed_ops import keras as te_keras  # pylint: disable=import-outside-toplevel

    layer = te_keras.TPUEmbedding({"f": _emb.FeatureConfig(table, name="f")}, name="embedding")
    inputs = {"f": keras.Input(shape=(), dtype=key_dtype, name="f")}
    head = keras.layers.Dense(2, kernel_initializer=keras.initializers.RandomNormal(seed=3), name="head")
    model = keras.Model(inputs, head(layer(inputs)["f"]))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def step(emb: te.TPUEmbedding, features, weights=None, target: float = 1.0):
    """One training step (enqueue, dequeue, a loss, apply_gradients); returns the activations."""
    emb.enqueue(features, weights)
    with tf.GradientTape() as tape:
        acts = emb.dequeue()
        tape.watch(acts)
        loss = sum(tf.reduce_sum((a - target) ** 2 * tf.range(1.0, a.shape[-1] + 1.0)) for a in tf.nest.flatten(acts))
    emb.apply_gradients(tape.gradient(loss, acts))
    return acts


def memory_state(emb: te.TPUEmbedding, table) -> tuple[np.ndarray, dict]:
    """The in-memory table's rows and slots as float32 numpy arrays."""
    values = tf.cast(emb.embedding_tables[table], tf.float32).numpy()
    slots = {k: tf.cast(v, tf.float32).numpy() for k, v in emb.slot_variables[table].items()}
    return values, slots


def tiered_state(emb: te.TPUEmbedding, table) -> tuple[np.ndarray, dict]:
    """The tiered table's rows and slots as float32 numpy arrays (read through its cache)."""
    return emb.tiered_tables[table].read_all()


def assert_same_state(a: tuple, b: tuple) -> None:
    np.testing.assert_array_equal(a[0], b[0])
    assert sorted(a[1]) == sorted(b[1])
    for name in a[1]:
        np.testing.assert_array_equal(a[1][name], b[1][name], err_msg=name)


_TESTS = os.path.dirname(os.path.abspath(__file__))
# A child interpreter's environment: the repository and tests/ importable.
_CHILD_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(_TESTS), _TESTS]))


@contextlib.contextmanager
def killed_child(script: str, *args: str):
    """Runs tests/<script> with `args` in a new interpreter (its stdout a text pipe) for the block, and SIGKILLs it
    wherever it is when the block ends (and closes its stdout)."""
    proc = subprocess.Popen(
        [sys.executable, os.path.join(_TESTS, script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=_CHILD_ENV,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()


def kill_child_after_checkpoint(tmp_path, *extra: str) -> str:
    """Runs tiered_kill_child.py: `train` (with `extra` arguments) until it has saved its checkpoint and trained a
    while longer, SIGKILLs it wherever it is, then `resume` in a new process over the same directory. Returns the
    path of the resumed run's saved table (.npz)."""
    directory, checkpoint = str(tmp_path / "rows"), str(tmp_path / "ckpt" / "c")
    with killed_child("tiered_kill_child.py", "train", directory, checkpoint, *extra) as proc:
        assert proc.stdout.readline().strip() == "saved"
        # Let it run a few more steps (evicting and writing rows back), then kill it wherever it is.
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
        assert proc.poll() is None, "the child stopped by itself"
    out = str(tmp_path / "resumed.npz")
    subprocess.run(
        [sys.executable, os.path.join(_TESTS, "tiered_kill_child.py"), "resume", directory, checkpoint, out, *extra],
        env=_CHILD_ENV,
        check=True,
        timeout=300,
    )
    return out


def kill_child_after_lines(script: str, args: list, lines: list) -> None:
    """Runs tests/<script> with `args` in a new interpreter (the repository and tests/ importable), waits for it to
    print `lines` in order, then SIGKILLs it wherever it is."""
    with killed_child(script, *args) as proc:
        for line in lines:
            assert proc.stdout.readline().strip() == line


def corrupt_every_record(path: str, record: int) -> None:
    """Flips a byte of every record slot of the row file at `path` (slots of `record` bytes after the 4,096-byte
    header; the bytes flipped past the slots are in the location map, which only reopening the file reads): the
    rows not cached fail their CRC32C when read."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        for at in range(4096 + 1, size, record):
            data[at] ^= 0x5A
        f.seek(0)
        f.write(bytes(data))


def status_kib(field: str) -> int:
    """A field of this process's /proc/self/status (VmRSS, VmHWM), in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_rss_growth(work) -> int:
    """Bytes this process's peak RSS rose above its RSS before `work()` ran (the kernel's peak mark is reset first:
    /proc/self/clear_refs "5", then VmHWM is read)."""
    before = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    work()
    return (status_kib("VmHWM") - before) * 1024


def run_json_child(script: str, *args: str) -> dict:
    """Runs tests/<script> in a new interpreter (the repository and this one's path importable) and returns the JSON
    object its last line of output holds."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), here, *sys.path]))
    result = subprocess.run(
        [sys.executable, os.path.join(here, script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
