"""Side by side with real TFRA 0.8.1: the same keys, initial rows, batches and upstream gradients give the same
lookups, rows and slots for SGD, Adagrad and Adam (float tolerance).

TFRA pins TensorFlow <= 2.16.2, so it runs in its own interpreter (`benchmarks/peers/setup_tfra.sh` makes one; found
at $TF_EMBED_OPS_TFRA_PYTHON, /work/venvs/tfra or /opt/tfra-venv). The child (`tfra_side_by_side_child.py`) trains
TFRA, and `tf_embed_ops.tfra` too when this package imports in that interpreter (it must be built for its
TensorFlow); then:

- `test_tfra_matches_the_reference`: TFRA's results against `tfra_reference.py`, the numpy model of TFRA that
  test_tfra_training.py compares tf_embed_ops.tfra with on our TensorFlow (so the two agree through it);
- `test_against_tfra`: tf_embed_ops.tfra trained here (our TensorFlow, Keras 3) on the same job, against TFRA's
  results from the child;
- `test_side_by_side`: tf_embed_ops.tfra's results against TFRA's, in one interpreter; skipped, saying why, when
  the package does not import there.

Both are skipped, saying why, without a TFRA interpreter.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess

import numpy as np
import pytest

from tests.tfra import tfra_reference as ref
from tests.tfra import tfra_side_by_side_child as child

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tfra_side_by_side_child.py")
KINDS = ["sgd", "adagrad", "adam"]
DIM, N = 4, 8


def _python() -> str | None:
    for candidate in (
        os.environ.get("TF_EMBED_OPS_TFRA_PYTHON"),
        "/work/venvs/tfra/bin/python",
        "/opt/tfra-venv/bin/python",
    ):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def _job() -> dict:
    rng = np.random.default_rng(4)
    return {
        "keys": (np.arange(N, dtype=np.int64) * 1_000_003 + 2**40).tolist(),
        "dim": DIM,
        "initial_rows": rng.uniform(-0.5, 0.5, [N, DIM]).astype(np.float32).tolist(),
        "batches": [rng.integers(0, N - 1, [5, 2]).tolist() for _ in range(4)],  # key N-1 never in a batch
        "upstream": [rng.standard_normal([5, 2, DIM]).astype(np.float32).tolist() for _ in range(4)],
        "optimizers": KINDS,
        "learning_rate": ref.LR,
        "adagrad_init": ref.ADAGRAD_INIT,
        "epsilon": ref.EPSILON,
        "beta_1": ref.BETA_1,
        "beta_2": ref.BETA_2,
    }


@functools.cache
def _run(tmp: str) -> tuple[dict, dict]:
    python = _python()
    if python is None:
        pytest.skip("no TFRA interpreter: run benchmarks/peers/setup_tfra.sh DIR and set TF_EMBED_OPS_TFRA_PYTHON")
    job = _job()
    path = os.path.join(tmp, "job.json")
    with open(path, "w") as f:
        json.dump(job, f)
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([python, CHILD, path], capture_output=True, text=True, env=env, timeout=900, check=False)
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else ["(no output)"]
        if "No module named 'tensorflow_recommenders_addons'" in proc.stderr:
            pytest.skip(f"{python} has no TFRA: {last[0]}")
        pytest.fail(f"the TFRA child failed: {proc.stderr[-3000:]}")
    return job, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return _run(str(tmp_path_factory.mktemp("sbs")))


def _reference(job: dict, kind: str) -> dict:
    w = np.array(job["initial_rows"], np.float64)
    slots = ref.initial_slots(kind, N, DIM)
    lookups = []
    for t, (batch, up) in enumerate(zip(job["batches"], job["upstream"], strict=True)):
        batch, up = np.array(batch), np.array(up)
        lookups.append(w[batch].copy())
        rows = np.unique(batch)
        g = np.zeros([N, DIM])
        np.add.at(g, batch.reshape(-1), up.reshape(-1, DIM))
        touched, touched_slots = w[rows], [s[rows] for s in slots]
        ref.apply(kind, touched, touched_slots, g[rows], t)
        w[rows] = touched
        for s, ts in zip(slots, touched_slots, strict=True):
            s[rows] = ts
    names = {"sgd": [], "adagrad": ["accumulator"], "adam": ["m", "v"]}[kind]
    return {"lookups": lookups, "rows": w, "slots": dict(zip(names, slots, strict=True))}


def _assert_close(got: dict, want: dict, what: str) -> None:
    for step, (a, b) in enumerate(zip(got["lookups"], want["lookups"], strict=True)):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6, err_msg=f"{what}: step {step}")
    np.testing.assert_allclose(np.array(got["rows"]), np.array(want["rows"]), rtol=1e-5, atol=1e-6, err_msg=what)
    for name, value in want["slots"].items():
        # TFRA keeps slot rows only for trained keys: all but key N-1, the largest, so the first rows in key order.
        got_slot = np.array(got["slots"][name])
        np.testing.assert_allclose(
            got_slot,
            np.array(value)[: len(got_slot)] if len(got_slot) < N else value,
            rtol=1e-5,
            atol=2e-7,  # Adagrad's accumulator: + epsilon here (see tfra.optimizer)
            err_msg=f"{what}: slot {name}",
        )


@pytest.mark.parametrize("kind", KINDS)
def test_tfra_matches_the_reference(results, kind):
    job, out = results
    _assert_close(out["tfra"][kind], _reference(job, kind), f"TFRA {out['tfra_version']} {kind}")
    assert out["tfra"][kind]["iterations"] == len(job["batches"])


@pytest.mark.parametrize("kind", KINDS)
def test_side_by_side(results, kind):
    job, out = results
    if "ours_error" in out:
        pytest.skip(
            f"tf_embed_ops does not import in the TFRA interpreter (TensorFlow {out['tensorflow']}): "
            f"{out['ours_error']}; build the package for that TensorFlow to run the side-by-side comparison"
        )
    ours, tfra = out["ours"][kind], out["tfra"][kind]
    assert ours["keys"] == tfra["keys"]
    _assert_close(ours, {**tfra, "rows": tfra["rows"], "slots": {}}, f"tf_embed_ops.tfra vs TFRA {kind}")
    for name, value in tfra["slots"].items():
        np.testing.assert_allclose(np.array(ours["slots"][name])[: len(value)], value, rtol=1e-5, atol=2e-7)
    assert ours["iterations"] == tfra["iterations"]


@pytest.mark.parametrize("kind", KINDS)
def test_against_tfra(results, kind):
    import keras

    import tf_embed_ops.tfra as de

    job, out = results
    ours, tfra = child.train(de, keras, kind, job, ours=True), out["tfra"][kind]
    assert ours["keys"] == tfra["keys"]
    _assert_close(ours, {**tfra, "slots": {}}, f"tf_embed_ops.tfra (TensorFlow 2.21) vs TFRA {kind}")
    for name, value in tfra["slots"].items():
        np.testing.assert_allclose(np.array(ours["slots"][name])[: len(value)], value, rtol=1e-5, atol=2e-7)
    assert ours["iterations"] == tfra["iterations"]
