"""Thin wrappers over the tiered-table ops (``TfEmbed>Tiered...``; docs/tiered_tables.md, "Ops").

One function per op: arguments converted, static misuse a ``ValueError`` naming the argument; the ops validate
everything else at run time (before their first write). `TieredTable` and `TieredGroup` build on these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import tensorflow as tf

from tf_embed_ops import _loader
from tf_embed_ops.dynamic.op_inputs import feature_arguments, handle_tensor, handle_tensors
from tf_embed_ops.embedding_ops import (
    as_feature_inputs,
    checked_combiners,
    checked_int,
    int64_scalar,
    learning_rate_values,
    serialized_config,
)

__all__ = [
    "MODES",
    "STAT_NAMES",
    "STORAGE_TYPES",
    "TieredTableStats",
    "tiered_embedding_activations",
    "tiered_send_tpu_embedding_gradients",
    "tiered_table_flush",
    "tiered_table_gather_rows",
    "tiered_table_handle",
    "tiered_table_mark_all_touched",
    "tiered_table_prefetch",
    "tiered_table_read_rows",
    "tiered_table_stats",
    "tiered_table_write_rows",
]

MODES = ("create", "open")
STORAGE_TYPES = ("float32", "bfloat16", "float16")


class TieredTableStats(NamedTuple):
    """The op's cumulative int64 counters (since the table was created or opened), in its output order."""

    hits: tf.Tensor
    misses: tf.Tensor
    rows_read: tf.Tensor
    rows_written: tf.Tensor
    bytes_read: tf.Tensor
    bytes_written: tf.Tensor
    evictions: tf.Tensor
    resident_rows: tf.Tensor
    capacity_rows: tf.Tensor
    pinned_rows: tf.Tensor


STAT_NAMES = TieredTableStats._fields


def _ops():
    return _loader.load_ops()


def _row(value, argument: str, table_name: str | None = None) -> tf.Tensor:
    """A row number or count as an int64 scalar tensor; errors name the table when the caller knows it."""
    where = argument if table_name is None else f"tiered table {table_name!r}: {argument}"
    return int64_scalar(value, where, 0)


def tiered_table_handle(
    table_name: str,
    path: str,
    num_rows: int,
    dim: int,
    cache_bytes: int,
    mode: str,
    slot_widths: Sequence[int] = (),
    storage_types: Sequence[str] = ("float32",),
    container: str = "",
    shared_name: str = "",
    name=None,
) -> tf.Tensor:
    """Creates (on first run) or looks up the tiered table ``(container, shared_name)``; returns its handle.

    Args:
      table_name: names the table in errors.
      path: the row file.
      num_rows: rows of the table (its vocabulary size).
      dim: embedding dimension.
      cache_bytes: the DRAM cache's budget in bytes.
      mode: "create" (a new row file; an existing one is refused) or "open" (its header is checked).
      slot_widths: floats per row of each optimizer slot (Load/Retrieve order): dim, or 1 for a per-row slot.
      storage_types: one per buffer (the table, then each slot): "float32", "bfloat16" or "float16".
      container, shared_name: the resource's name.
      name: op name.

    Returns:
      A scalar resource tensor.

    Raises:
      ValueError: an unknown mode or storage type, or a list of storage types of the wrong length.

    Example:
      >>> h = tiered_table_handle("user", "/tmp/user.rows", 10**6, 16, 64 << 20, "create", shared_name="user")
    """
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
    widths = [checked_int(w, f"slot_widths[{i}]", 1) for i, w in enumerate(slot_widths)]
    types = [tf.as_dtype(t).name for t in storage_types]
    if any(t not in STORAGE_TYPES for t in types):
        raise ValueError(f"storage_types: each must be one of {STORAGE_TYPES}, got {types}")
    if len(types) != 1 + len(widths):
        raise ValueError(f"storage_types: expected one per buffer (1 + {len(widths)} slots), got {len(types)}")
    return _ops().tf_embed_tiered_table_handle(
        table_name=table_name,
        path=path,
        num_rows=checked_int(num_rows, "num_rows", 1),
        dim=checked_int(dim, "dim", 1),
        slot_widths=widths,
        storage_types=types,
        cache_bytes=checked_int(cache_bytes, "cache_bytes", 1),
        mode=mode,
        container=container,
        shared_name=shared_name,
        name=name,
    )


