"""Dynamic-table fuzzer: the dynamic-table ops (training lookup, update, import, evict), the `DynamicTable`
object (`import_`, `lookup`, `find`, `evict`, `evict_keys`, checkpoint restore) and `te.TPUEmbedding` with
static, int64-keyed and string-keyed dynamic tables side by side, fed valid input with 0-3 corruptions each.

Checks per call: no crash or hang; a rejection is a documented error (InvalidArgument / FailedPrecondition from
an op, ValueError / TypeError / RuntimeError from Python) and leaves every table, slot, dynamic-table key, row,
counter and step bitwise unchanged; an inference lookup changes nothing; certainly invalid input (a negative or
non-scalar step, duplicate keys, a table over max_rows, a corrupted checkpoint, ...) is never accepted.
"""

from __future__ import annotations

import functools
import random
import tempfile

import numpy as np
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops._tf_compat import trackable_base
from tf_embed_ops.dynamic import FrequencyAdmission
from tf_embed_ops.dynamic import config as dynamic_config
from tf_embed_ops.dynamic import ops as dyn
from tf_embed_ops.embedding_ops import FeatureInput

from . import _front
from ._harness import Report, check_call, drive

_emb = tf.tpu.experimental.embedding
FEATURES = {"s": (16, 4, "static"), "d": (24, 4, "int"), "w": (10, 2, "string")}
MAX_ROWS = 40


class _Tensors(trackable_base.Trackable):
    def __init__(self, tensors):
        self._tensors = tensors

    def _serialize_to_tensors(self):
        return dict(self._tensors)


def _embedding():
    s = _emb.TableConfig(16, 4, name="s", initializer=tf.random_uniform_initializer(-1, 1, seed=1))
    d = te.DynamicTableConfig(
        "d", 4, max_rows=MAX_ROWS, admission=FrequencyAdmission(2, max_pending_keys=20), eviction=te.dynamic.LRU(30)
    )
    w = te.DynamicTableConfig("w", 2, key_dtype=tf.string, max_rows=MAX_ROWS)
    features = {n: _emb.FeatureConfig(t, name=n) for n, t in (("s", s), ("d", d), ("w", w))}
    emb = te.TPUEmbedding(features, te.optimizers.Adagrad(0.1), check_numerics=True)
    emb.build(_front.BATCH)
    return emb, d, w


