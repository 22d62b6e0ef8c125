"""Thin wrappers over the dynamic-table ops (``TfEmbed>Dynamic...``; docs/dynamic_tables_internals.md, "Ops").

One function per op, converting arguments and checking static misuse (``ValueError`` naming the argument); the
ops validate everything else at run time.  The front ends (``DynamicTableConfig``, the trackable table, the
layers) build on these; user code normally does not call them directly.

Keys are int64 or strings.  String keys are fingerprinted inside the ops with TensorFlow's farmhash64, so
:func:`string_keys_to_int64` (plain TensorFlow ops) gives the int64 key a string maps to, e.g. for serving.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import tensorflow as tf

from tf_embed_ops import _loader
from tf_embed_ops.dynamic.fused_ops import (  # re-exported: one module of wrappers for every dynamic-table op
    dynamic_embedding_activations,
    dynamic_send_tpu_embedding_gradients,
)
from tf_embed_ops.dynamic.op_inputs import handle_tensor, keys_tensor, step_tensor
from tf_embed_ops.embedding_ops import (
    checked_int,
)

__all__ = [
    "DynamicTableContents",
    "DynamicTableStats",
    "EvictionLogEntries",
    "dynamic_table_evict_by_score",
    "dynamic_table_export_policy_state",
    "dynamic_table_import_policy_state",
    "dynamic_table_read_log",
    "dynamic_table_row_stats",
    "dynamic_embedding_activations",
    "dynamic_send_tpu_embedding_gradients",
    "dynamic_table_evict",
    "dynamic_table_evict_keys",
    "dynamic_table_export",
    "dynamic_table_find",
    "dynamic_table_handle",
    "dynamic_table_import",
    "dynamic_table_lookup",
    "dynamic_table_stats",
    "dynamic_table_tiered_export_keys",
    "dynamic_table_tiered_import_keys",
    "dynamic_table_tiered_read_rows",
    "dynamic_table_tiered_stats",
    "dynamic_table_tiered_write_rows",
    "string_keys_to_int64",
]

INITIALIZERS = ("zeros", "constant", "uniform", "normal", "truncated_normal")
EVICTION_POLICIES = ("none", "lru", "lfu", "ttl", "l2_norm", "decayed_lfu", "count_and_age")
# The kinds of an eviction-log entry (cc/lib/eviction_log.h LogKind).
LOG_EVICTED, LOG_ERASED, LOG_REFUSED = 0, 1, 2


class DynamicTableStats(NamedTuple):
    """int64 scalars: the table's size and counters (totals since creation or the last import; ``last_step_*``
    for the latest step number the table saw)."""

    size: tf.Tensor
    capacity: tf.Tensor
    memory_bytes: tf.Tensor
    inserts: tf.Tensor
    below_admission: tf.Tensor
    untracked: tf.Tensor
    refused_full: tf.Tensor
    evictions: tf.Tensor
    last_step_inserts: tf.Tensor
    last_step_refused: tf.Tensor
    last_step_evictions: tf.Tensor


class EvictionLogEntries(NamedTuple):
    """What one read of a table's eviction log returns.

    Attributes:
      keys, steps: int64 [m], the entries from the cursor on (the key and the step it was evicted/refused at).
      kinds: int32 [m]: 0 evicted by a policy, 1 removed by key (`evict_keys`), 2 refused admission.
      next_cursor: int64 scalar, the cursor of the next read.
      resync: bool scalar: the cursor wanted entries the log no longer holds (it fell behind by more than the
        log's capacity, or the table was imported/restored): rebuild from the table's content.
      dropped: int64 scalar, how many entries the reader missed.
    """

    keys: tf.Tensor
    steps: tf.Tensor
    kinds: tf.Tensor
    next_cursor: tf.Tensor
    resync: tf.Tensor
    dropped: tf.Tensor


class DynamicTableRowStats(NamedTuple):
    """Every row's statistics in row order: int64 keys, counts, last_steps and float32 L2 norms, each [n]."""

    keys: tf.Tensor
    counts: tf.Tensor
    last_steps: tf.Tensor
    norms: tf.Tensor


class DynamicTableContents(NamedTuple):
    """A table's content sorted by key: what export returns and import takes.

    Attributes:
      keys: int64 [n] (string tables: the fingerprints).
      weights: float32 [n, dim].
      slots: a tuple of S float32 tensors [n, width_k], the optimizer slots in Load/Retrieve order (width_k =
        dim, or 1 for a per-row slot such as row-wise Adagrad's accumulator).
      counts: int64 [n] frequency counts.
      last_steps: int64 [n] the last step each key was seen.
      pending_keys, pending_counts, pending_last_steps: int64 [p], admission counts of keys without a row.
    """

    keys: tf.Tensor
    weights: tf.Tensor
    slots: tuple
    counts: tf.Tensor
    last_steps: tf.Tensor
    pending_keys: tf.Tensor
    pending_counts: tf.Tensor
    pending_last_steps: tf.Tensor


def _ops():
    return _loader.load_ops()


def string_keys_to_int64(keys) -> tf.Tensor:
    """The int64 keys the ops give string ids: ``tf.bitcast(tf.fingerprint(s, "farmhash64"), tf.int64)``.

    Example:
      >>> string_keys_to_int64(tf.constant(["user_1"])).dtype
      tf.int64
    """
    keys = tf.convert_to_tensor(keys, tf.string)
    return tf.reshape(tf.bitcast(tf.fingerprint(tf.reshape(keys, [-1]), "farmhash64"), tf.int64), tf.shape(keys))


def dynamic_table_handle(
    table_name: str,
    dim: int,
    initial_capacity: int,
    max_rows: int,
    key_dtype=tf.int64,
    slot_initial_values: Sequence[float] = (),
    slot_widths: Sequence[int] = (),
    rows_per_chunk: int = 1024,
    initializer: str = "zeros",
    initializer_params: Sequence[float] = (),
    seed: int = 0,
    admission_min_count: int = 1,
    max_pending_keys: int = 0,
    pending_ttl_steps: int = 0,
    eviction: str = "none",
    eviction_max_rows: int = 0,
    eviction_ttl_steps: int = 0,
    eviction_min_norm: float = 0.0,
    eviction_decay: float = 1.0,
    eviction_min_count: int = 0,
    bloom_num_counters: int = 0,
    bloom_num_hashes: int = 0,
    bloom_counter_bits: int = 8,
    log_refused: bool = False,
    eviction_log_capacity: int = 1 << 20,
    container: str = "",
    shared_name: str = "",
    name=None,
    storage_dtype="float32",
    slot_storage_dtype="float32",
    rounding: str = "stochastic",
    tiered_path: str = "",
    tiered_cache_bytes: int = 0,
    tiered_mode: str = "create",
) -> tf.Tensor:
    """Creates (on first run) or looks up the dynamic table ``(container, shared_name)``; returns its handle.

    Every option is validated by the op (InvalidArgument naming ``table_name`` and the value).  A table that
    already exists under ``shared_name`` must have the same options.  An empty ``shared_name`` makes the table
    private to the op's kernel (eager kernels are cached by their attributes, so give eager tables a unique
    ``shared_name``).  Destroy it with ``tf.raw_ops.DestroyResourceOp``.

    Args:
      table_name: names the table in errors.
      dim: embedding dimension.
      initial_capacity: rows allocated up front, in [1, max_rows].
      max_rows: the most rows the table holds.
      key_dtype: ``tf.int64`` or ``tf.string``.
      slot_initial_values: one initial value per optimizer slot, in Load/Retrieve order.
      slot_widths: floats per row of each slot, same order: dim, or 1 for a per-row slot (the optimizer
        schema's `SlotInfo.shape`); empty: every slot is dim wide.  The training ops check them against the config.
      rows_per_chunk: allocation granularity (a power of two).
      initializer: one of "zeros", "constant", "uniform", "normal", "truncated_normal".
      initializer_params: [] / [value] / [minval, maxval] / [mean, stddev] for the initializers above.
      seed: initializer seed (a new row is a function of seed, key and column).
      admission_min_count, max_pending_keys, pending_ttl_steps: frequency admission.
      eviction: one of ``EVICTION_POLICIES`` (applied at the end of every training step).
      eviction_max_rows: target rows of lru / lfu / decayed_lfu.
      eviction_ttl_steps: steps of ttl; max_age_steps of count_and_age.
      eviction_min_norm, eviction_decay, eviction_min_count: l2_norm's threshold, decayed_lfu's factor,
        count_and_age's count.
      bloom_num_counters, bloom_num_hashes, bloom_counter_bits: Bloom admission (0 counters: exact counts).
      log_refused: log refused admissions in the eviction log.
      eviction_log_capacity: entries the eviction log keeps.
      container, shared_name: the resource's name.
      name: op name.
      storage_dtype, slot_storage_dtype: the rows' and slots' element type: float32, bfloat16 or float16
        (dtypes or names).
      rounding: "stochastic" or "nearest": how a 16-bit row is rounded back after each update.
      tiered_path: "" keeps the rows in memory; else the row file of a tiered table (docs/tiered_tables.md): the
        rows and slots on disk behind a DRAM cache of ``tiered_cache_bytes``, the keys in memory.
      tiered_cache_bytes: that cache's DRAM budget.
      tiered_mode: "create" (an existing file is refused) or "overwrite" (it is removed first).

    Returns:
      A scalar resource tensor.

    Raises:
      ValueError: key_dtype other than int64 / string, unknown initializer or eviction policy.

    Example:
      >>> h = dynamic_table_handle("users", dim=8, initial_capacity=1024, max_rows=1 << 20, shared_name="users")
    """
    ints = {
        argument: checked_int(value, argument)
        for argument, value in (
            ("dim", dim),
            ("initial_capacity", initial_capacity),
            ("max_rows", max_rows),
            ("rows_per_chunk", rows_per_chunk),
            ("seed", seed),
            ("admission_min_count", admission_min_count),
            ("max_pending_keys", max_pending_keys),
            ("pending_ttl_steps", pending_ttl_steps),
            ("eviction_max_rows", eviction_max_rows),
            ("eviction_ttl_steps", eviction_ttl_steps),
            ("eviction_min_count", eviction_min_count),
            ("bloom_num_counters", bloom_num_counters),
            ("bloom_num_hashes", bloom_num_hashes),
            ("bloom_counter_bits", bloom_counter_bits),
            ("eviction_log_capacity", eviction_log_capacity),
        )
    }
    widths = [checked_int(w, f"slot_widths[{i}]") for i, w in enumerate(slot_widths)]
    key_dtype = tf.as_dtype(key_dtype)
    if key_dtype not in (tf.int64, tf.string):
        raise ValueError(f"key_dtype: must be tf.int64 or tf.string, got {key_dtype.name}")
    if initializer not in INITIALIZERS:
        raise ValueError(f"initializer: must be one of {INITIALIZERS}, got {initializer!r}")
    if eviction not in EVICTION_POLICIES:
        raise ValueError(f"eviction: must be one of {EVICTION_POLICIES}, got {eviction!r}")
    # Tiered attrs only for a tiered table, so an in-memory table's node is the one older versions wrote.
    tiered = (
        {
            "tiered_path": str(tiered_path),
            "tiered_cache_bytes": checked_int(tiered_cache_bytes, "tiered_cache_bytes"),
            "tiered_mode": tiered_mode,
        }
        if tiered_path
        else {}
    )
    return _ops().tf_embed_dynamic_table_handle(
        table_name=table_name,
        key_dtype=key_dtype,
        slot_initial_values=[float(v) for v in slot_initial_values],
        slot_widths=widths,
        initializer=initializer,
        initializer_params=[float(v) for v in initializer_params],
        eviction=eviction,
        eviction_min_norm=float(eviction_min_norm),
        eviction_decay=float(eviction_decay),
        log_refused=bool(log_refused),
        storage_dtype=tf.as_dtype(storage_dtype).name,
        slot_storage_dtype=tf.as_dtype(slot_storage_dtype).name,
        rounding=rounding,
        **ints,
        **tiered,
        container=container,
        shared_name=shared_name,
        name=name,
    )


def dynamic_table_find(table, keys, name=None) -> tf.Tensor:
    """The row index of each key, -1 where it has none (never inserts).

    Example:
      >>> dynamic_table_find(h, tf.constant([3, 7], tf.int64))
    """
    return _ops().tf_embed_dynamic_table_find(
        table=handle_tensor(table, "table"), keys=keys_tensor(keys, "keys"), name=name
    )


def dynamic_table_lookup(table, keys, name=None) -> tf.Tensor:
    """The weights of each key, [n, dim], zeros where it has no row (never inserts; the serving lookup).

    Example:
      >>> dynamic_table_lookup(h, tf.constant(["a", "b"]))
    """
    return _ops().tf_embed_dynamic_table_lookup(
        table=handle_tensor(table, "table"), keys=keys_tensor(keys, "keys"), name=name
    )


def dynamic_table_stats(table, name=None) -> DynamicTableStats:
    """Size, capacity, memory and counters of the table, as int64 scalars.

    Example:
      >>> int(dynamic_table_stats(h).size)
    """
    return DynamicTableStats(*_ops().tf_embed_dynamic_table_stats(table=handle_tensor(table, "table"), name=name))


def dynamic_table_tiered_stats(table, name=None) -> tf.Tensor:
    """A tiered table's row-cache counters, int64 [10] in `te.tiered.ops.STATS_FIELDS` order (hits, misses,
    rows_read, rows_written, bytes_read, bytes_written, evictions, resident_rows, capacity_rows, pinned_rows);
    InvalidArgument for a table kept in memory.

    Example:
      >>> dynamic_table_tiered_stats(h)[0]  # hits
    """
    return _ops().tf_embed_dynamic_table_tiered_stats(table=handle_tensor(table, "table"), name=name)


def dynamic_table_tiered_export_keys(table, name=None) -> tuple[tf.Tensor, ...]:
    """A tiered table's content without the rows: (keys, counts, last_steps, pending_keys, pending_counts,
    pending_last_steps), keys sorted (the order `dynamic_table_export` gives); InvalidArgument for a table kept in
    memory.

    Example:
      >>> keys, counts, last_steps, *pending = dynamic_table_tiered_export_keys(h)
    """
    return tuple(_ops().tf_embed_dynamic_table_tiered_export_keys(table=handle_tensor(table, "table"), name=name))


def dynamic_table_tiered_import_keys(
    table, keys, counts, last_steps, pending_keys, pending_counts, pending_last_steps, name=None
):
    """Replaces a tiered table's content with keys and metadata alone (validated as `dynamic_table_import`; a
    rejected import changes nothing); the rows' values are then written with `dynamic_table_tiered_write_rows`.

    Example:
      >>> dynamic_table_tiered_import_keys(h, *dynamic_table_tiered_export_keys(other))
    """
    names = ("keys", "counts", "last_steps", "pending_keys", "pending_counts", "pending_last_steps")
    values = (keys, counts, last_steps, pending_keys, pending_counts, pending_last_steps)
    args = {k: tf.convert_to_tensor(v, tf.int64) for k, v in zip(names, values, strict=True)}
    return _ops().tf_embed_dynamic_table_tiered_import_keys(table=handle_tensor(table, "table"), name=name, **args)


def dynamic_table_tiered_read_rows(table, keys, num_slots: int = 0, name=None) -> tuple[tf.Tensor, list]:
    """The rows of `keys` (int64, as the table stores them; each must have a row) of a tiered table, read through
    its cache without filling it: (weights [n, dim], [one [n, width] tensor per slot]), float32.

    Example:
      >>> weights, slots = dynamic_table_tiered_read_rows(h, keys[:1024], num_slots=1)
    """
    out = _ops().tf_embed_dynamic_table_tiered_read_rows(
        table=handle_tensor(table, "table"),
        keys=tf.convert_to_tensor(keys, tf.int64),
        num_slots=checked_int(num_slots, "num_slots", 0),
        name=name,
    )
    return out[0], list(out[1])


def dynamic_table_tiered_write_rows(table, keys, weights, slots=(), name=None):
    """Writes the rows of `keys` (each must have a row, once) of a tiered table from float32 weights [n, dim] and
    slots (one [n, width] per optimizer slot); checked before the first row is written.

    Example:
      >>> dynamic_table_tiered_write_rows(h, keys, weights, [accumulators])
    """
    return _ops().tf_embed_dynamic_table_tiered_write_rows(
        table=handle_tensor(table, "table"),
        keys=tf.convert_to_tensor(keys, tf.int64),
        weights=tf.convert_to_tensor(weights, tf.float32),
        slots=[tf.convert_to_tensor(s, tf.float32) for s in slots],
        name=name,
    )


def dynamic_table_export(table, num_slots: int = 0, name=None) -> DynamicTableContents:
    """The whole content sorted by key (see :class:`DynamicTableContents`).

    Args:
      table: the handle.
      num_slots: the table's optimizer slot count (the length of the slots list; the op checks it and refuses
        another, naming the table).  0: a table without slots (lookup only).
      name: op name.

    Example:
      >>> contents = dynamic_table_export(h, num_slots=1)
    """
    out = _ops().tf_embed_dynamic_table_export(
        table=handle_tensor(table, "table"), num_slots=checked_int(num_slots, "num_slots", 0), name=name
    )
    return DynamicTableContents(*out[:2], tuple(out[2]), *out[3:])


def dynamic_table_import(table, contents: DynamicTableContents | Sequence, name=None):
    """Replaces the table's content (validated first: a rejected import changes nothing; counters restart).

    Args:
      table: the handle.
      contents: a :class:`DynamicTableContents` or the same eight fields in that order (slots: a sequence of
        [n, width_k] tensors, one per optimizer slot).
      name: op name.

    Returns:
      The import op (eagerly: None).

    Example:
      >>> dynamic_table_import(h, dynamic_table_export(other))
    """
    contents = tuple(contents)
    if len(contents) != len(DynamicTableContents._fields):
        raise ValueError(f"contents: expected {len(DynamicTableContents._fields)} tensors, got {len(contents)}")
    dtypes = (tf.int64, tf.float32, None, tf.int64, tf.int64, tf.int64, tf.int64, tf.int64)
    args = {
        field: [tf.convert_to_tensor(s, tf.float32) for s in value]
        if dtype is None
        else tf.convert_to_tensor(value, dtype)
        for field, value, dtype in zip(DynamicTableContents._fields, contents, dtypes, strict=True)
    }
    return _ops().tf_embed_dynamic_table_import(table=handle_tensor(table, "table"), name=name, **args)


def dynamic_table_evict(
    table,
    step,
    policy: str,
    max_rows: int = 0,
    ttl_steps: int = 0,
    min_norm: float = 0.0,
    decay: float = 1.0,
    min_count: int = 0,
    name=None,
) -> tf.Tensor:
    """Evicts rows now by ``policy`` ("lru" / "lfu" / "decayed_lfu" down to ``max_rows`` rows, "ttl", "l2_norm",
    "count_and_age"); returns how many.

    Example:
      >>> dynamic_table_evict(h, step=10, policy="ttl", ttl_steps=5)
    """
    if policy not in EVICTION_POLICIES[1:]:
        raise ValueError(f"policy: must be one of {EVICTION_POLICIES[1:]}, got {policy!r}")
    max_rows, ttl_steps = checked_int(max_rows, "max_rows"), checked_int(ttl_steps, "ttl_steps")
    return _ops().tf_embed_dynamic_table_evict(
        table=handle_tensor(table, "table"),
        step=step_tensor(step),
        policy=policy,
        max_rows=max_rows,
        ttl_steps=ttl_steps,
        min_norm=float(min_norm),
        decay=float(decay),
        min_count=checked_int(min_count, "min_count"),
        name=name,
    )


def dynamic_table_read_log(table, cursor, max_entries: int = -1, name=None) -> EvictionLogEntries:
    """Reads the table's eviction log from ``cursor`` (changes nothing: each reader keeps its own cursor).

    Example:
      >>> entries = dynamic_table_read_log(h, cursor=0); cursor = entries.next_cursor
    """
    out = _ops().tf_embed_dynamic_table_read_log(
        table=handle_tensor(table, "table"),
        cursor=step_tensor(cursor),
        max_entries=checked_int(max_entries, "max_entries"),
        name=name,
    )
    return EvictionLogEntries(*out)


def dynamic_table_row_stats(table, name=None) -> DynamicTableRowStats:
    """Every row's key, count, last step and L2 norm (row order), for a user score.

    Example:
      >>> stats = dynamic_table_row_stats(h)
    """
    return DynamicTableRowStats(
        *_ops().tf_embed_dynamic_table_row_stats(table=handle_tensor(table, "table"), name=name)
    )


def dynamic_table_evict_by_score(table, keys, scores, step, max_rows: int, name=None) -> tf.Tensor:
    """Evicts the lowest-scored of these keys' rows until at most ``max_rows`` rows remain; returns how many.

    Example:
      >>> dynamic_table_evict_by_score(h, stats.keys, scores, step=3, max_rows=1000)
    """
    return _ops().tf_embed_dynamic_table_evict_by_score(
        table=handle_tensor(table, "table"),
        keys=tf.convert_to_tensor(keys, tf.int64),
        scores=tf.convert_to_tensor(scores, tf.float32),
        step=step_tensor(step),
        max_rows=checked_int(max_rows, "max_rows"),
        name=name,
    )


def dynamic_table_export_policy_state(table, name=None) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(bloom_counters uint8 [B], decayed_keys int64 [n], decayed_counts float32 [n]) of the table.

    Example:
      >>> bloom, keys, decayed = dynamic_table_export_policy_state(h)
    """
    return tuple(_ops().tf_embed_dynamic_table_export_policy_state(table=handle_tensor(table, "table"), name=name))


def dynamic_table_import_policy_state(table, bloom_counters, decayed_keys, decayed_counts, name=None):
    """Restores the policy state after an import; ``bloom_counters`` is [parts, B] (several parts are added).

    Example:
      >>> dynamic_table_import_policy_state(h, bloom[None], keys, decayed)
    """
    return _ops().tf_embed_dynamic_table_import_policy_state(
        table=handle_tensor(table, "table"),
        bloom_counters=tf.convert_to_tensor(bloom_counters, tf.uint8),
        decayed_keys=tf.convert_to_tensor(decayed_keys, tf.int64),
        decayed_counts=tf.convert_to_tensor(decayed_counts, tf.float32),
        name=name,
    )


def dynamic_table_evict_keys(table, keys, name=None) -> tf.Tensor:
    """Removes these keys' rows (absent keys ignored); returns how many rows were evicted.

    Example:
      >>> dynamic_table_evict_keys(h, tf.constant([3], tf.int64))
    """
    return _ops().tf_embed_dynamic_table_evict_keys(
        table=handle_tensor(table, "table"), keys=keys_tensor(keys, "keys"), name=name
    )


for _op in (
    "DynamicTableHandle",
    "DynamicEmbeddingActivations",
    "DynamicSendTPUEmbeddingGradients",
    "DynamicTableFind",
    "DynamicTableLookup",
    "DynamicTableStats",
    "DynamicTableExport",
    "DynamicTableImport",
    "DynamicTableEvict",
    "DynamicTableEvictKeys",
    "DynamicTableReadLog",
    "DynamicTableRowStats",
    "DynamicTableEvictByScore",
    "DynamicTableExportPolicyState",
    "DynamicTableImportPolicyState",
):
    tf.no_gradient("TfEmbed>" + _op)
