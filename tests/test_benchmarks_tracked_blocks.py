"""Tracking's figure (the headline's and the suite's lifecycle section): the base's own tables, tracked for each
block and untracked between blocks (benchmarks/tracked_blocks.py)."""

from __future__ import annotations

import tf_embed_ops as te
from benchmarks import checkpoint_benchmark, ours, pairs, suite
from benchmarks import workloads as wls
from benchmarks.tracked_blocks import TrackedBlocks


def _tracker_version(handle) -> int:
    # Tracking a tracked table returns its tracker; an untracked table gets a fresh one (version 1).
    tracker = te.ops.tf_embed_touched_rows_track(handle)
    return int(te.ops.tf_embed_touched_rows_since(tracker, -1, 0)[1])


def test_tracked_blocks_track_the_base_tables_only_for_the_block():
    step = ours.fused_step(wls.w1(smoke=True), "adagrad")
    handle = step.state[0][0].handle
    seen = []

    def observed_step():
        seen.append(_tracker_version(handle))
        return step()

    observed_step.state = step.state
    engine = TrackedBlocks(pairs.LocalEngine(observed_step))
    assert _tracker_version(handle) == 1
    assert engine.run(2) > 0
    # One untimed step, then the block's two: one tracker throughout, one update each.
    assert seen == [1, 2, 3]
    assert _tracker_version(handle) == 1  # the block's tracker is gone: a fresh one starts again
    seen.clear()
    engine.run(1)
    assert seen == [1, 2]


def test_the_lifecycle_section_pairs_one_set_of_tables_and_says_met_or_missed():
    wl = wls.w1(smoke=True)
    tr = checkpoint_benchmark.bench_tracking(suite.Options(smoke=True, blocks=2), wl)
    assert tr["pairs"] == checkpoint_benchmark.TRACKING_PAIRS_PER_BLOCK * 2
    assert tr["untracked"]["median_ms"] > 0 and tr["tracked"]["median_ms"] > 0
    assert tr["ratio_q1"] <= tr["ratio"] <= tr["ratio_q3"]
    line = checkpoint_benchmark._overhead_line(tr)
    assert f"over {tr['pairs']} pairs on the same tables" in line
    assert ("met" if tr["ratio"] <= 1.02 else "missed") in line
    # A committed result from before the pairs still renders.
    assert "(target <= 1.02: met)" in checkpoint_benchmark._overhead_line({"ratio": 1.01})
