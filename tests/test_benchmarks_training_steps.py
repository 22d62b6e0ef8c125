"""Our training steps in the benchmarks return nothing, yet still run their forward op.

A step returns nothing, as the speed-of-light kernel's step run by TensorFlow does; its forward op must then stay
in the function as a control output, or every figure over it would time a step without its lookup.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.benchmarks_import import import_benchmark as _import

ours = _import("ours")
wls = _import("workloads")
lp = _import("low_precision_benchmark")
dyn = _import("dynamic_benchmark")


STEPS = ("static W1 sgd", "static W4 adam", "bf16 W1 adagrad", "dynamic W1 sgd")


def _step(name: str):
    """(the step called ``name``, the type of its forward op)."""
    w1 = wls.w1(smoke=True)
    if name == "static W1 sgd":
        return ours.fused_step(w1, "sgd"), "EmbeddingActivations"
    if name == "static W4 adam":
        return ours.fused_step(wls.w4(smoke=True), "adam"), "EmbeddingActivations"
    if name == "bf16 W1 adagrad":
        return lp.fused_step(w1, "adagrad", tf.bfloat16, "stochastic"), "EmbeddingActivations"
    wl, keys, vocab_keys = dyn.make_workload(smoke=True)
    return dyn.dynamic_step(wl, keys, vocab_keys, "sgd"), "DynamicEmbeddingActivations"


@pytest.mark.parametrize("name", STEPS)
def test_a_training_step_returns_nothing_and_runs_its_forward_op_as_a_control_output(name):
    step, forward = _step(name)
    graph = step.get_concrete_function().graph
    ran = [op.type.split(">")[-1] for op in graph.control_outputs]
    assert forward in ran, f"{name}: the forward op is not run by the step (control outputs {ran})"
    assert any("SendTPUEmbeddingGradients" in t for t in ran), ran
    assert step() is None


def test_a_static_step_still_updates_its_tables():
    step = ours.fused_step(wls.w4(smoke=True), "adagrad")
    before = [t.numpy() for t in step.state[0]]
    step()
    moved = [float(np.max(np.abs(t.numpy() - b))) for t, b in zip(step.state[0], before, strict=True)]
    assert all(m > 0 for m in moved), moved
