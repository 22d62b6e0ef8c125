"""Op-input fuzzer: the fused embedding ops fed valid batches with 0-3 corruptions each (row splits, sparse
indices, ids, weights, sample shapes, gradients, learning rates, combiners, dtypes, variables of the wrong shape,
dtype or count, the same variable twice).

Checks per call: no crash or hang; a rejection is InvalidArgument / FailedPrecondition (from the op) or
ValueError / TypeError (static, from the wrapper) and leaves every variable bitwise unchanged; the forward op
never changes a variable; input that is certainly invalid (an id or row split out of range, a negative or
non-finite learning rate) is never accepted.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import tensorflow as tf
from embedding_test_util import make_config

from tf_embed_ops import embedding_ops as eo

from ._harness import Report, bits, check_call, drive

TABLES = [("a", 16, 4, {"name": "adagrad"}, 0.1), ("b", 8, 2, {"name": "adam"}, ("dynamic", 0))]
FEATURES = [("f0", 0, []), ("f1", 0, []), ("f2", 1, [])]
SLOTS = [1, 2]
HUGE = [2**62, 2**63 - 1, -(2**63), 2**31, 2**40, -1]
EXPECTED = (tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError, ValueError, TypeError)


class State:
    def __init__(self, rng: np.random.Generator):
        self.config = make_config(
            [{"name": n, "vocab": v, "dim": d, "opt": o, "lr": lr} for n, v, d, o, lr in TABLES], FEATURES
        ).SerializeToString()
        self.tables = [tf.Variable(rng.normal(size=(v, d)).astype(np.float32)) for _, v, d, _, _ in TABLES]
        self.slots = [
            [tf.Variable(rng.uniform(0.1, 1, size=(v, d)).astype(np.float32)) for _ in range(k)]
            for (_, v, d, _, _), k in zip(TABLES, SLOTS, strict=True)
        ]
        self.wrong = [
            tf.Variable(np.zeros([17, 4], np.float32)),
            tf.Variable(np.zeros([16, 5], np.float32)),
            tf.Variable(np.zeros([16], np.float32)),
            tf.Variable(np.zeros([16, 4], np.float64)),
            tf.Variable(np.zeros([8, 2], np.int32)),
        ]

    def variables(self):
        return [*self.tables, *(s for per in self.slots for s in per), *self.wrong]

    def snapshot(self):
        return [bits(v.numpy()) for v in self.variables()]

    def reset(self, rng: np.random.Generator):
        for v in self.variables():
            v.assign(rng.uniform(0.1, 1, size=v.shape).astype(v.dtype.as_numpy_dtype))


def _valid_feature(rng: random.Random, vocab: int):
    """(splits_or_indices, ids, weights, sample_shape) as numpy arrays, and the activation shape's prefix."""
    kind = rng.choice(["dense", "ragged", "sparse", "sparse3"])
    batch = rng.randint(0, 5)
    if kind == "dense":
        ids = np.array([rng.randrange(vocab) for _ in range(batch)], np.int64)
        return np.zeros([0], np.int64), ids, np.zeros([0], np.float32), np.array([batch], np.int64)
    if kind == "ragged":
        lengths = [rng.randint(0, 3) for _ in range(batch)]
        splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        n = int(splits[-1])
        ids = np.array([rng.randrange(vocab) for _ in range(n)], np.int64)
        weights = np.array([rng.uniform(-2, 2) for _ in range(n)], np.float32) if rng.random() < 0.5 else None
        return splits, ids, np.zeros([0], np.float32) if weights is None else weights, np.array([batch], np.int64)
    shape = [batch] if kind == "sparse" else [batch, rng.randint(1, 3)]
    n = rng.randint(0, 6) if batch else 0
    coords = [[rng.randrange(d) for d in shape] + [rng.randrange(4)] for _ in range(n)]
    indices = np.array(coords, np.int64).reshape([n, len(shape) + 1])
    ids = np.array([rng.randrange(vocab) for _ in range(n)], np.int64)
    weights = np.array([rng.uniform(0, 2) for _ in range(n)], np.float32) if rng.random() < 0.3 else np.zeros([0])
    return indices, ids, weights.astype(np.float32), np.array(shape, np.int64)


