"""Table stacking and the SparseCore row layout of `TPUEmbeddingV2`.

`TPUEmbeddingV2` stores tables with the same width and optimizer in one *stacked* variable. Each table is padded
(rows to a multiple of the SparseCore count and more, columns to a multiple of 8), its rows are dealt out over the
SparseCores by id modulo the SparseCore count (row r lives in shard `(r + rotation) % num_sc`), and within every
shard the tables follow each other at a row offset. The stacked variable is the concatenation of the shards.
TensorFlow describes each table's place by a `SparseCoreTableLayout`; the stacker that computes them is
TensorFlow's own, so a configuration gets exactly the layouts it gets on a TPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat
from tf_embed_ops._tf_compat import nest

__all__ = ["Stacking", "compute_stacking", "stack_values", "unstack_value"]


@dataclasses.dataclass
class Stacking:
    """What the stacker decided, keyed as TensorFlow keys it."""

    layouts: dict  # table name -> SparseCoreTableLayout
    stacked_table_to_tables: dict  # stacked name -> [table names], by row offset in a shard
    table_to_stacked_table_offset: dict  # table name -> (stacked name, col offset, col shift)
    feature_to_sample_offset: dict  # feature path -> first sample row of the feature in its stack
    table_to_sample_count: dict  # stacked name -> samples of all its features (one replica)


def compute_stacking(
    feature_config: Any,
    num_replicas: int,
    num_sc_per_chip: int,
    sparse_core_embedding_config: Any,
    apart: frozenset[str] | set[str] = frozenset(),
) -> Stacking:
    """Runs TensorFlow's table stacker on a private copy of `feature_config` (which it mutates).

    Args:
      feature_config: the nest of `FeatureConfig`s (tables named).
      num_replicas, num_sc_per_chip: the SparseCore topology.
      sparse_core_embedding_config: its `disable_table_stacking` is the stacker's.
      apart: names of tables that are never stacked with another: each is laid out by a stacker run of its own
        (its own stacked table, named after it, with the layout TensorFlow gives a table alone). The other tables
        are stacked together exactly as if the `apart` tables were not configured. `TPUEmbeddingV2` keeps its
        tiered tables apart: their rows live in their own row files, not in a stacked variable.

    Raises:
      ValueError: a table kept apart is named like a stacked table of the others (the stack names would clash).
    """
    clone = _tf_compat.clone_feature_config(feature_config)
    tables = []
    for feature in nest.flatten(clone):
        if not any(feature.table is t for t in tables):
            tables.append(feature.table)
    flat_features = nest.flatten_with_joined_string_paths(clone)
    groups = [[t for t in tables if t.name not in apart]] + [[t] for t in tables if t.name in apart]
    out = Stacking({}, {}, {}, {}, {})
    for group in groups:
        if not group:
            continue
        names = {t.name for t in group}
        s = _tf_compat.stack_sparse_core_tables(
            group,
            [(path, f) for path, f in flat_features if f.table.name in names],
            num_replicas,
            num_sc_per_chip,
            sparse_core_embedding_config,
        )
        for name in s.stacked_table_to_tables:
            if name in out.stacked_table_to_tables:
                raise ValueError(
                    f"Table {name!r} is kept apart from the stacking (a tiered table) but the other tables' stacking "
                    f"also makes a stacked table named {name!r}; rename the table."
                )
        out.stacked_table_to_tables.update(
            {
                name: [t.name for t in sorted(ts, key=lambda t: s.table_to_layout[t.name].sparse_core_shard_row_offset)]
                for name, ts in s.stacked_table_to_tables.items()
            }
        )
        out.layouts.update(s.table_to_layout)
        out.table_to_stacked_table_offset.update(s.table_to_stacked_table_offset)
        out.feature_to_sample_offset.update(s.feature_to_sample_offset)
        out.table_to_sample_count.update(s.table_to_sample_count)
    return out


def stack_values(values: list, layouts: list) -> tf.Tensor:
    """Per-table values (unpadded `[vocab, dim]`) -> the stacked variable's value (TensorFlow ops, any context).

    `values` and `layouts` are the tables of one stack, in matching order. Padding rows and columns are zero, as
    TensorFlow's resharding pads them.
    """
    num_sc = layouts[0].num_sparse_cores
    rows_per_shard = layouts[0].total_rows_per_sparse_core_shard
    width = layouts[0].unsharded_padded_shape[1]
    pieces, cursor = [], 0
    for value, layout in sorted(zip(values, layouts, strict=True), key=lambda p: p[1].sparse_core_shard_row_offset):
        value = tf.convert_to_tensor(value)
        rows, cols = layout.unsharded_shape
        if value.shape != (rows, cols):
            raise ValueError(f"Table {layout.table_name!r}: value of shape {value.shape}, layout says {(rows, cols)}.")
        padded_rows, padded_cols = layout.unsharded_padded_shape
        if padded_cols != width:
            raise ValueError(f"Table {layout.table_name!r}: padded width {padded_cols}, its stack's is {width}.")
        size = padded_rows // num_sc
        offset = layout.sparse_core_shard_row_offset
        if offset > cursor:
            pieces.append(tf.zeros([num_sc, offset - cursor, width], value.dtype))
        padded = tf.pad(value, [[0, padded_rows - rows], [0, padded_cols - cols]])
        # Row r goes to shard (r % num_sc + rotation) % num_sc, at position offset + r // num_sc.
        shards = tf.transpose(tf.reshape(padded, [size, num_sc, width]), [1, 0, 2])
        pieces.append(tf.roll(shards, layout.sparse_core_shard_rotation, axis=0))
        cursor = offset + size
    if cursor < rows_per_shard:
        pieces.append(tf.zeros([num_sc, rows_per_shard - cursor, width], pieces[-1].dtype))
    return tf.reshape(tf.concat(pieces, axis=1), [num_sc * rows_per_shard, width])


def unstack_value(stacked: Any, layout: Any) -> tf.Tensor:
    """The stacked variable's value -> one table's unpadded `[vocab, dim]` value (TensorFlow ops)."""
    stacked = tf.convert_to_tensor(stacked)
    num_sc = layout.num_sparse_cores
    total_rows, width = stacked.shape
    if total_rows % num_sc:
        raise ValueError(
            f"Stacked table {layout.stacked_table_name!r} has {total_rows} rows, not a multiple of the "
            f"{num_sc} SparseCores of the layout of table {layout.table_name!r}."
        )
    size = layout.unsharded_padded_shape[0] // num_sc
    offset = layout.sparse_core_shard_row_offset
    rows, cols = layout.unsharded_shape
    if offset + size > total_rows // num_sc or cols > width:
        raise ValueError(
            f"Table {layout.table_name!r} does not fit its layout in a stacked value of shape {stacked.shape}."
        )
    shards = tf.reshape(stacked, [num_sc, total_rows // num_sc, width])[:, offset : offset + size, :]
    shards = tf.roll(shards, -layout.sparse_core_shard_rotation, axis=0)
    table = tf.reshape(tf.transpose(shards, [1, 0, 2]), [size * num_sc, width])
    return table[:rows, :cols]
