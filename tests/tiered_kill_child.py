"""Child process of test_tiered_faults' SIGKILL test.

`train <directory> <checkpoint> [dynamic]`: trains a tiered table on STEPS_BEFORE batches, writes a checkpoint,
prints "saved", then trains on forever (the parent kills it mid-step, possibly mid write-back of an evicted row).
`resume <directory> <checkpoint> <out.npz> [dynamic]`: a new process over the same directory (the killed run's row
file is replaced), restores the checkpoint, trains on STEPS_AFTER batches and saves the table's rows and slots (a
dynamic table's whole export). Batch i is a function of i only, so the parent can train the same table in memory
on the same batches. `dynamic`: a tiered dynamic table (test_tiered_dynamic), else a static one.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

import tf_embed_ops as te

V, DIM, CACHE_ROWS, BATCH = 2000, 8, 64, 48
STEPS_BEFORE, STEPS_AFTER = 3, 3


def config(directory: str | None, mode: str = "create", dynamic: bool = False):
    """The table (tiered in `directory`, else in memory): bf16 rows, Adagrad, a cache of 64 of 2000 rows (a
    dynamic table: of up to 2000 keys, LRU-evicted down to 1500)."""
    optimizer = te.optimizers.Adagrad(0.1, initial_accumulator_value=0.1)
    storage = None
    if directory is not None:
        record = 2 * DIM * 2 + 4  # bf16 row and accumulator, the CRC
        storage = te.Tiered(cache_bytes=CACHE_ROWS * (record + 34), directory=directory, mode=mode)
    if dynamic:
        return te.DynamicTableConfig(
            "t",
            DIM,
            optimizer=optimizer,
            initializer=tf.random_uniform_initializer(-0.5, 0.5, seed=3),
            max_rows=V,
            eviction=te.dynamic.LRU(1500),
            storage_dtype=tf.bfloat16,
            storage=storage,
        )
    return te.TableConfig(
        V,
        DIM,
        name="t",
        optimizer=optimizer,
        initializer=tf.random_uniform_initializer(-0.5, 0.5, seed=3),
        storage_dtype=tf.bfloat16,
        storage=storage,
    )


def batch(i: int) -> dict:
    rng = np.random.default_rng(1000 + i)
    return {"f": tf.constant(np.minimum(rng.zipf(1.3, BATCH) - 1, V - 1), tf.int64)}


def train_step(emb, i: int) -> None:
    emb.enqueue(batch(i))
    with tf.GradientTape() as tape:
        acts = emb.dequeue()
        tape.watch(acts)
        loss = tf.reduce_sum((acts["f"] - 0.25) ** 2)
    emb.apply_gradients(tape.gradient(loss, acts))


def embedding(table):
    emb = te.TPUEmbedding({"f": tf.tpu.experimental.embedding.FeatureConfig(table)})
    emb.build()
    return emb


def main(argv: list[str]) -> None:
    what, directory, checkpoint = argv[:3]
    dynamic = argv[-1] == "dynamic"
    if what == "train":
        emb = embedding(config(directory, dynamic=dynamic))
        for i in range(STEPS_BEFORE):
            train_step(emb, i)
        tf.train.Checkpoint(embedding=emb).write(checkpoint)
        print("saved", flush=True)
        i = STEPS_BEFORE
        while True:
            train_step(emb, i)
            i += 1
    if not dynamic:
        # The killed process wrote rows after its last flush: the row file's location map is stale, and reopening
        # it is refused (the checkpoint restores the table).
        try:
            embedding(config(directory, mode="open"))
        except tf.errors.OpError as e:
            assert "not closed cleanly" in str(e) and "checkpoint" in str(e), str(e)
        else:
            raise AssertionError("the row file of a killed process was opened")
    table = config(directory, mode="overwrite", dynamic=dynamic)
    emb = embedding(table)
    tf.train.Checkpoint(embedding=emb).read(checkpoint).assert_consumed()
    for i in range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER):
        train_step(emb, i)
    if dynamic:
        np.savez(argv[3], **{k: v.numpy() for k, v in emb.dynamic_tables[table].export().items()})
        return
    values, slots = emb.tiered_tables[table].read_all()
    np.savez(argv[3], values=values, **slots)


if __name__ == "__main__":
    main(sys.argv[1:])
