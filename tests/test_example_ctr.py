"""The end-to-end example runs (smoke size), from code and from a written .pbtxt through the config loader."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import tensorflow as tf

from tf_embed_ops.examples import ctr


@pytest.mark.slow
def test_smoke_run_prints_auc_for_both_models():
    args = argparse.Namespace(
        smoke=True, config=None, batch_size=256, learning_rate=0.003, quiet=True, train_size=0, test_size=0, epochs=0
    )
    results = ctr.run(args)
    assert set(results) == {"tpu_embedding", "baseline"}
    for r in results.values():
        assert 0.0 <= r["test_auc"] <= 1.0 and 0.0 <= r["train_auc"] <= 1.0


def test_config_round_trip_through_the_loader(tmp_path):
    path = str(tmp_path / "ctr.pbtxt")
    assert ctr.main(["--write-config", path]) == 0
    fc, _ = ctr.feature_config_from_file(path)
    assert fc["history"].max_sequence_length == ctr.HISTORY
    assert fc["item"].table is fc["history"].table and fc["tags"].table is fc["category"].table
    assert {type(f.table.optimizer).__name__ for f in fc.values()} == {"Adagrad", "Adam", "FTRL"}


@pytest.mark.slow
def test_module_entry_point_with_config_flag(tmp_path):
    path = str(tmp_path / "ctr.pbtxt")
    ctr.main(["--write-config", path])
    out = subprocess.run(
        [sys.executable, "-m", "tf_embed_ops.examples.ctr", "--smoke", "--quiet", "--config", path],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "train AUC" in out.stdout and "baseline" in out.stdout


def test_planted_structure_is_learnable():
    """The generator is deterministic given the seed and its labels depend on the features."""
    x1, y1 = ctr.make_data(200, seed=5)
    x2, y2 = ctr.make_data(200, seed=5)
    assert (y1 == y2).all() and (x1["user"] == x2["user"]).all()
    assert 0.2 < float(y1.mean()) < 0.8
    assert isinstance(x1["history"], tf.RaggedTensor)
