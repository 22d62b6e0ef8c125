"""Child process of test_tiered_dynamic_checkpoint's kill test: a streamed checkpoint killed mid-write.

`python tiered_dynamic_save_kill_child.py <directory>`: fills a tiered dynamic table (`rows(i)` below), saves a
first checkpoint with a `tf.train.CheckpointManager` in `<directory>/ckpt` and prints "saved", then changes every
row and starts a second save whose chunk reads are slowed down (50 ms each); after its third chunk it prints
"mid-save" and the parent SIGKILLs it there.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops.dynamic import ops as dynamic_ops

KEYS, DIM, CHUNK_ROWS = 4096, 8, 64


def config(directory: str) -> te.DynamicTableConfig:
    storage = te.Tiered(cache_bytes=1 << 16, directory=directory, chunk_bytes=CHUNK_ROWS * 4 * 2 * DIM)
    return te.DynamicTableConfig("t", DIM, optimizer=te.optimizers.Adagrad(0.1), storage=storage, seed=1)


def keys() -> np.ndarray:
    return np.arange(KEYS, dtype=np.int64) * 1000003 - 77


def rows(version: int) -> np.ndarray:
    """The rows of every key, [KEYS, DIM] float32 (the slots are their squares)."""
    return np.random.default_rng(version).normal(size=(KEYS, DIM)).astype(np.float32)


def fill(table, version: int) -> None:
    ones, none = np.ones(KEYS, np.int64), np.zeros(0, np.int64)
    dynamic_ops.dynamic_table_tiered_import_keys(table.handle, keys(), ones, ones * version, none, none, none)
    values = rows(version)
    dynamic_ops.dynamic_table_tiered_write_rows(table.handle, keys(), values, [values**2])


def main(directory: str) -> None:
    table = te.dynamic.DynamicTable(config(os.path.join(directory, "rows")))
    fill(table, 1)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(table=table), os.path.join(directory, "ckpt"), 3)
    manager.save()
    print("saved", flush=True)
    fill(table, 2)
    real_read, chunks = dynamic_ops.dynamic_table_tiered_read_rows, []

    def slow_read(*args, **kwargs):
        chunks.append(1)
        if len(chunks) == 3:
            print("mid-save", flush=True)
        time.sleep(0.05)
        return real_read(*args, **kwargs)

    dynamic_ops.dynamic_table_tiered_read_rows = slow_read
    manager.save()
    print("finished", flush=True)  # not reached: the parent kills the process mid-save


if __name__ == "__main__":
    main(sys.argv[1])
