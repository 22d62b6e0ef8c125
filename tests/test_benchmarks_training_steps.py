"""The benchmarks' training steps of ours return nothing yet still run their forward op.

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


def _steps():
    w1, w4 = wls.w1(smoke=True), wls.w4(smoke=True)
    wl, keys, vocab_keys = dyn.make_workload(smoke=True)
    return {
        "static W1 sgd": (lambda: ours.fused_step(w1, "sgd"), "EmbeddingActivations"),
        "static W4 adam": (lambda: ours.fused_step(w4, "adam"), "EmbeddingActivations"),
        "bf16 W1 adagrad": (lambda: lp.fused_step(w1, "adagrad", tf.bfloat16, "stochastic"), "EmbeddingActivations"),
        "dynamic W1 sgd": (lambda: dyn.dynamic_step(wl, keys, vocab_keys, "sgd"), "DynamicEmbeddingActivations"),
    }


@pytest.mark.parametrize("name", list(_steps()))
def test_a_training_step_returns_nothing_and_runs_its_forward_op_as_a_control_output(name):
    make, forward = _steps()[name]
    step = make()
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