def corrupt(call: dict, rng: random.Random) -> tuple[str, bool]:
    """Applies one corruption; returns its name and whether the call is then certainly invalid."""
    f = rng.randrange(len(call["features"]))
    splits, ids, weights, shape = call["features"][f]
    # An earlier corruption may have changed the dtypes; the range corruptions below write int64 values.
    splits, ids = splits.astype(np.int64), ids.astype(np.int64)
    vocab = TABLES[FEATURES[f][1]][1]
    choice = rng.randrange(13)
    certain = False
    if choice == 0 and splits.ndim == 1 and splits.size > 1:
        i = rng.randrange(splits.size)
        splits = splits.copy()
        splits[i] = rng.choice(HUGE + [ids.size + 1, ids.size + 2])
        certain = splits[i] < 0 or splits[i] > ids.size
        name = "row_split"
    elif choice == 1 and splits.size:
        splits = splits.copy().reshape(-1)
        splits[rng.randrange(splits.size)] = rng.choice(HUGE + [0, 1, 5])
        splits = splits.reshape(call["features"][f][0].shape)  # (a copy: astype above)
        name = "splits_entry"
    elif choice == 2:
        splits = rng.choice(
            [
                np.zeros([2, 3, 1], np.int64),
                np.zeros([1], np.int64),
                np.zeros([0, 2], np.int64),
                np.arange(rng.randint(1, 9), dtype=np.int64).reshape([-1, 1]),
            ]
        )
        name = "splits_shape"
    elif choice == 3 and ids.size:
        ids = ids.copy()
        ids[rng.randrange(ids.size)] = rng.choice([vocab, -1, 2**62, -(2**63)])
        certain = True
        name = "id_range"
    elif choice == 4:
        ids = np.concatenate([ids, np.array([rng.randrange(vocab)], np.int64)])
        name = "extra_id"
    elif choice == 5:
        weights = np.ones([rng.choice([1, ids.size + 1, 7])], np.float32)
        name = "weights_count"
    elif choice == 6:
        shape = np.array(rng.choice([[2**40], [2**62, 2**62], [-1], [3, -2], [], [0, 2**63 - 1], [1, 1, 1]]), np.int64)
        name = "sample_shape"
    elif choice == 7:
        call["grads"][f] = np.ones(rng.choice([[1], [0, 3], [2, 2, 2], [5, 4]]), np.float32)
        name = "gradient_shape"
    elif choice == 8:
        g = call["grads"][f].copy()
        if g.size:
            g.reshape(-1)[rng.randrange(g.size)] = rng.choice([np.nan, np.inf, -np.inf])
        call["grads"][f] = g
        name = "gradient_value"
    elif choice == 9:
        call["lrs"] = rng.choice([[-0.1], [float("nan")], [float("inf")], [-float("inf")], [], [0.1, 0.1]])
        call["bad_learning_rate"] = len(call["lrs"]) == 1  # certainly invalid for the send op (the forward has none)
        name = "learning_rate"
    elif choice == 10:
        call["combiners"] = rng.choice([["mean"], ["sum", "max"], ["sum"] * 4, ["sqrtn", "mean", "sum"]])
        name = "combiners"
    elif choice == 11:
        which = rng.randrange(5)
        if which < 2:
            call["tables"][which] = rng.choice(call["wrong"])
        elif which == 2:
            call["slots"][1] = call["slots"][1][:1]
        elif which == 3:
            call["slots"][1] = [call["slots"][1][0], call["slots"][1][0]]
        else:
            call["slots"][0] = [rng.choice(call["wrong"])]
        name = "variables"
    else:
        splits = splits.astype(np.int32) if rng.random() < 0.5 else splits
        ids = ids.astype(rng.choice([np.int32, np.float32, np.uint64]))
        name = "dtype"
    call["features"][f] = (splits, ids, weights, shape)
    return name, certain


def still_certainly_invalid(call: dict, forward: bool) -> bool:
    """Whether the call, after all its corruptions, still has a property the ops must refuse: a row split outside
    [0, number of ids] or an id outside the vocabulary (int64 inputs: a cast may wrap a value back into range), or,
    for the send op, a bad learning rate. A later corruption can undo an earlier one (a split set out of range,
    then set to 1 again), so a corruption's own verdict is confirmed against the final call."""
    for f, (splits, ids, _, _) in enumerate(call["features"]):
        if splits.dtype != np.int64 or ids.dtype != np.int64:
            continue
        if splits.ndim == 1 and splits.size > 1 and (np.any(splits < 0) or np.any(splits > ids.size)):
            return True
        if ids.size and (np.any(ids < 0) or np.any(ids >= TABLES[FEATURES[f][1]][1])):
            return True
    return not forward and bool(call.get("bad_learning_rate", False))


def make_call(state: State, rng: random.Random) -> dict:
    features, grads = [], []
    for _, table_id, _ in FEATURES:
        _, vocab, dim, _, _ = TABLES[table_id]
        feature = _valid_feature(rng, vocab)
        features.append(feature)
        grads.append(
            np.array([rng.uniform(-1, 1) for _ in range(int(np.prod(feature[3])) * dim)], np.float32).reshape(
                list(feature[3]) + [dim]
            )
        )
    return {
        "features": features,
        "grads": grads,
        "lrs": [rng.choice([0.0, 0.01, 0.5])],
        "combiners": rng.choice([None, ["sum", "mean"], ["sqrtn", "sum", "mean"]]),
        "tables": list(state.tables),
        "slots": [list(s) for s in state.slots],
        "wrong": state.wrong,
        "check_numerics": rng.random() < 0.3,
    }


def run_call(call: dict, config: bytes, forward: bool) -> None:
    """One op call; `call["rounding_kwargs"]` (the low_precision target's) go to the send op."""
    feats = [eo.FeatureInput(*f) for f in call["features"]]
    if forward:
        eo.embedding_activations(feats, call["tables"], config, call["combiners"])
    else:
        eo.send_tpu_embedding_gradients(
            call["grads"],
            call["lrs"],
            feats,
            call["tables"],
            call["slots"],
            config,
            call["combiners"],
            check_numerics=call["check_numerics"],
            **call.get("rounding_kwargs", {}),
        )


def run(seconds: float, seed: int = 0, max_inputs: int | None = None) -> Report:
    rng = random.Random(seed)
    state = State(np.random.default_rng(seed))

    def one_input(index: int, report: Report) -> tuple[list, bool]:
        if index % 500 == 0:
            state.reset(np.random.default_rng(index))
        call = make_call(state, rng)
        names, certain = [], False
        for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
            name, sure = corrupt(call, rng)
            names.append(name)
            certain = certain or sure
        forward = rng.random() < 0.4
        certain = certain or (not forward and call.get("bad_learning_rate", False))
        certain = certain and "dtype" not in names  # a cast may wrap an out-of-range value back into range
        certain = certain and still_certainly_invalid(call, forward)
        fn = functools.partial(run_call, call, state.config, forward)
        # The forward op never writes a variable: it is checked as read-only.
        return names, check_call(report, fn, state.snapshot, names, certain, forward, EXPECTED)

    return drive("ops", seconds, seed, max_inputs, one_input)
