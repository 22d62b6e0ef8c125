"""Tiered tables: embedding tables larger than memory, on disk behind a DRAM row cache (docs/tiered_tables.md).

- ``Tiered`` (also ``te.Tiered``): the storage option, ``te.TableConfig(..., storage=te.Tiered(...))``.
- ``TieredTable``: the table object (the resource, chunked initialisation, row reads and writes, statistics,
  TensorBoard summaries, streaming checkpoints).
- ``is_tiered``: whether a table config is tiered.

`te.TPUEmbedding` trains the features of tiered tables with the same fused optimizers as in-memory tables.
"""

from __future__ import annotations

from tf_embed_ops._lazy_exports import lazy_exports

_LAZY: dict[str, tuple[str, str]] = {
    "Tiered": ("tf_embed_ops.tiered.config", "Tiered"),
    "is_tiered": ("tf_embed_ops.tiered.config", "is_tiered"),
    "TieredTable": ("tf_embed_ops.tiered.table", "TieredTable"),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY)
