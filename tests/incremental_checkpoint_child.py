"""Child process of test_incremental_checkpoint's SIGKILL test: restore (if any), then train and save forever.

Prints "restored <step>" once and "saved <step>" after each completed save, so the parent can kill it at any
moment of a save.
"""

import sys

import numpy as np
import tensorflow as tf

import tf_embed_ops as te

_emb = tf.tpu.experimental.embedding


def main(directory: str) -> None:
    table = _emb.TableConfig(200_000, 16, name="t", optimizer=_emb.Adagrad(0.1), combiner="sum")
    dyn = te.DynamicTableConfig("d", 8, optimizer=_emb.Adagrad(0.1), combiner="sum")
    emb = te.TPUEmbedding({"t": _emb.FeatureConfig(table), "d": _emb.FeatureConfig(dyn)})
    emb.build(per_replica_batch_size=256)
    ckpt = tf.train.Checkpoint(emb=emb)
    mgr = te.checkpoint.IncrementalCheckpointManager(ckpt, directory, full_every=3)
    step = mgr.restore_or_initialize() or 0
    print(f"restored {step}", flush=True)
    rng = np.random.default_rng(step)
    while True:
        emb.enqueue(
            {
                "t": tf.constant(rng.integers(0, 200_000, 256), tf.int64),
                "d": tf.constant(rng.integers(0, 10_000, 256), tf.int64),
            }
        )
        acts = emb.dequeue()
        emb.apply_gradients({k: tf.ones_like(v) for k, v in acts.items()})
        step += 1
        mgr.save(checkpoint_number=step)
        print(f"saved {step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
