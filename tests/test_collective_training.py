"""The collective mode end to end: `launch --collective` starts N worker processes on localhost, each runs
`tests/collective_cases.py` (several cases per launch, to share the processes' start-up), and the results are
compared here with the same model trained in this process by `train_on_batch` on the global batches.

* bitwise at 1, 2 and 4 workers for SGD, Adagrad and Adam when the dense layer is frozen (the activation
  gradients are then the single process's), every static table and slot, the dynamic table's keys, rows and
  slots, and the dense weights; within float tolerance
  when the dense layer trains (the replicas' dense gradients are summed in another order);
* memory: mid-epoch, each of 4 workers' layer holds only its shard (tables and slots of ceil(V / N) rows, its hash
  shard of the dynamic table's keys, the full variables released);
* checkpoints: one written by a single process trains on in 4 workers; 4 workers' checkpoint (and 2 workers', and
  4 workers' mid-epoch save by the user's own `tf.train.Checkpoint`) restores into a single-process model; a killed
  worker stops the job with `WorkerLostError` within the collective timeout, and `fit` resumes from the last
  checkpoint to the single process's numbers;
* bad steps (capacity overflow, an id past the table, batch sizes that differ) are refused on every worker with
  an error naming the table / argument and the count, nothing changed, and the job goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import collective_cases as cases

pytestmark = pytest.mark.slow

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(workers: int, out, names: list, timeout: float = 540, extra_env: dict | None = None, grace: int = 60):
    command = [
        sys.executable,
        "-m",
        "tf_embed_ops.distribute.launch",
        "--workers",
        str(workers),
        "--collective",
        "--failure-grace",
        str(grace),
        "--",
        sys.executable,
        "-m",
        "tests.collective_cases",
        str(out),
        *names,
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=_ROOT, **(extra_env or {}))
    return subprocess.run(command, cwd=_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _assert_ran(result) -> None:
    assert result.returncode == 0, result.stderr[-4000:]


def _load(out, case: str) -> dict:
    return dict(np.load(os.path.join(out, f"{case}.npz")))


def _assert_bitwise(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        assert np.array_equal(got[key].view(np.uint32), value.view(np.uint32)), (
            key,
            float(np.abs(got[key] - value).max()),
        )


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_n_workers_train_the_tables_as_one_process_with_the_global_batch(tmp_path, workers):
    names = ["sgd", "adagrad", "adam"] + (["adam_dense", "save"] if workers == 2 else [])
    _assert_ran(_launch(workers, tmp_path, names))
    initial = cases.weights(cases.build_model(*_tf_keras(), "sgd", False))
    for case in ("sgd", "adagrad", "adam"):
        want = cases.reference(case)
        for table in ("embedding/t1", "embedding/t2"):
            assert not np.array_equal(want[table], initial[table])  # the step changed the tables
        _assert_bitwise(_load(tmp_path, case), want)
    if workers == 2:
        got, want = _load(tmp_path, "adam_dense"), cases.reference("adam_dense")
        assert sorted(got) == sorted(want)
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
        # 2 workers' checkpoint (epoch 1) into one process without a strategy.
        _assert_bitwise(cases.restore_in_one_process(os.path.join(tmp_path, "ckpt")), cases.reference("adagrad"))


def test_a_killed_worker_stops_the_job_and_fit_resumes_across_worker_counts(tmp_path):
    # Epoch 1 trained and saved by one process; 2 workers go on, and worker 1 dies at its second batch.
    cases.save_reference_checkpoint(os.path.join(tmp_path, "ckpt"), epochs=1)
    timeout = 20
    start = time.monotonic()
    result = _launch(2, tmp_path, ["die"], extra_env={"COLLECTIVE_TIMEOUT": str(timeout)}, grace=300)
    elapsed = time.monotonic() - start
    assert result.returncode == 128 + 9, result.stderr[-4000:]  # worker 1's SIGKILL
    assert "WorkerLostError: worker 0 of 2: a collective with the other workers failed" in result.stderr
    assert "fit restores" in result.stderr and "ckpt-1" in result.stderr
    assert elapsed < 240  # worker 0 stopped by itself (the launcher's grace is 300 s)
    # Restarted with 4 workers: fit restores epoch 1 and trains epoch 2, as one process trains two epochs.
    _assert_ran(_launch(4, tmp_path, ["resume"]))
    want = cases.reference("adagrad", epochs=2)
    one_epoch = cases.reference("adagrad", epochs=1)
    assert want["dynamic/dyn/keys"].size > 0
    assert not np.array_equal(want["dynamic/dyn/weights"], one_epoch["dynamic/dyn/weights"])  # epoch 2 trained it
    _assert_bitwise(_load(tmp_path, "resume"), want)
    # And the 4 workers' checkpoint (epoch 2) restores into one process.
    _assert_bitwise(cases.restore_in_one_process(os.path.join(tmp_path, "ckpt")), want)


def test_each_worker_holds_only_its_shard_and_the_users_mid_epoch_checkpoint_holds_the_full_tables(tmp_path):
    import tensorflow as tf

    workers = 4
    _assert_ran(_launch(workers, tmp_path, ["midsave"]))
    mid = cases.reference("adagrad", steps=cases.MID_STEPS)
    keys = mid["dynamic/dyn/keys"]
    from tf_embed_ops.distribute.collective import layout
    from tf_embed_ops.dynamic import sharding

    owners = sharding.shard_of_keys(keys, workers).numpy()
    for worker in range(workers):
        with open(os.path.join(tmp_path, f"midsave_{worker}.json")) as f:
            facts = json.load(f)
        for name, vocabulary in (("t1", cases.V1), ("t2", cases.V2)):
            rows = layout.shard_rows(vocabulary, workers, worker)
            assert facts["rows"][name] == facts["rows"][f"{name}/accumulators"] == rows, (worker, facts["rows"])
        assert facts["full_alive"] == 0  # the layer's full tables and slots were released
        assert facts["layer_dynamic_size"] == 0
        assert facts["shard_dynamic_keys"] == sorted(keys[owners == worker].tolist())
    # The user's own Checkpoint, saved on every worker mid-epoch, holds the current full tables: it restores into
    # one process as the model one process trained for the same steps.
    assert not np.array_equal(mid["embedding/t1"], cases.reference("adagrad", steps=0)["embedding/t1"])
    cases.save_reference_checkpoint(os.path.join(tmp_path, "one"), epochs=1)
    shapes = [
        dict(tf.train.list_variables(tf.train.latest_checkpoint(os.path.join(tmp_path, d)))) for d in ("midckpt", "one")
    ]
    # One process's keys for the tables, slots and dynamic table, and the static ones' shapes (the dynamic table's
    # row count differs: 2 steps against 3).
    tables = [sorted(k for k in s if "/_tpu_embedding/" in k) for s in shapes]
    assert tables[0] == tables[1] and len(tables[0]) == 13
    static = [k for k in tables[1] if "/dyn/" not in k]
    assert [shapes[0][k] for k in static] == [shapes[1][k] for k in static]
    _assert_bitwise(cases.restore_in_one_process(os.path.join(tmp_path, "midckpt")), mid)
    # And after fit the layer holds the full tables again.
    _assert_bitwise(_load(tmp_path, "midsave"), cases.reference("adagrad"))


def test_bad_steps_are_refused_on_every_worker_and_change_nothing(tmp_path):
    _assert_ran(_launch(2, tmp_path, list(cases.BAD_CASES) + ["sgd"]))
    expected = {
        "overflow": "Table 't1': a worker sends more ids to one worker than max_ids_per_worker=1 allows",
        "bad_id": "Table 't1': ids must be in [0, 11)",
        "bad_batch": "The workers' batch sizes differ",
    }
    for case, message in expected.items():
        with open(os.path.join(tmp_path, f"{case}.txt")) as f:
            text = f.read().replace("\\'", "'")
        assert text.startswith("unchanged=True"), (case, text[:300])
        assert message in text, (case, text[:2000])
    # The job goes on after the refused steps: the next case trains as one process.
    _assert_bitwise(_load(tmp_path, "sgd"), cases.reference("sgd"))


def _tf_keras():
    import keras
    import tensorflow as tf

    return tf, keras


def test_the_launcher_runs_the_ctr_example_in_collective_mode():
    command = [sys.executable, "-m", "tf_embed_ops.distribute.launch", "--workers", "2", "--collective", "--"]
    command += [sys.executable, "-m", "tf_embed_ops.examples.ctr", "--collective", "--smoke"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=_ROOT)
    result = subprocess.run(command, cwd=_ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "== collective: 2 workers, global batch 256 (7 steps per epoch)" in result.stdout, result.stdout
    assert "exchange_bytes:" in result.stdout  # worker 0's epoch line
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("train AUC")]
    assert 0.5 < float(line.split()[5]) <= 1.0  # the test AUC of the trained model
