"""A group's serving form: its features looked up with stock TensorFlow ops (`tf_embed_ops._xla.lookup`, bitwise
the op's) over what an export's context serves for each table. Each kind subclasses `ServedGroup` with `_lookup`."""

from __future__ import annotations

from typing import Any

__all__ = ["ServedGroup", "is_dense_input"]


def is_dense_input(inp: Any) -> bool:
    """Whether a normalised input came from a dense Tensor (its splits input is then empty)."""
    return inp.sample_indices_or_row_splits.shape.as_list() == [0]


class ServedGroup:
    """Stands in for a group (`protocol.TableGroup`) while serving: the same features and positions, each looked up
    by `_lookup(feature, input, table)` with plain TensorFlow; `context` is the export's `ExportContext`."""

    def __init__(self, group: Any, context: Any):
        self._group = group
        self._context = context
        self.positions = group.positions

    def lookup(self, inputs: list, training: bool = False) -> list:
        del training  # serving never inserts nor trains
        tables = self._group.tables
        return [self._lookup(f, inp, tables[f.table]) for f, inp in zip(self._group.features, inputs, strict=True)]

    def _lookup(self, feature: Any, inp: Any, table: Any) -> Any:
        raise NotImplementedError
