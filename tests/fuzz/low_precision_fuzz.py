"""16-bit fuzzer: the fused ops over bfloat16 / float16 tables and slots (the `ops` target's batches and
corruptions, plus the rounding arguments: `rounding`, `rounding_step`, `rounding_seed`), and `te.TPUEmbedding`
with 16-bit `te.TableConfig`s (stochastic and nearest rounding) fed corrupted training steps and lookups.

Checks per call, as the other targets: no crash or hang; a rejection is a documented error and leaves every
table, slot and the rounding-step counter bitwise unchanged; a lookup changes nothing; certainly invalid input
(an out-of-range id, a bad learning rate, a rounding step < 0 or outside int64, a seed outside int64, an unknown
rounding) is never accepted.
"""

from __future__ import annotations

import random

import numpy as np
import tensorflow as tf

import tf_embed_ops as te

from . import _front, ops_fuzz
from ._harness import Report, check_call, drive

_emb = tf.tpu.experimental.embedding
FEATURES = {"b": (16, 4, "static"), "h": (12, 2, "static")}
DTYPES = (tf.bfloat16, tf.float16)


class _State16(ops_fuzz.State):
    def __init__(self, rng: np.random.Generator):
        super().__init__(rng)
        picks = np.random.default_rng(int(rng.integers(1 << 30)))
        self.dtypes = [DTYPES[int(picks.integers(2))] for _ in self.tables]
        self.tables = [tf.Variable(tf.cast(t, dtype)) for t, dtype in zip(self.tables, self.dtypes, strict=True)]
        self.slots = [[tf.Variable(tf.cast(s, DTYPES[int(picks.integers(2))])) for s in per] for per in self.slots]


def _rounding(call: dict, rng: random.Random) -> tuple[str, bool]:
    choice = rng.randrange(4)
    if choice == 0:
        call["rounding"] = rng.choice([["up", "nearest"], ["nearest"], ["nearest"] * 3, ["", ""]])
        return "rounding", True
    if choice == 1:
        step = rng.choice([-1, -(2**63), 2**63, 2**64, tf.constant(-2, tf.int64), np.array([1, 2]), 1.5, None])
        call["rounding_step"] = step
        stochastic = "stochastic" in call["rounding"]
        certain = step is not None or stochastic
        if isinstance(step, np.ndarray):
            certain = True
        return "rounding_step", certain
    if choice == 2:
        call["rounding_seed"] = rng.choice([2**64, 2**63, -(2**63) - 1, 1.5, True, "1"])
        return "rounding_seed", True
    call["rounding"] = ["stochastic", "stochastic"]
    call["rounding_step"] = None
    return "stochastic_without_step", True


def _rounding_invalid(call: dict, state: _State16) -> bool:
    """Whether the final call's rounding arguments are ones the send op must refuse."""
    rounding, step, seed = call["rounding"], call["rounding_step"], call["rounding_seed"]
    if len(rounding) != len(state.tables) or any(r not in ("stochastic", "nearest") for r in rounding):
        return True
    if not isinstance(seed, int) or isinstance(seed, bool) or not -(2**63) <= seed < 2**63:
        return True
    if step is None:
        return "stochastic" in rounding
    if isinstance(step, tf.Tensor):
        return int(step.numpy()) < 0
    return not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2**63


def _op_input(state: _State16, rng: random.Random) -> tuple[callable, list[str], bool, bool]:
    call = ops_fuzz.make_call(state, rng)
    call["rounding"] = [rng.choice(["stochastic", "nearest"]) for _ in state.tables]
    call["rounding_step"] = rng.randrange(0, 2**62)
    call["rounding_seed"] = rng.randrange(-(2**63), 2**63)
    names, certain = [], False
    for _ in range(rng.choice([0, 1, 1, 2])):
        name, sure = ops_fuzz.corrupt(call, rng) if rng.random() < 0.6 else _rounding(call, rng)
        names.append(name)
        certain = certain or sure
    forward = rng.random() < 0.3
    if forward:
        # The forward op takes no rounding argument and no learning rate: only the feature corruptions count.
        certain = any(n in ("row_split", "id_range") for n in names) and "dtype" not in names
    else:
        certain = certain or call.get("bad_learning_rate", False)
        certain = certain and "dtype" not in names  # a cast may wrap an out-of-range value back into range
        # A later corruption can undo an earlier one (a bad step replaced by None with nearest rounding): the
        # verdict is confirmed against the final call.
        certain = certain and (ops_fuzz.still_certainly_invalid(call, forward) or _rounding_invalid(call, state))

    call["rounding_kwargs"] = {k: call[k] for k in ("rounding", "rounding_step", "rounding_seed")}

    def run():
        ops_fuzz.run_call(call, state.config, forward)

    return run, names, certain, forward


def _embedding(rng: random.Random):
    tables = {
        n: te.TableConfig(
            v,
            d,
            name=n,
            storage_dtype=rng.choice(DTYPES),
            slot_storage_dtype=rng.choice([None, tf.float32, *DTYPES]),
            rounding=rng.choice(["stochastic", "nearest"]),
            initializer=tf.random_uniform_initializer(-1, 1, seed=1),
        )
        for n, (v, d, _) in FEATURES.items()
    }
    features = {n: _emb.FeatureConfig(t, name=n) for n, t in tables.items()}
    emb = te.TPUEmbedding(features, te.optimizers.Adam(0.05), check_numerics=True)
    emb.build(_front.BATCH)
    return emb


def run(seconds: float, seed: int = 0, max_inputs: int | None = None) -> Report:
    rng = random.Random(seed)
    state = _State16(np.random.default_rng(seed))
    emb = _embedding(rng)

    def one_input(index: int, report: Report) -> tuple[list, bool]:
        kind = rng.random()
        if kind < 0.35:
            call, names, certain = _front.make_step(FEATURES, rng)
            report.bump("front_step")
            return names, _front.run_step(emb, call, report, names, certain)
        if kind < 0.45:
            call, names, _ = _front.make_step(FEATURES, rng)
            report.bump("front_lookup")
            return names, _front.run_lookup(emb, call, report, names)
        if index % 500 == 0:
            state.reset(np.random.default_rng(index))
        fn, names, certain, forward = _op_input(state, rng)
        return names, check_call(report, fn, state.snapshot, names, certain, forward, ops_fuzz.EXPECTED)

    return drive("low_precision", seconds, seed, max_inputs, one_input)