class _Target:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.emb, self.d_config, self.w_config = _embedding()
        self.d = self.emb.dynamic_tables[self.d_config]
        self.w = self.emb.dynamic_tables[self.w_config]
        self.op_config = dynamic_config.dynamic_config_proto([_emb.FeatureConfig(self.d_config, name="f")])
        self.tmp = tempfile.TemporaryDirectory()
        self.static_var = self.emb.embedding_tables[next(iter(self.emb.embedding_tables))]

    # ------------------------------------------------------------------------------------------ the ops
    def op_call(self) -> tuple[callable, list[str], bool, bool]:
        rng = self.rng
        n = rng.randint(0, 5)
        keys = np.array([rng.randrange(30) for _ in range(n)], np.int64)
        splits = np.arange(n + 1, dtype=np.int64)
        step = rng.randrange(0, 50)
        grads = np.full([n, 4], 0.1, np.float32)
        handle, keys_t = self.d.handle, keys
        names = []
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            c = rng.randrange(8)
            if c == 0:
                step = rng.choice([-1, -(2**63), 2**64, np.array([1, 2], np.int64), 1.5])
                names.append("step")
            elif c == 1 and n and splits.shape == (n + 1,):
                splits = splits.copy()
                splits[rng.randrange(n + 1)] = rng.choice([-1, n + 1, 2**62])
                names.append("row_splits")
            elif c == 2:
                keys_t = keys.astype(rng.choice([np.float32, np.int32, np.uint8]))
                names.append("key_dtype")
            elif c == 3:
                grads = np.full(rng.choice([[n + 1, 4], [n, 5], [n]]), 0.1, np.float32)
                names.append("gradient_shape")
            elif c == 4 and grads.size:
                grads = grads.copy()
                grads.reshape(-1)[rng.randrange(grads.size)] = rng.choice([np.nan, np.inf])
                names.append("gradient_value")
            elif c == 5:
                handle = rng.choice([self.w.handle, self.static_var.handle])
                names.append("handle")
            elif c == 6:
                grads = np.full([n, 4], rng.choice([3e38, -3e38]), np.float32)
                names.append("gradient_overflow")
            else:
                splits = np.zeros([2, 2], np.int64) if rng.random() < 0.5 else splits[:-1]
                names.append("splits_shape")
        feature = FeatureInput(splits, keys_t, np.zeros([0], np.float32), np.array([n], np.int64))
        training = rng.random() < 0.5
        send = rng.random() < 0.5

        def call():
            if send:
                dyn.dynamic_send_tpu_embedding_gradients(
                    [grads], [], [feature], [handle], step, self.op_config, ["sum"], check_numerics=True
                )
            else:
                dyn.dynamic_embedding_activations([feature], [handle], step, self.op_config, ["sum"], training)

        # What is certainly invalid is decided on the final input (a later corruption may undo an earlier one).
        splits_bad = splits.ndim == 1 and splits.size == n + 1 and (splits.min() < 0 or splits.max() > n or splits[0])
        grads_bad = grads.shape != (n, 4) or not np.all(np.isfinite(grads))
        certain = (
            "step" in names
            or "handle" in names
            or keys_t.dtype == np.float32
            or (splits_bad and n > 0)
            or (send and grads_bad)
        )
        return call, names, certain, not send and not training

    # ------------------------------------------------------------------------------------ the table object
    def table_call(self) -> tuple[callable, list[str], bool, bool]:
        rng = self.rng
        choice = rng.randrange(4)
        if choice == 0:
            return self._import_call()
        if choice == 1:
            ids = rng.choice([[1, 2], np.array([3], np.int32), [0.5], ["a"], tf.ragged.constant([[1], [2, 3]])])
            method = rng.choice(["lookup", "find", "evict_keys"])
            bad = not (isinstance(ids, np.ndarray) or (isinstance(ids, list) and isinstance(ids[0], int)))
            return (lambda: getattr(self.d, method)(ids)), [f"{method}_ids"], bad, method != "evict_keys"
        if choice == 2:
            policy = rng.choice([te.dynamic.LRU(rng.randint(1, 50)), te.dynamic.TTL(rng.randint(1, 9)), "lru", None])
            step = rng.choice([None, 5, -1, 2**64])
            bad = policy == "lru" or step in (-1, 2**64)
            return (lambda: self.d.evict(policy, step)), ["evict"], bad, False
        return self._restore_call()

    def _content(self, n: int, pending: int) -> dict:
        rng = self.rng
        keys = np.array(sorted(rng.sample(range(-100, 100), n + pending)), np.int64)
        rng.shuffle(keys)
        return {
            "keys": np.sort(keys[:n]),
            "weights": np.full([n, 4], rng.uniform(-1, 1), np.float32),
            "slots": np.full([n, 4], 0.5, np.float32),
            "counts": np.ones(n, np.int64),
            "last_steps": np.zeros(n, np.int64),
            "pending_keys": np.sort(keys[n:]),
            "pending_counts": np.ones(pending, np.int64),
            "pending_last_steps": np.zeros(pending, np.int64),
        }

    def _corrupt_content(self, c: dict, names: list) -> bool:
        rng = self.rng
        choice = rng.randrange(8)
        n = c["keys"].size
        if choice == 0 and n >= 2:
            c["keys"] = c["keys"].copy()
            c["keys"][1] = c["keys"][0]
            names.append("duplicate_key")
        elif choice == 1 and n:
            c["counts"] = np.full(n, rng.choice([-1, 2**32]), np.int64)
            names.append("count")
        elif choice == 2:
            c["weights"] = np.zeros([n, rng.choice([3, 5])], np.float32)
            names.append("weights_dim")
        elif choice == 3:
            c["slots"] = np.zeros([n + 1, 4], np.float32)
            names.append("slots_rows")
        elif choice == 4 and n:
            c["last_steps"] = np.full(n, -3, np.int64)
            names.append("last_step")
        elif choice == 5:
            c["pending_keys"] = np.arange(500, 525, dtype=np.int64)
            c["pending_counts"] = np.ones(25, np.int64)
            c["pending_last_steps"] = np.zeros(25, np.int64)
            names.append("pending_over_max")
        elif choice == 6 and n:
            c["weights"] = c["weights"].copy()
            c["weights"][0, 0] = np.nan
            names.append("nan_row")
            return False  # restored as saved (docs/reliability.md)
        else:
            return self._over_max_rows(c, names)
        return True

    def _over_max_rows(self, c: dict, names: list) -> bool:
        n = MAX_ROWS + 1
        c.update(self._content(n, 0))
        names.append("over_max_rows")
        return True

    def _import_call(self):
        c = self._content(self.rng.randint(0, 8), self.rng.randint(0, 3))
        names, certain = [], False
        for _ in range(self.rng.choice([0, 1, 1, 2])):
            certain = self._corrupt_content(c, names) or certain
        return (lambda: self.d.import_(**c)), names or ["import"], certain, False

    def _restore_call(self):
        c = self._content(self.rng.randint(0, 8), self.rng.randint(0, 3))
        c["step"] = np.int64(self.rng.randrange(100))
        names, certain = [], False
        for _ in range(self.rng.choice([0, 1, 1, 2])):
            if self.rng.random() < 0.3:
                c["step"] = self.rng.choice([np.int64(-5), np.array([1, 2], np.int64)])
                names.append("step")
                certain = True
            else:
                certain = self._corrupt_content(c, names) or certain
        root = tf.Module()
        root.d = _Tensors({k: tf.constant(v) for k, v in c.items()})
        root.s = tf.Variable(np.zeros([16, 4] if self.rng.random() < 0.8 else [17, 4], np.float32))
        if tuple(root.s.shape) != (16, 4):
            names.append("static_shape")
            certain = True
        path = tf.train.Checkpoint(embedding=root).write(f"{self.tmp.name}/ckpt")

        def call():
            tf.train.Checkpoint(embedding=self.emb).read(path).expect_partial()

        return call, ["restore", *names], certain, False


def run(seconds: float, seed: int = 0, max_inputs: int | None = None) -> Report:
    target = _Target(seed)
    rng = target.rng

    def one_input(_index: int, report: Report) -> tuple[list, bool]:
        kind = rng.random()
        if kind < 0.3:
            call, names, certain = _front.make_step(FEATURES, rng)
            report.bump("front_step")
            return names, _front.run_step(target.emb, call, report, names, certain)
        if kind < 0.4:
            call, names, _ = _front.make_step(FEATURES, rng)
            report.bump("front_lookup")
            return names, _front.run_lookup(target.emb, call, report, names)
        fn, names, certain, read_only = target.op_call() if kind < 0.7 else target.table_call()
        snapshot = functools.partial(_front.snapshot, target.emb)
        return names, check_call(report, fn, snapshot, names, certain, read_only, _front.EXPECTED)

    report = drive("dynamic", seconds, seed, max_inputs, one_input)
    target.tmp.cleanup()
    return report
