"""A static tiered table as a part of an incremental checkpoint chain (`backends.protocol.ChainState`).

Described like the same table in memory (a chain moves between the two kinds through its full checkpoint, which
streams the tiered table, `tiered.checkpoint`): a delta holds the rows the tracker reports changed, read from the
tier; a table changed whole makes the save a full checkpoint; a restore writes the deltas' rows into the tier one
run of consecutive rows at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tf_embed_ops.backends import row_chain

__all__ = ["TieredChain"]


class TieredChain(row_chain.RowChain):
    """One `TieredTable` in a chain (`view`: the tracker's view of it, whose `table` is the `TieredTable`)."""

    streamed = True

    def __init__(self, name: str, view: Any):
        super().__init__(name, view)
        self.table = view.table

    def variables(self) -> list:
        return []  # the rows live in the tier, not in variables

    def dense_variables(self) -> dict:
        # The rounding step is saved by the streamed saver, not as a checkpoint variable: each delta carries it, as
        # it carries an in-memory embedding's `rounding_step`.
        return {f"tiered_table_step/{self.name}": self.table.step}

    def describe(self) -> dict:
        table = self.table
        widths = [table.dim, *table.slot_widths]
        names = ["parameters", *table.slot_names]
        return {
            "kind": "static",
            "rows": table.num_rows,
            "variables": {n: [int(w), d.name] for n, w, d in zip(names, widths, table.dtypes, strict=True)},
        }

    def restore_rows(self, rows: np.ndarray, values: dict) -> None:
        table = self.table
        order = np.argsort(rows, kind="stable")
        rows = rows[order]
        values = {k: np.asarray(v)[order].astype(np.float32) for k, v in values.items()}  # 16-bit: exact
        starts = np.concatenate([[0], np.nonzero(np.diff(rows) != 1)[0] + 1, [rows.size]])
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            table.write_rows(int(rows[a]), values["parameters"][a:b], [values[slot][a:b] for slot in table.slot_names])
