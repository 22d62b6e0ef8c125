"""Our step tracked and untracked on the same tables: the engine both tracking figures (the headline's and the
full suite's lifecycle section) pair with the untracked step.

Two sets of 256 MB tables differ by about as much as tracking costs (where their pages landed), so the tracked
blocks run the base engine's own step on its own tables, with tracking started before each block and stopped
after it.
"""

from __future__ import annotations


class TrackedBlocks:
    """An engine (``run(steps)`` -> seconds) timing ``base``'s step with its tables' touched-row tracking on.

    ``base`` is a ``pairs.LocalEngine`` over ``ours.fused_step`` (its step's ``state[0]`` are the tables). Each
    block starts tracking (the stamps allocated) and runs one untimed step, which writes the stamps of the rows
    the block's steps write (every step reuses its batch), so the block times tracked steps, not the stamps'
    first touch; the block's end drops the trackers, and the tables are untracked again.
    """

    def __init__(self, base):
        self.base = base
        self.tables = base.step.state[0]

    def run(self, steps: int) -> float:
        import tf_embed_ops as te

        trackers = [te.ops.tf_embed_touched_rows_track(t.handle) for t in self.tables]
        try:
            self.base.step()
            return self.base.run(steps)
        finally:
            del trackers  # the last handle gone, the tables are untracked again
