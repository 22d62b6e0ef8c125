"""What the CTR example tells its reader: what it compared, which model generalises better (test AUC), that it
wrote nothing, and no per-step progress bar (whose first-step ETA read as minutes for a run of seconds)."""

from __future__ import annotations

import argparse
import os
import re

import pytest

from tf_embed_ops.examples import ctr


def test_summary_names_the_comparison_the_better_model_and_what_was_written():
    results = {
        "tpu_embedding": {"train_auc": 0.80, "test_auc": 0.75, "fit_seconds": 3.0},
        "baseline": {"train_auc": 0.90, "test_auc": 0.70, "fit_seconds": 2.0},
    }
    text = ctr.summary(results, 2000, 500)
    assert "Compared: the same DLRM model" in text and "2000 for training, 500 held out" in text
    assert "tables trained by their own TPU optimizers" in text and "trained by the model's Keras Adam" in text
    assert "tpu_embedding generalises better: test AUC 0.7500 vs 0.7000 for baseline (+0.0500)." in text
    assert "Nothing was written to disk" in text
    results["baseline"]["test_auc"] = 0.78  # the verdict follows the numbers, whichever model wins
    assert "baseline generalises better: test AUC 0.7800 vs 0.7500 for tpu_embedding" in ctr.summary(results, 1, 1)


@pytest.mark.slow  # trains the example's two models (about 9 s)
def test_smoke_run_prints_the_verdict_writes_nothing_and_shows_no_eta(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(
        smoke=True, config=None, batch_size=256, learning_rate=0.003, quiet=False, train_size=0, test_size=0, epochs=0
    )
    results = ctr.run(args)
    out = capsys.readouterr().out
    best = max(results, key=lambda k: results[k]["test_auc"])
    assert f"{best} generalises better" in out or "Both models reach the same test AUC" in out
    assert "ETA" not in out
    assert len(re.findall(r"^\d+/\d+ - \d+s - ", out, re.M)) == 2  # one line per epoch and model (verbose=2)
    assert os.listdir(tmp_path) == []
