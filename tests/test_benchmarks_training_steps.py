"""Our training steps in the benchmarks return nothing, yet still run their forward op, and hold their data.

A step returns nothing, as the speed-of-light kernel's step run by TensorFlow does; its forward op must then stay
in the function as a control output, or every figure over it would time a step without its lookup. Its features
and gradients are constants of its graph, as the kernel steps on data it holds: a captured eager tensor would be
handed to the function at every call.
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


@pytest.mark.parametrize("name", STEPS)
def test_a_training_step_is_handed_only_its_state_at_each_call(name):
    step, _ = _step(name)
    captured = step.get_concrete_function().captured_inputs
    assert captured, name
    handed = [t.dtype.name for t in captured if t.dtype != tf.resource]
    assert not handed, f"{name}: tensors handed to the step at each call: {handed}"


def test_the_serving_lookup_is_handed_its_features_at_each_call():
    step = ours.lookup_step(wls.w4(smoke=True))
    handed = [t for t in step.get_concrete_function().captured_inputs if t.dtype == tf.int64]
    assert handed, "the lookup's features should come from outside, as a request's do"


def test_a_static_step_still_updates_its_tables():
    step = ours.fused_step(wls.w4(smoke=True), "adagrad")
    before = [t.numpy() for t in step.state[0]]
    step()
    moved = [float(np.max(np.abs(t.numpy() - b))) for t, b in zip(step.state[0], before, strict=True)]
    assert all(m > 0 for m in moved), moved
