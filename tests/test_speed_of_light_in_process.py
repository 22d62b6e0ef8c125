"""The speed-of-light kernel stepping in this process (benchmarks/speed_of_light.py's InProcessKernel): the
headline's ceiling of ours over the kernel times its step as a TensorFlow op against its step called directly, so
both must do exactly the binary's step. Compiles and runs the kernel and its op: the slow tier.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.benchmarks_import import import_benchmark as _import

pytestmark = pytest.mark.slow

sol = _import("speed_of_light")
workloads = _import("workloads")


@pytest.fixture(scope="module")
def w4():
    """A multi-table workload at smoke size (bags, tables of several sizes)."""
    return workloads.WORKLOADS["W4"](smoke=True)


def _init(wl) -> list[np.ndarray]:
    return [
        np.random.default_rng(t).normal(size=(tb.vocab, tb.dim)).astype(np.float32) for t, tb in enumerate(wl.tables)
    ]


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("through", ["ctypes", "tensorflow", "tensorflow_in_halves"])
def test_the_in_process_kernel_ends_where_the_binary_does(w4, optimizer, through):
    init = _init(w4)
    expected = sol.final_tables(w4, optimizer, init, steps=3)
    kernel = sol.InProcessKernel(w4, optimizer, warmup=0, init=init)
    try:
        if through == "ctypes":
            step = kernel.step
        else:
            step = kernel.tensorflow_step(halves=through == "tensorflow_in_halves")
        for _ in range(3):
            step()
        got = [kernel.table(t) for t in range(len(w4.tables))]
    finally:
        kernel.close()
    assert any(not np.array_equal(g, i) for g, i in zip(got, init, strict=True))  # the steps did update
    for t, (e, g) in enumerate(zip(expected, got, strict=True)):
        np.testing.assert_array_equal(g, e, err_msg=f"table {t}")


def test_the_in_process_bf16_kernel_ends_where_the_binary_does(w4):
    init = _init(w4)
    expected = sol.final_tables(w4, "adagrad", init, steps=2, storage="bf16")
    kernel = sol.InProcessKernel(w4, "adagrad", warmup=0, init=init, storage="bf16")
    try:
        kernel.step()
        kernel.step()
        got = [kernel.table(t) for t in range(len(w4.tables))]
    finally:
        kernel.close()
    for t, (e, g) in enumerate(zip(expected, got, strict=True)):
        np.testing.assert_array_equal(g, e, err_msg=f"table {t}")


@pytest.mark.parametrize("key_index", ["wide", "compact"])
def test_the_in_process_keyed_kernel_ends_where_the_binary_does(key_index):
    # Keyed (a dynamic table's step): each id's key is found through the kernel's hash index, then the same step,
    # so both index layouts end where the step on the ids does.
    w1 = workloads.WORKLOADS["W1"](smoke=True)
    init = _init(w1)
    keys = [np.random.default_rng(7).permutation(w1.tables[0].vocab).astype(np.int64) * 1_000_003 - 5_000]
    expected = sol.final_tables(w1, "adagrad", init, steps=2, keys=keys, key_index=key_index)
    kernel = sol.InProcessKernel(w1, "adagrad", warmup=0, init=init, keys=keys, key_index=key_index)
    try:
        kernel.step()
        kernel.step()
        got = kernel.table(0)
    finally:
        kernel.close()
    assert not np.array_equal(got, init[0])
    np.testing.assert_array_equal(got, expected[0])
    np.testing.assert_array_equal(got, sol.final_tables(w1, "adagrad", init, steps=2)[0])


def test_an_in_process_lookup_changes_no_table(w4):
    init = _init(w4)
    kernel = sol.InProcessKernel(w4, sol.LOOKUP, warmup=2, init=init)
    kernel.step()
    for t, table in enumerate(init):
        np.testing.assert_array_equal(kernel.table(t), table, err_msg=f"table {t}")
    kernel.close()


def test_the_in_process_kernel_refuses_bad_arguments_by_name(w4):
    with pytest.raises(ValueError, match="optimizers.*ftrl"):
        sol.InProcessKernel(w4, "ftrl")
    with pytest.raises(ValueError, match="warmup.*-1"):
        sol.InProcessKernel(w4, "sgd", warmup=-1)
    with pytest.raises(ValueError, match="init: shapes"):
        sol.InProcessKernel(w4, "sgd", init=[np.zeros((2, 2), np.float32)])
    with pytest.raises(ValueError, match="storage: 'fp16'"):
        sol.InProcessKernel(w4, "sgd", storage="fp16")
    with pytest.raises(ValueError, match="keys: shapes"):
        sol.InProcessKernel(w4, "sgd", keys=[np.arange(3)])
    with pytest.raises(ValueError, match="key_index: 'tall'"):
        sol.InProcessKernel(w4, "sgd", key_index="tall")
    kernel = sol.InProcessKernel(w4, "sgd", warmup=0)
    with pytest.raises(ValueError, match="table: 8 is not one of the workload's 8 tables"):
        kernel.table(len(w4.tables))
    kernel.close()
    kernel.close()  # idempotent
    with pytest.raises(RuntimeError, match="step after close"):
        kernel.step()


def test_the_in_process_bf16_kernel_in_halves_ends_where_its_whole_steps_do(w4):
    # bf16's stochastic rounding keys on the step number: the backward half must count the step once.
    init = _init(w4)
    expected = sol.final_tables(w4, "adam", init, steps=3, storage="bf16")
    kernel = sol.InProcessKernel(w4, "adam", warmup=0, init=init, storage="bf16")
    try:
        step = kernel.tensorflow_step(halves=True)
        for _ in range(3):
            step()
        got = [kernel.table(t) for t in range(len(w4.tables))]
    finally:
        kernel.close()
    for t, (e, g) in enumerate(zip(expected, got, strict=True)):
        np.testing.assert_array_equal(g, e, err_msg=f"table {t}")


@pytest.mark.parametrize("op_name", ["speed_of_light_step", "speed_of_light_forward", "speed_of_light_backward"])
def test_the_kernels_ops_refuse_a_state_that_is_not_open(w4, op_name):
    import tensorflow as tf

    kernel = sol.InProcessKernel(w4, "sgd", warmup=0)
    op = getattr(kernel._ops, op_name)
    with pytest.raises(tf.errors.InvalidArgumentError, match="state must be an open kernel state"):
        op(tf.constant(0, tf.int64))
    kernel.close()
    with pytest.raises(RuntimeError, match="tensorflow_step after close"):
        kernel.tensorflow_step()