def tiered_table_write_rows(table, first_row, values, slots: Sequence = (), name=None, table_name=None):
    """Writes rows ``[first_row, first_row + n)`` and their slots (float32 in, rounded to nearest into storage).

    Args:
      table: the handle.
      first_row: int64 scalar >= 0.
      values: float32 [n, dim].
      slots: one float32 [n, width_k] per optimizer slot.
      name: op name.
      table_name: the table's name, for the errors raised here (the op's own errors always name it).

    Returns:
      The op (eagerly: None).

    Raises:
      ValueError: first_row is not an integer scalar >= 0 (naming the table when `table_name` is given).

    Example:
      >>> tiered_table_write_rows(h, 0, tf.zeros([4, 16]), [tf.fill([4, 16], 0.1)])
    """
    return _ops().tf_embed_tiered_table_write_rows(
        table=handle_tensor(table, "table", "tiered"),
        first_row=_row(first_row, "first_row", table_name),
        values=tf.convert_to_tensor(values, tf.float32),
        slots=[tf.convert_to_tensor(s, tf.float32) for s in slots],
        name=name,
    )


def tiered_table_mark_all_touched(table, name=None):
    """Marks every row of the table changed for its touched-row trackers (docs/tracking.md): each consumer's next
    `changed_since` reads `full`. A streamed restore calls it after its last chunk; a no-op for an untracked table.

    Args:
      table: the handle (or an object with `.handle`).
      name: op name.

    Returns:
      The op (eagerly: None).

    Example:
      >>> tiered_table_mark_all_touched(h)
    """
    return _ops().tf_embed_tiered_table_mark_all_touched(table=handle_tensor(table, "table", "tiered"), name=name)


def tiered_table_read_rows(
    table, first_row, num_rows, num_slots: int, name=None, table_name=None
) -> tuple[tf.Tensor, list]:
    """Rows ``[first_row, first_row + num_rows)`` and their slots as float32 (read through the cache's dirty rows;
    the cache is not filled).

    `table_name` names the table in the errors raised here (the op's own errors always name it).

    Returns:
      (values [n, dim], [slot k: [n, width_k]]).

    Raises:
      ValueError: first_row or num_rows is not an integer scalar >= 0.

    Example:
      >>> values, slots = tiered_table_read_rows(h, 0, 4, num_slots=1)
    """
    values, slots = _ops().tf_embed_tiered_table_read_rows(
        table=handle_tensor(table, "table", "tiered"),
        first_row=_row(first_row, "first_row", table_name),
        num_rows=_row(num_rows, "num_rows", table_name),
        S=checked_int(num_slots, "num_slots", 0),
        name=name,
    )
    return values, list(slots)


def tiered_table_gather_rows(table, rows, num_slots: int, name=None, table_name=None) -> tuple[tf.Tensor, list]:
    """The given rows (any order, duplicates allowed) and their slots as float32, read through the cache's dirty
    rows without filling the cache (touched-row deltas, docs/tracking.md).

    Args:
      table: a tiered table handle (or an object with `.handle`).
      rows: int vector of row ids, each in [0, num_rows) (checked by the op before anything is read).
      num_slots: the table's slot count.
      table_name: the table's name, for the errors raised here (the op's own errors always name it).

    Returns:
      (values [n, dim], [slot k: [n, width_k]]).

    Raises:
      ValueError: rows is not an integer vector (naming the table when `table_name` is given).
      tf.errors.InvalidArgumentError: a row id outside the table (naming the table and the id).

    Example:
      >>> values, slots = tiered_table_gather_rows(h, [3, 7, 42], num_slots=1)
    """
    where = "rows" if table_name is None else f"tiered table {table_name!r}: rows"
    rows = tf.convert_to_tensor(rows)
    if not rows.dtype.is_integer:
        raise ValueError(f"{where}: must be integers, got {rows.dtype.name}")
    if rows.shape.rank not in (None, 1):
        raise ValueError(f"{where}: must be a vector, got shape {rows.shape}")
    values, slots = _ops().tf_embed_tiered_table_gather_rows(
        table=handle_tensor(table, "table", "tiered"),
        rows=tf.cast(rows, tf.int64),
        S=checked_int(num_slots, "num_slots", 0),
        name=name,
    )
    return values, list(slots)


def tiered_table_prefetch(table, ids, name=None):
    """Makes the rows of ``ids`` resident in the cache (not pinned): the next step's reads then hit.

    Example:
      >>> tiered_table_prefetch(h, next_batch_ids)
    """
    ids = tf.convert_to_tensor(ids)
    if not ids.dtype.is_integer:
        raise ValueError(f"ids: must be integers, got {ids.dtype.name}")
    return _ops().tf_embed_tiered_table_prefetch(
        table=handle_tensor(table, "table", "tiered"), ids=tf.reshape(tf.cast(ids, tf.int64), [-1]), name=name
    )


