"""Helpers of the fault tests (tests/test_checkpoint_faults.py, tests/test_publish_faults.py,
tests/test_incremental_checkpoint.py): what a refused call must leave as it was, and an injected full disk."""

from __future__ import annotations

import errno
import os
import threading

import numpy as np
import tensorflow as tf


def files(directory) -> dict:
    """{relative path: bytes} of every file under `directory`."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = f.read()
    return out


def temporaries(directory) -> list:
    """Every file or folder under `directory` with a temporary's name (`.tmp-`)."""
    return [os.path.join(r, n) for r, ds, fs in os.walk(directory) for n in ds + fs if ".tmp-" in n]


def no_space(*_):
    """A stand-in for `os.fsync` on a full disk."""
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def embedding_state(emb) -> dict:
    """Every table, slot and dynamic table (rows, metadata, step, lifecycle-policy state) of a te.TPUEmbedding as
    numpy, by name."""
    out = {}
    for t, v in emb.embedding_tables.items():
        out[t.name] = np.asarray(tf.convert_to_tensor(v))
        for slot, s in emb.slot_variables[t].items():
            out[f"{t.name}/{slot}"] = np.asarray(tf.convert_to_tensor(s))
    for cfg, table in emb.dynamic_tables.items():
        # Its checkpoint tensors: the export, the step and the policies' state (Bloom counters, decayed counts).
        out.update({f"{cfg.name}:{k}": v.numpy() for k, v in table._serialize_to_tensors().items()})
    return out


def race(call, times: int, threads: int, train) -> list:
    """Runs `call()` `times` times in each of `threads` threads while another thread runs `train()` in a loop (at
    least once, to the end of a round after the callers are done); returns the exceptions the callers and the
    training raised."""
    stop, errors = threading.Event(), []

    def training():
        try:
            train()
            while not stop.is_set():
                train()
        except Exception as e:  # returned: a training thread that died would leave the calls uncontended
            errors.append(e)

    def calls():
        try:
            for _ in range(times):
                call()
        except Exception as e:  # returned
            errors.append(e)

    trainer = threading.Thread(target=training)
    callers = [threading.Thread(target=calls) for _ in range(threads)]
    trainer.start()
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    stop.set()
    trainer.join()
    return errors


class EmbeddingModel(tf.Module):
    """A checkpointed model of the fault tests: a te.TPUEmbedding `emb` and a dense variable `dense` that a subclass
    creates, trained by `train` and read whole by `state`."""

    def train(self, ids: dict, dense_feature: str) -> None:
        """One step on `ids`: every activation's gradient is itself minus 1; `dense` moves by the mean activation
        of `dense_feature`."""
        self.emb.enqueue(ids)
        acts = self.emb.dequeue()
        self.emb.apply_gradients({k: v - 1.0 for k, v in acts.items()})
        self.dense.assign_add(tf.reduce_mean(acts[dense_feature], 0))

    def state(self) -> dict:
        """`dense` and every embedding table, slot and dynamic table, as numpy by name."""
        return {"dense": self.dense.numpy(), **embedding_state(self.emb)}
