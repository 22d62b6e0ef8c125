"""Front-end fuzzing shared by the `dynamic` and `low_precision` targets: `te.TPUEmbedding` training steps
(`enqueue` / `dequeue` / `apply_gradients`) and lookups fed valid batches with 0-2 corruptions each.

A step is three calls; each is checked on its own: if one is rejected, the whole state (every static table,
slot and `rounding_step`, every dynamic table's export and step) must be bitwise what it was just before that
call. A lookup (inference) must never change anything.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import tensorflow as tf

from ._harness import bits, check_call

BATCH = 4
EXPECTED = (tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError, ValueError, TypeError, RuntimeError)


def snapshot(emb) -> list[bytes]:
    """Every byte of the embedding's state."""
    out = []
    for table, var in sorted(emb.embedding_tables.items(), key=lambda kv: kv[0].name):
        out.append(bits(var.numpy()))
        for _, slot in sorted(emb.slot_variables.get(table, {}).items()):
            out.append(bits(slot.numpy()))
    step = getattr(emb, "_rounding_step", None)
    if step is not None:
        out.append(bits(step.numpy()))
    for _, table in sorted(emb.dynamic_tables.items(), key=lambda kv: kv[0].name):
        out.extend(bits(v.numpy()) for _, v in sorted(table.export().items()))
        out.append(bits(table.step.numpy()))
    return out


def _ids(rng: random.Random, vocab: int, batch: int, string: bool):
    if string:
        return tf.constant([f"k{rng.randrange(vocab * 2)}" for _ in range(batch)], tf.string)
    return tf.constant([rng.randrange(vocab) for _ in range(batch)], tf.int64)


def make_step(features: dict, rng: random.Random) -> tuple[dict, list[str], bool]:
    """A batch for `features` ({name: (vocab, dim, key kind: "static" | "int" | "string")}) with corruptions.

    Returns the call (ids, weights, gradient shapes, check_numerics, gradient poison), the corruption names and
    whether the call is certainly invalid."""
    batch = BATCH  # the embeddings are built for it: the first batch fixes a static feature's input shape
    call = {
        "ids": {n: _ids(rng, v, batch, kind == "string") for n, (v, _, kind) in features.items()},
        "weights": None,
        "grad_shapes": {n: [batch, d] for n, (_, d, _) in features.items()},
        "poison": None,
        "check_numerics": True,  # the fuzzed embeddings are built with check_numerics=True
    }
    names, certain = [], False
    for _ in range(rng.choice([0, 1, 1, 2])):
        name = rng.choice(sorted(features))
        vocab, dim, kind = features[name]
        choice = rng.randrange(8)
        if choice == 0 and kind == "static" and batch:
            call["ids"][name] = tf.constant([vocab] + [0] * (batch - 1), tf.int64)
            names.append("id_out_of_range")
            certain = True
        elif choice == 1:
            call["ids"][name] = tf.constant([0.5] * batch, tf.float32)
            names.append("float_ids")
            certain = batch > 0
        elif choice == 2 and kind != "string":
            call["ids"][name] = tf.constant(["a"] * batch)
            names.append("string_ids")
            certain = kind == "static" or batch > 0
        elif choice == 3:
            call["ids"][name] = tf.constant(rng.choice([[[1, 2]], [[[1]]], 3]), tf.int64)
            names.append("ids_rank")
        elif choice == 4:
            call["grad_shapes"][name] = rng.choice([[batch + 1, dim], [batch, dim + 1], [batch], []])
            names.append("gradient_shape")
            certain = True
        elif choice == 5:
            call["poison"] = (name, rng.choice([np.nan, np.inf, -np.inf]))
            names.append("gradient_value")
            certain = call["check_numerics"] and batch > 0
        elif choice == 6:
            ragged = tf.RaggedTensor.from_row_lengths(tf.constant([0] * batch, tf.int64), [1] * batch)
            call["ids"][name] = ragged if kind != "string" else ragged.with_flat_values(tf.constant(["a"] * batch))
            call["weights"] = {n: None for n in features}
            call["weights"][name] = tf.RaggedTensor.from_row_lengths(tf.ones([batch + 1]), [1] * batch + [1])
            names.append("weights_mismatch")
            certain = True
        else:
            call["ids"][name] = tf.constant([-(2**63), 2**63 - 1][: max(batch, 1)], tf.int64)
            names.append("huge_ids")
            certain = kind == "static"
    return call, names, certain


def run_step(emb, call: dict, report, names: list[str], certain: bool) -> bool:
    """Runs one training step call by call; returns whether every call was accepted."""
    calls = [
        ("enqueue", lambda: emb.enqueue(call["ids"], call["weights"], training=True)),
        ("dequeue", emb.dequeue),
        ("apply_gradients", lambda: emb.apply_gradients(_gradients(call))),
    ]
    for what, fn in calls:
        before = snapshot(emb)
        try:
            fn()
        except EXPECTED:
            if snapshot(emb) != before:
                report.fail(f"a rejected {what} changed the state", names)
            _drain(emb)
            return False
        except Exception as e:
            report.fail(f"{what}: {type(e).__name__}: {e}", names)
            _drain(emb)
            return False
    if certain:
        report.fail("certainly invalid front-end input was accepted", names)
    return True


def run_lookup(emb, call: dict, report, names: list[str]) -> bool:
    """An inference lookup: may be accepted or rejected, must change nothing either way."""
    fn = functools.partial(emb.embedding_lookup, call["ids"], call["weights"])
    return check_call(report, fn, functools.partial(snapshot, emb), names, False, True, EXPECTED)


def _gradients(call: dict) -> dict:
    grads = {n: tf.ones(shape) * 0.25 for n, shape in call["grad_shapes"].items()}
    if call["poison"] is not None:
        name, value = call["poison"]
        g = grads[name].numpy()
        if g.size:
            g.reshape(-1)[0] = value
        grads[name] = tf.constant(g)
    return grads


def _drain(emb) -> None:
    """Drops a batch a failed step left queued, so the next step starts clean."""
    emb._pending.batch = None