def tiered_table_flush(table, name=None):
    """Writes every dirty cached row back to the row file and syncs it.

    Example:
      >>> tiered_table_flush(h)
    """
    return _ops().tf_embed_tiered_table_flush(table=handle_tensor(table, "table", "tiered"), name=name)


def tiered_table_stats(table, name=None) -> TieredTableStats:
    """The table's cumulative counters as int64 scalars.

    Example:
      >>> int(tiered_table_stats(h).hits)
    """
    stats = _ops().tf_embed_tiered_table_stats(table=handle_tensor(table, "table", "tiered"), name=name)
    return TieredTableStats(*tf.unstack(stats, num=len(STAT_NAMES)))


def tiered_embedding_activations(features, tables, config, combiners=None, name=None) -> list[tf.Tensor]:
    """Looks up and combines every feature's embeddings over tiered tables (the forward pass).

    As :func:`tf_embed_ops.embedding_ops.embedding_activations`, with tiered table handles in place of the table
    variables. An id outside ``[0, num_rows)`` is an InvalidArgument naming the feature and the table.

    Example:
      >>> acts = tiered_embedding_activations([normalize_feature(ids)], [h], config)
    """
    with tf.name_scope(name or "tiered_embedding_activations"):
        feats = as_feature_inputs(features, "features")
        return _ops().tf_embed_tiered_embedding_activations(
            **feature_arguments(feats),
            tables=handle_tensors(tables, "tables", "tiered"),
            config=serialized_config(config),
            combiners=checked_combiners(combiners),
        )


def tiered_send_tpu_embedding_gradients(
    gradients,
    learning_rates,
    features,
    tables,
    step,
    config,
    combiners=None,
    check_numerics=False,
    rounding=None,
    rounding_table_ids=None,
    name=None,
    validate_only=False,
):
    """Applies one training step to tiered tables in place (the rows a step needs are made resident first).

    As :func:`tf_embed_ops.embedding_ops.send_tpu_embedding_gradients` with tiered table handles (which hold
    their optimizer slots) in place of the variables. A rejected call changes no row.

    Args:
      gradients, learning_rates, features, config, combiners, check_numerics: as for the static op.
      tables: tiered table handles, in table order.
      step: int64 scalar >= 0: keys stochastic rounding's random bits of 16-bit tables (the in-memory table's
        rounding step).
      rounding: per table, "stochastic" or "nearest" (None: all "stochastic").
      rounding_table_ids: per table, the table index that keys its stochastic rounding (None: its index here):
        the index the table has among all the tables of its `TPUEmbedding`, so its bits are those the same
        table draws in memory.
      name: op name.
      validate_only: run every check and write nothing.

    Returns:
      The update op (eagerly: None after it ran).

    Example:
      >>> tiered_send_tpu_embedding_gradients(grads, [], feats, [h], 0, config)
    """
    with tf.name_scope(name or "tiered_send_tpu_embedding_gradients"):
        feats = as_feature_inputs(features, "features")
        grads = [tf.convert_to_tensor(g, tf.float32) for g in gradients]
        if len(grads) != len(feats):
            raise ValueError(f"gradients: expected one per feature ({len(feats)}), got {len(grads)}")
        handles = handle_tensors(tables, "tables", "tiered")
        rounding = list(rounding or [])
        if rounding and len(rounding) != len(handles):
            raise ValueError(f"rounding: expected one per table ({len(handles)}), got {len(rounding)}")
        table_ids = [checked_int(t, "rounding_table_ids", 0) for t in (rounding_table_ids or [])]
        if table_ids and len(table_ids) != len(handles):
            raise ValueError(f"rounding_table_ids: expected one per table ({len(handles)}), got {len(table_ids)}")
        return _ops().tf_embed_tiered_send_tpu_embedding_gradients(
            inputs=grads,
            learning_rates=learning_rate_values(learning_rates),
            **feature_arguments(feats),
            tables=handles,
            step=_row(step, "step"),
            config=serialized_config(config),
            combiners=checked_combiners(combiners),
            check_numerics=bool(check_numerics),
            validate_only=bool(validate_only),
            rounding=rounding,
            rounding_table_ids=table_ids,
        )


for _op in (
    "TieredTableHandle",
    "TieredTableWriteRows",
    "TieredTableMarkAllTouched",
    "TieredTableReadRows",
    "TieredTablePrefetch",
    "TieredTableFlush",
    "TieredTableStats",
    "TieredEmbeddingActivations",
    "TieredSendTPUEmbeddingGradients",
):
    tf.no_gradient("TfEmbed>" + _op)
