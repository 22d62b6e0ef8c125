"""The suite's keras-rs row at smoke size: both engines build from the W1 workload, run a training step, start
from the same tables (same forward), and move them differently (the model's dense Adam vs the table's lazy Adam)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import workloads as wls

pytest.importorskip("keras_rs")
from benchmarks.peers import keras_rs_peer


def test_both_engines_run_on_w1_from_the_same_tables():
    wl = wls.w1(smoke=True)
    steps = {name: make(wl) for name, make in keras_rs_peer.ENGINES.items()}
    first = {name: [a.numpy() for a in step()] for name, step in steps.items()}
    np.testing.assert_allclose(first["ours_keras_rs"][0], first["keras_rs"][0], rtol=1e-6, atol=1e-7)
    second = {name: step()[0].numpy() for name, step in steps.items()}
    for name in steps:
        assert not np.array_equal(second[name], first[name][0]), name  # each engine trained its table
    # Lazy (table) Adam and the model's dense, bias-corrected Adam take different first steps.
    assert not np.allclose(second["ours_keras_rs"], second["keras_rs"])
    layer = steps["ours_keras_rs"].layer
    assert [v.name for v in layer.trainable_variables] == ["table_update_trigger"]
    assert steps["keras_rs"].layer.trainable_variables[0].shape == (wl.tables[0].vocab, wl.tables[0].dim)


def test_report_has_the_keras_rs_comparison_with_the_speedup():
    from benchmarks import report

    runs = [
        {"engine": "keras_rs", "workload": "W1", "optimizer": "adam", "median_ms": 300.0, "iqr_ms": 2.0},
        {"engine": "ours_keras_rs", "workload": "W1", "optimizer": "adam", "median_ms": 4.0, "iqr_ms": 0.2},
    ]
    lines = report._keras_rs_lines({"runs": runs})
    assert lines[0] == "## keras-rs `DistributedEmbedding` on CPU"
    assert "| W1 | Adam (lazy) | 300 ± 1 | 4 ± 0.1 | **75x** |" in lines
    assert report._keras_rs_lines({"runs": [dict(runs[0], engine="ours")]}) == []
