"""Concurrency of the dynamic-table ops: concurrent training steps lose nothing, and results are bitwise the same
at 1 and 2 intra-op threads (each process fixes its own pool size)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from dynamic_ops_test_util import DIGEST_SCRIPT_START, digest_in_subprocess, int_feature, make_config, new_table, schema

from tf_embed_ops.dynamic import ops as dyn

DIM = 4


def test_concurrent_lookup_and_update_steps_lose_nothing():
    # Two threads train one SGD table (lr 1, zeros initializer) with integer gradients: every float is exact, so
    # the result does not depend on the interleaving and must be minus the sum of all gradients, key by key.
    # Each step brings new keys, so inserts (which grow the table) race with the other thread's updates.
    h = new_table(DIM, max_rows=100000, initial_capacity=1, rows_per_chunk=16)
    config = make_config(
        [{"name": "t", "vocab": 100000, "dim": DIM, "schema": schema("stochastic_gradient_descent"), "lr": 1.0}],
        [("f", 0)],
    )
    steps, per_step = 40, 64
    expected = {}
    plans = []
    for worker in range(2):
        rng = np.random.default_rng(worker)
        plan = []
        for s in range(steps):
            keys = np.concatenate(
                [rng.integers(0, 50, per_step // 2), rng.integers(1000 * s, 1000 * s + 200, per_step // 2)]
            )
            grads = rng.integers(-3, 4, (per_step, DIM)).astype(np.float32)
            for k, g in zip(keys, grads, strict=True):
                expected[int(k)] = expected.get(int(k), np.zeros(DIM, np.float32)) - g
            plan.append((s, keys, grads))
        plans.append(plan)
    errors = []

    def train(plan):
        try:
            for s, keys, grads in plan:
                feature = int_feature("dense", [[int(k)] for k in keys])
                dyn.dynamic_embedding_activations([feature], [h], s, config, training=True)
                dyn.dynamic_send_tpu_embedding_gradients([grads], [], [feature], [h], s, config)
        except Exception as e:  # reported below, on the main thread
            errors.append(e)

    threads = [threading.Thread(target=train, args=(p,)) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    c = dyn.dynamic_table_export(h)
    keys = sorted(expected)
    np.testing.assert_array_equal(c.keys.numpy(), keys)
    np.testing.assert_array_equal(c.weights.numpy(), np.stack([expected[k] for k in keys]))
    stats = dyn.dynamic_table_stats(h)
    assert int(stats.size) == int(stats.inserts) == len(keys)


_SCRIPT = (
    DIGEST_SCRIPT_START
    + r"""
for kind, overrides, options in (("adagrad_momentum", {"momentum": 0.9, "use_nesterov": True}, {}),
                                 ("adam", {"lazy_adam": False}, {}),
                                 ("ftrl", {"l1_regularization_strength": 0.01}, {"gradient_clip": (-0.3, 0.3)}),
                                 ("stochastic_gradient_descent", {}, {"weight_decay": 0.01})):
    s = schema(kind)
    config = make_config([{"name": "t", "vocab": 1 << 20, "dim": dim, "schema": s, "overrides": overrides,
                           "options": options, "lr": 0.05}], [("a", 0), ("b", 0)])
    h = new_table(dim, [x.default_initial_value for x in s.slots], max_rows=1 << 20, initial_capacity=1024,
                  initializer="normal", initializer_params=[0.0, 0.5])
    for step in range(2):
        a = int_feature("dense", [[int(k)] for k in rng.zipf(1.1, n) * 7919])
        lengths = rng.integers(0, 8, n // 4)
        b = int_feature("ragged", [list(rng.integers(-(2**40), 2**40, m)) for m in lengths],
                        [list(rng.normal(size=m)) for m in lengths])
        acts = dyn.dynamic_embedding_activations([a, b], [h], step, config, ["sqrtn"], training=True)
        out += [x.numpy().tobytes() for x in acts]
        grads = [rng.normal(size=x.shape).astype(np.float32) for x in acts]
        dyn.dynamic_send_tpu_embedding_gradients(grads, [], [a, b], [h], step, config, ["sqrtn"])
    c = dyn.dynamic_table_export(h, len(s.slots))
    out += [t.numpy().tobytes() for t in (*c[:2], *c.slots, *c[3:])]
print(hashlib.sha256(b"".join(out)).hexdigest())
"""
)


@pytest.mark.slow
def test_one_and_two_threads_give_bitwise_identical_tables():
    assert digest_in_subprocess(_SCRIPT, 1) == digest_in_subprocess(_SCRIPT, 2)
