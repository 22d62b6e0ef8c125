"""Blocking, FIFO service, cancellation, timeouts and thread safety of the sparse accumulator
(docs/sparse_accumulator.md, "Semantics")."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tf_embed_ops.sparse_accumulator import SparseConditionalAccumulator


def _thread(fn, *args):
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def _cancelled_errors(blocking, cancel) -> list:
    """Runs `blocking` on a thread, calls `cancel` once it has blocked (0.3 s) and returns the `CancelledError`s it
    raised, after its thread has ended."""
    errors = []

    def run():
        try:
            blocking()
        except tf.errors.CancelledError as e:
            errors.append(e)

    t = _thread(run)
    time.sleep(0.3)
    cancel()
    t.join(20.0)
    assert not t.is_alive()
    return errors


def _wait_until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


# --- TensorFlow's threaded tests (sparse_conditional_accumulator_test.py), graph mode ----------------------


@pytest.mark.parametrize("reduction_type,expected", [("MEAN", 55.0), ("SUM", 550.0)])
def test_parallel_apply_graph(reduction_type, expected):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        acc = SparseConditionalAccumulator(tf.float32, shape=[2, 2], reduction_type=reduction_type)
        elems = [10.0 * x for x in range(1, 11)]
        applies = [acc.apply_grad([0, 1], [[x, 0.0], [0.0, x]], grad_shape=[2, 2]) for x in elems]
        take = acc.take_grad(10, timeout=30.0)
        threads = [_thread(sess.run, op) for op in applies]
        for t in threads:
            t.join()
        indices, values, shape = sess.run(take)
        np.testing.assert_array_equal(indices, [0, 1])
        np.testing.assert_allclose(values, [[expected, 0], [0, expected]])
        np.testing.assert_array_equal(shape, [2, 2])


def test_parallel_take_serves_waiters_in_arrival_order_graph():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        acc = SparseConditionalAccumulator(tf.float32, shape=[2, 2])
        step = tf.compat.v1.placeholder(tf.int64, [])
        value = tf.compat.v1.placeholder(tf.float32, [])
        apply_op = acc.apply_grad([0], tf.reshape(tf.stack([value, 0.0]), [1, 2]), local_step=step)
        takes = [acc.take_grad(1, timeout=30.0) for _ in range(10)]
        results = {}

        def run_take(i):
            results[i] = sess.run(takes[i])

        threads = []
        for i in range(10):  # queue the takes one after the other, so arrival order is known
            threads.append(_thread(run_take, i))
            time.sleep(0.05)
        for i in range(10):
            sess.run(apply_op, {step: i, value: 10.0 * (i + 1)})
            _wait_until(lambda i=i: i in results)
        for t in threads:
            t.join()
        for i in range(10):
            np.testing.assert_allclose(results[i].values, [[10.0 * (i + 1), 0.0]])


def test_apply_and_blocking_take_graph():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        acc = SparseConditionalAccumulator(tf.float32, shape=[2, 2])
        applies = [acc.apply_grad([0], [[float(x), 0.0]]) for x in (10, 20, 30)]
        take = acc.take_grad(3, timeout=30.0)
        result = {}
        t = _thread(lambda: result.setdefault("out", sess.run(take)))
        for op in applies:
            time.sleep(0.1)
            assert "out" not in result
            sess.run(op)
        t.join()
        np.testing.assert_allclose(result["out"].values, [[20.0, 0.0]])


def test_session_close_cancels_blocked_take():
    graph = tf.Graph()
    with graph.as_default():
        acc = SparseConditionalAccumulator(tf.float32)
        take = acc.take_grad(1)
    sess = tf.compat.v1.Session(graph=graph)
    errors = _cancelled_errors(lambda: sess.run(take), sess.close)
    assert len(errors) == 1 and "TakeGrad operation was cancelled" in str(errors[0])


def test_run_options_timeout_leaves_state_intact():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        acc = SparseConditionalAccumulator(tf.float32, reduction_type="SUM")
        sess.run(acc.apply_grad([0], [[2.0]]))
        options = tf.compat.v1.RunOptions(timeout_in_ms=200)
        with pytest.raises(tf.errors.DeadlineExceededError):
            sess.run(acc.take_grad(2), options=options)
        assert sess.run(acc.num_accumulated()) == 1
        sess.run(acc.apply_grad([0], [[3.0]], local_step=0))  # step still 0: not stale
        np.testing.assert_allclose(sess.run(acc.take_grad(2, timeout=30.0)).values, [[5.0]])


# --- eager ---------------------------------------------------------------------------------------------------


def test_eager_timeout_leaves_state_intact():
    acc = SparseConditionalAccumulator(tf.float32, reduction_type="SUM")
    acc.apply_grad([0], [[2.0]])
    start = time.monotonic()
    with pytest.raises(tf.errors.DeadlineExceededError, match="timed out after 0.2"):
        acc.take_grad(2, timeout=0.2)
    assert 0.15 < time.monotonic() - start < 10.0
    assert int(acc.num_accumulated()) == 1
    acc.apply_grad([0], [[3.0]], local_step=0)  # the step was not incremented
    out = acc.take_grad(2, timeout=0.0)  # enough held: a zero timeout still succeeds
    np.testing.assert_allclose(out.values.numpy(), [[5.0]])


def test_eager_blocking_take_releases_after_enough_applies():
    acc = SparseConditionalAccumulator(tf.float32)
    result = {}
    t = _thread(lambda: result.setdefault("out", acc.take_grad(3, timeout=30.0)))
    acc.apply_grad([0], [[1.0]])
    acc.apply_grad([0], [[2.0]])
    time.sleep(0.3)
    assert "out" not in result  # two of three
    acc.apply_grad([0], [[6.0]])
    t.join(20.0)
    np.testing.assert_allclose(result["out"].values.numpy(), [[3.0]])


def test_fifo_head_of_line_blocking():
    acc = SparseConditionalAccumulator(tf.float32, reduction_type="SUM")
    results = {}
    t3 = _thread(lambda: results.setdefault("take3", acc.take_grad(3, timeout=30.0)))
    time.sleep(0.2)
    t1 = _thread(lambda: results.setdefault("take1", acc.take_grad(1, timeout=30.0)))
    time.sleep(0.2)
    acc.apply_grad([0], [[1.0]])
    time.sleep(0.3)
    assert results == {}  # one gradient releases neither the head take(3) nor the take(1) behind it
    acc.apply_grad([0], [[2.0]], local_step=0)
    acc.apply_grad([0], [[4.0]], local_step=0)
    t3.join(20.0)
    np.testing.assert_allclose(results["take3"].values.numpy(), [[7.0]])
    time.sleep(0.2)
    assert "take1" not in results  # needs a new, non-stale gradient
    acc.apply_grad([0], [[100.0]], local_step=0)  # stale now
    acc.apply_grad([0], [[8.0]], local_step=1)
    t1.join(20.0)
    np.testing.assert_allclose(results["take1"].values.numpy(), [[8.0]])


def test_timed_out_head_is_skipped():
    acc = SparseConditionalAccumulator(tf.float32)
    results, errors = {}, {}

    def head():
        try:
            acc.take_grad(3, timeout=0.5)
        except tf.errors.DeadlineExceededError as e:
            errors["head"] = e

    th = _thread(head)
    time.sleep(0.1)
    t1 = _thread(lambda: results.setdefault("take1", acc.take_grad(1, timeout=30.0)))
    time.sleep(0.1)
    acc.apply_grad([0], [[5.0]])
    time.sleep(0.1)
    assert results == {}  # blocked behind the head
    th.join(20.0)
    t1.join(20.0)
    assert "head" in errors
    np.testing.assert_allclose(results["take1"].values.numpy(), [[5.0]])


def test_num_accumulated_readable_while_take_blocked():
    acc = SparseConditionalAccumulator(tf.float32)
    done = {}
    t = _thread(lambda: done.setdefault("out", acc.take_grad(2, timeout=30.0)))
    time.sleep(0.1)
    acc.apply_grad([0], [[1.0]])
    assert int(acc.num_accumulated()) == 1
    acc.apply_grad([0], [[1.0]])
    t.join(20.0)
    assert int(acc.num_accumulated()) == 0


@pytest.mark.slow
def test_stress_concurrent_applies_and_takes_conserve_totals():
    """Threads apply while others take; every applied row value is returned by exactly one take."""
    acc = SparseConditionalAccumulator(tf.float64, shape=[64, 4], reduction_type="SUM")
    num_appliers, applies_each, num_takers = 4, 40, 2
    rng = np.random.default_rng(3)
    payloads = [
        [(np.unique(rng.integers(0, 64, size=8)), None) for _ in range(applies_each)] for _ in range(num_appliers)
    ]
    payloads = [[(idx, rng.normal(size=(idx.size, 4))) for idx, _ in p] for p in payloads]
    expected = np.zeros((64, 4))
    for p in payloads:
        for idx, vals in p:
            np.add.at(expected, idx, vals)
    stop = threading.Event()
    got = np.zeros((64, 4))
    got_lock = threading.Lock()
    failures = []

    def applier(p):
        try:
            for idx, vals in p:
                acc.apply_grad(idx, vals, grad_shape=[64, 4], local_step=2**62)  # never stale
        except Exception as e:  # reported by the assertion below
            failures.append(e)

    def taker():
        while not stop.is_set():
            try:
                out = acc.take_grad(1, timeout=0.05)
            except tf.errors.DeadlineExceededError:
                continue
            with got_lock:
                np.add.at(got, out.indices.numpy(), out.values.numpy())

    takers = [_thread(taker) for _ in range(num_takers)]
    appliers = [_thread(applier, p) for p in payloads]
    for t in appliers:
        t.join(60.0)
    stop.set()
    for t in takers:
        t.join(60.0)
    assert not failures
    remaining = int(acc.num_accumulated())
    if remaining:
        out = acc.take_grad(1)
        np.add.at(got, out.indices.numpy(), out.values.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)


def test_eager_cancellation_manager_cancels_blocked_take():
    from tensorflow.python.eager import cancellation

    acc = SparseConditionalAccumulator(tf.float32)
    acc.apply_grad([0], [[1.0]])
    take = tf.function(lambda: acc.take_grad(2).values).get_concrete_function()
    manager = cancellation.CancellationManager()
    cancelable = manager.get_cancelable_function(take)
    errors = _cancelled_errors(cancelable, manager.start_cancel)
    assert len(errors) == 1 and "TakeGrad operation was cancelled" in str(errors[0])
    assert int(acc.num_accumulated()) == 1  # untouched
    acc.apply_grad([0], [[3.0]], local_step=0)  # step not incremented
    np.testing.assert_allclose(acc.take_grad(2, timeout=10.0).values.numpy(), [[2.0]])
