"""The headline's tracked engine: the base's own tables, tracked for each block and untracked between blocks."""

from __future__ import annotations

import tf_embed_ops as te
from benchmarks import headline, ours, pairs
from benchmarks import workloads as wls


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
    engine = headline._TrackedBlocks(pairs.LocalEngine(observed_step))
    assert _tracker_version(handle) == 1
    assert engine.run(2) > 0
    # One untimed step, then the block's two: one tracker throughout, one update each.
    assert seen == [1, 2, 3]
    assert _tracker_version(handle) == 1  # the block's tracker is gone: a fresh one starts again
    seen.clear()
    engine.run(1)
    assert seen == [1, 2]
