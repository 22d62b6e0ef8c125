"""The speed-of-light kernel's keyed engines (benchmarks/speed_of_light.cc): the ceiling of the dynamic-table
headlines. A keyed step finds every key's row through a hash index and then does the static step's work on those
rows, so its tables must end bitwise where the unkeyed kernel's do, with either index layout (each key beside its
row number, or a dynamic table's compact layout); a keyed lookup updates nothing. Compiles and runs the kernel: the
slow tier.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.benchmarks_import import import_benchmark as _import

pytestmark = pytest.mark.slow

sol = _import("speed_of_light")
workloads = _import("workloads")
workers = _import("workers")


def _keys(wl) -> list[np.ndarray]:
    """Distinct pseudo-random 64-bit keys per table (row r's key), as a dynamic table's fingerprints are."""
    rng = np.random.default_rng(7)
    out = []
    for t in wl.tables:
        k = rng.integers(-(2**62), 2**62, size=t.vocab * 2, dtype=np.int64)
        out.append(np.unique(k)[: t.vocab][rng.permutation(t.vocab)])
        assert out[-1].shape == (t.vocab,)
    return out


@pytest.fixture(scope="module")
def w4():
    """A multi-table workload at smoke size (bags, sequences, tables of several sizes)."""
    return workloads.WORKLOADS["W4"](smoke=True)


@pytest.mark.parametrize("key_index", ["wide", "compact"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_a_keyed_step_ends_where_the_unkeyed_step_does(w4, optimizer, key_index):
    init = [
        np.random.default_rng(t).normal(size=(tb.vocab, tb.dim)).astype(np.float32) for t, tb in enumerate(w4.tables)
    ]
    plain = sol.final_tables(w4, optimizer, init, steps=3)
    keyed = sol.final_tables(w4, optimizer, init, steps=3, keys=_keys(w4), key_index=key_index)
    assert any(not np.array_equal(p, i) for p, i in zip(plain, init, strict=True))  # the steps did update
    for t, (p, k) in enumerate(zip(plain, keyed, strict=True)):
        np.testing.assert_array_equal(p, k, err_msg=f"table {t}")


@pytest.mark.parametrize("key_index", ["wide", "compact"])
def test_a_keyed_lookup_changes_no_table(w4, key_index):
    init = [
        np.random.default_rng(t).normal(size=(tb.vocab, tb.dim)).astype(np.float32) for t, tb in enumerate(w4.tables)
    ]
    for t, out in enumerate(sol.final_tables(w4, sol.LOOKUP, init, steps=2, keys=_keys(w4), key_index=key_index)):
        np.testing.assert_array_equal(out, init[t], err_msg=f"table {t}")


@pytest.mark.parametrize("key_index", ["wide", "compact"])
def test_a_repeated_key_is_refused_naming_it(w4, key_index):
    keys = _keys(w4)
    keys[0][1] = keys[0][0]
    zeros = [np.zeros((t.vocab, t.dim), np.float32) for t in w4.tables]
    with pytest.raises(RuntimeError, match=f"keys0.bin: key {keys[0][0]} repeats"):
        sol.final_tables(w4, "sgd", zeros, 1, keys=keys, key_index=key_index)


def test_the_worker_times_keyed_engines_and_refuses_one_without_keys(w4):
    worker = sol.worker(w4, warmup=1)
    try:
        with pytest.raises(workers.WorkerError, match="no key file .*keys0.bin"):
            worker.prepare("early", optimizer="sgd", keys="hashed")
        with pytest.raises(workers.WorkerError, match="keys=ids\\|hashed\\|compact"):
            worker.prepare("bad", optimizer="sgd", keys="strings")
        sol.write_keys(worker.scratch, _keys(w4))
        for opt in ("sgd", sol.LOOKUP):
            for index in ("hashed", "compact"):
                worker.prepare(f"k_{opt}_{index}", optimizer=opt, keys=index)
                assert worker.engine(f"k_{opt}_{index}").run(2) > 0
        worker.prepare("plain", optimizer="sgd")  # the worker still serves after the refusals
        assert worker.engine("plain").run(1) > 0
    finally:
        worker.close()
