"""`DynamicTable`: one dynamic-vocabulary table as a trackable TensorFlow resource.

The table itself lives in a C++ resource (`TfEmbed>DynamicTableHandle`); this object owns its lifetime, the step
counter the training ops stamp rows with, and its checkpoint. It follows TensorFlow's own
`tf.lookup.experimental.MutableHashTable`: a `TrackableResource` whose `_create_resource` makes the handle (so a
SavedModel or a `tf.function` captures it like any resource), `_destroy_resource` releases it, and
`_serialize_to_tensors` / `_restore_from_tensors` are the checkpoint.

Checkpoint format (the same for any number of shards, so checkpoints move between shard counts):

| tensor | shape | |
| --- | --- | --- |
| `keys` | [n] int64 | sorted ascending |
| `weights` | [n, dim] float32 | row of `keys[i]` |
| `slots` | [n, W] float32 | optimizer slots side by side (Load/Retrieve order), W = sum of `slot_widths` |

A slot is `dim` columns, or 1 for a per-row slot (row-wise Adagrad's accumulator); the op's export and import take
one [n, width] tensor per slot, split and joined here.
| `counts`, `last_steps` | [n] int64 | admission count and last step seen, per row |
| `pending_keys`, `pending_counts`, `pending_last_steps` | [p] int64 | admission counters of keys without a row |
| `step` | [] int64 | the step counter |
| `bloom_counters` | [S, B] uint8 | only with `BloomAdmission`: the packed filter of each of the S shards saved |
| `decayed_keys`, `decayed_counts` | [n] int64, float32 | only with `DecayedLFU`: each row's decayed count |

A Bloom filter restores exactly into the same shard count; into another, each shard takes the saturating sum of
the saved filters (a key's estimate never drops, so no key that reached `min_count` loses its admission).

A tiered table (`storage=te.Tiered`) writes the same tensors through a registered saver, `weights` and `slots` as
row slices one chunk at a time (`tiered_checkpoint`): either kind restores the other's checkpoint.

Restoring keeps the keys of this shard (`shard_of_keys(key, num_shards) == shard_index`), so a checkpoint of
one table restores into N shards and the reverse; `ShardedDynamicTable` writes the union of its shards, sorted,
and reads it back into any shard count. A checkpoint of another `dim` or slot layout (W) is refused, naming the
table, before anything is written.

Example:
    >>> table = DynamicTable(te.DynamicTableConfig(name="user", dim=8, optimizer=te.optimizers.Adagrad(0.1)))
    >>> tf.train.Checkpoint(user=table).write("/tmp/ckpt")
    >>> table.stats()["size"]
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops.backends.table_resource import TableResource
from tf_embed_ops.dynamic import checkpoint_check, eviction, tiered_checkpoint
from tf_embed_ops.dynamic import config as config_lib
from tf_embed_ops.dynamic import ops as _ops
from tf_embed_ops.dynamic.table_state import (
    CHECKPOINT_TENSORS,
    EXPORT_TENSORS,
    CheckpointTensors,  # re-exported: their documented home was this module
    all_eager,
    check_contents_shapes,
    checked_step,
    complete_contents,
    policy_state_checks,
    policy_tensor_names,
    restrict_to_shard,
    tensor_shapes,
    variable_name,
)
from tf_embed_ops.tiered import config as tiered_config
from tf_embed_ops.tiered import table as tiered_table

__all__ = ["CHECKPOINT_TENSORS", "EXPORT_TENSORS", "DynamicTable", "policy_tensor_names", "restrict_to_shard"]

_uid = itertools.count()


class DynamicTable(CheckpointTensors, TableResource):
    """One dynamic-vocabulary table (or one shard of it) as a TensorFlow resource.

    Args:
      config: a `te.DynamicTableConfig`.
      num_shards: how many shards the table is split into by key (`shard_of_keys`); 1 for an unsharded table.
      shard_index: which shard this object holds, in [0, num_shards).
      name: the resource's shared name prefix (default: the table's name).
      optimizer: the optimizer that trains the table when `config.optimizer` is None (it decides the slots).

    Attributes:
      handle: the resource handle the ops take.
      config: the configuration.
      step: int64 `tf.Variable`, the step the training ops stamp rows with; saved in the checkpoint.

    Raises:
      ValueError: if `num_shards` < 1 or `shard_index` is outside [0, num_shards).
    """

    def __init__(
        self,
        config: Any,
        *,
        num_shards: int = 1,
        shard_index: int = 0,
        name: str | None = None,
        optimizer: Any = None,
    ):
        if int(num_shards) < 1:
            raise ValueError(f"DynamicTable {config.name!r}: num_shards must be >= 1, got {num_shards}")
        if not 0 <= int(shard_index) < int(num_shards):
            raise ValueError(
                f"DynamicTable {config.name!r}: shard_index must be in [0, {num_shards}), got {shard_index}"
            )
        self._config = config
        self._attrs = dict(config_lib.handle_attrs(config, optimizer))
        self._attrs.pop("shared_name", None)
        # A tiered table (docs/tiered_tables.md): its row file's directory must exist before the handle op runs.
        self._tiered = tiered_config.storage_of(config)
        if self._tiered is not None and int(num_shards) != 1:
            raise ValueError(
                f"DynamicTable {config.name!r}: a tiered table (storage=te.Tiered) cannot be sharded "
                f"(num_shards={num_shards}); train it unsharded with te.TPUEmbedding."
            )
        if self._tiered is not None:
            os.makedirs(self._tiered.directory, exist_ok=True)
        self._num_shards = int(num_shards)
        self._shard_index = int(shard_index)
        base = name or config.name
        self._table_name = self._attrs.get("table_name", config.name)
        # One resource per object: a process-unique shared name, as MutableHashTable does in eager mode.
        self._shared_name = f"{base}_dynamic_table_{next(_uid)}"
        super().__init__()
        # The step is saved inside the table's own checkpoint tensors (not as a variable dependency), so a sharded
        # table's one saved step restores into every shard, whatever the shard count.
        with tf.init_scope():
            self._step = tf.Variable(tf.constant(0, tf.int64), trainable=False, name=f"{variable_name(base)}_step")
            # evicted_keys()'s own cursor into the table's eviction log (not checkpointed: a restore restarts
            # the log).
            self._log_cursor = tf.Variable(
                tf.constant(0, tf.int64), trainable=False, name=f"{variable_name(base)}_log_cursor"
            )
            # A tiered table's cache counters at the previous write_summaries (its per-interval deltas).
            self._cache_summarized = (
                tiered_table.new_summarized_stats(f"{variable_name(base)}_cache_summarized")
                if self._tiered is not None
                else None
            )

    # ------------------------------------------------------------------------------------------ the resource
    def _create_resource(self) -> tf.Tensor:
        return _ops.dynamic_table_handle(shared_name=self._shared_name, **self._attrs)

    # --------------------------------------------------------------------------------------- public surface
    @property
    def step(self) -> tf.Variable:
        return self._step

    @property
    def dim(self) -> int:
        return int(self._attrs["dim"])

    @property
    def num_slots(self) -> int:
        return len(self._attrs.get("slot_initial_values", ()))

    @property
    def slot_widths(self) -> list[int]:
        """Floats per row of each optimizer slot (dim, or 1 for a per-row slot), Load/Retrieve order."""
        widths = list(self._attrs.get("slot_widths", ()))
        return widths or [self.dim] * self.num_slots

    @property
    def max_rows(self) -> int:
        return int(self._attrs["max_rows"])

    @property
    def key_dtype(self) -> tf.DType:
        return tf.as_dtype(self._attrs.get("key_dtype", tf.int64))

    @property
    def num_shards(self) -> int:
        return self._num_shards

    @property
    def shard_index(self) -> int:
        return self._shard_index

    def size(self) -> tf.Tensor:
        """Rows in the table now (int64 scalar)."""
        return self.stats()["size"]

    def stats(self) -> dict[str, tf.Tensor]:
        """The table's counters as int64 scalars, loggable with `tf.summary.scalar` (see `write_summaries`).

        Totals since creation (or the last import): `inserts`, `refused` (keys seen without reaching admission:
        `below_admission` plus `untracked`, keys that found the admission counters full), `refused_full` (admitted
        but the table was at `max_rows`), `evictions`. The latest step's: `last_step_inserts`,
        `last_step_refused` (keys refused for space), `last_step_evictions`. State: `size`, `capacity` (rows allocated),
        `memory_bytes` (everything the table holds).
        """
        with tf.name_scope(f"{variable_name(self._table_name)}_stats"):
            out = _ops.dynamic_table_stats(self.resource_handle)._asdict()
        out["refused"] = out["below_admission"] + out["untracked"]
        return out

    def write_summaries(self, step: Any = None) -> Any:
        """Writes every `stats()` counter with `tf.summary.scalar` under `dynamic_tables/<table>/<counter>`, and
        for a tiered table its cache's statistics as a static tiered table writes them
        (`tiered.TieredTable.write_summaries`, under `tiered_tables/<table>/`).

        Args:
          step: the summary step (default: the table's step counter).

        Returns:
          A tiered table's update of its remembered cache counters (eagerly, or without tiering: None).
        """
        step = self._step if step is None else step
        for key, value in self.stats().items():
            tf.summary.scalar(f"dynamic_tables/{self._table_name}/{key}", value, step=step)
        if self._tiered is None:
            return None
        current = _ops.dynamic_table_tiered_stats(self.resource_handle)
        return tiered_table.write_cache_summaries(self._table_name, current, self._cache_summarized, step)

    @property
    def tiered(self) -> tiered_config.Tiered | None:
        """The table's `te.Tiered` storage, or None when its rows are in memory."""
        return self._tiered

    @property
    def streams_checkpoint(self) -> bool:
        """Whether a checkpoint streams the table (its registered saver: tiered), or holds it as tensors."""
        return self._tiered is not None

    @property
    def bloom_bytes(self) -> int:
        """Bytes of the table's Bloom admission filter (0 without Bloom admission)."""
        return checkpoint_check.bloom_bytes(self._attrs)

    @property
    def policy_tensor_names(self) -> tuple[str, ...]:
        """The checkpoint tensors the table's lifecycle policies add (`policy_tensor_names`)."""
        return policy_tensor_names(self._config)

    def cache_stats(self) -> dict[str, tf.Tensor]:
        """A tiered table's row-cache counters, as `tiered.TieredTable.stats()` gives a static tiered table's
        (`hits`, `misses`, `rows_read`, `rows_written`, `bytes_read`, `bytes_written`, `evictions`,
        `resident_rows`, `capacity_rows`, `pinned_rows`, `hit_rate`).

        Raises:
          ValueError: for a table kept in memory.
        """
        if self._tiered is None:
            raise ValueError(f"DynamicTable {self._table_name!r} is kept in memory (storage=None): no row cache.")
        return tiered_table.cache_stats_dict(_ops.dynamic_table_tiered_stats(self.resource_handle))

    def lookup(self, ids: Any) -> tf.Tensor:
        """Serving lookup: each id's row, shape ids.shape + [dim]; zeros for ids without a row. Never inserts."""
        ids = self.check_ids(ids)
        flat = tf.reshape(ids, [-1])
        rows = _ops.dynamic_table_lookup(self.resource_handle, flat)
        return tf.reshape(rows, tf.concat([tf.shape(ids, out_type=tf.int32), [self.dim]], 0))

    def find(self, ids: Any) -> tf.Tensor:
        """Row index of each id (-1 for none), shape ids.shape. Never inserts."""
        ids = self.check_ids(ids)
        rows = _ops.dynamic_table_find(self.resource_handle, tf.reshape(ids, [-1]))
        return tf.reshape(rows, tf.shape(ids))

    def evict(self, policy: Any = None, step: Any = None) -> tf.Tensor:
        """Applies an eviction policy now; returns how many rows it evicted.

        Args:
          policy: `te.dynamic.LRU(max_rows)`, `LFU(max_rows)` or `TTL(steps)`; default the table's own policy.
          step: the step TTL measures age against (default: the step counter).

        Raises:
          ValueError: if `policy` is None and the table has no eviction policy, or `policy` is not a policy.
        """
        if policy is None:
            policy = getattr(self._config, "eviction", None)
            if policy is None:
                raise ValueError(f"DynamicTable {self._table_name!r}: evict() needs a policy; the table has none")
        step = self._step.read_value() if step is None else step
        return eviction.evict(self.resource_handle, f"DynamicTable {self._table_name!r}", policy, step)

    def evicted_keys(self, include_refused: bool = False, strict: bool = True) -> tuple[tf.Tensor, tf.Tensor]:
        """The keys evicted since the previous call, with the step of each eviction.

        Reads the table's eviction log from this object's own cursor (other readers of the log, such as the
        serving publisher, keep theirs). Policy evictions, `evict()` and `evict_keys()` are reported; refused
        admissions too with `include_refused=True` when the admission policy has `log_refused=True`. A restore
        or `import_` restarts the log (what was evicted before it is not reported).

        Args:
          include_refused: also return the keys a training lookup refused a row.
          strict: raise when the log dropped entries this cursor had not read (more than the table's
            `eviction_log_capacity` since the previous call); False returns what the log still holds.

        Returns:
          (keys int64 [m], steps int64 [m]), in the order they happened (per shard).

        Raises:
          tf.errors.InvalidArgumentError: (strict) entries were dropped before this call read them.
        """
        return eviction.read_log(
            self.resource_handle,
            f"DynamicTable {self._table_name!r}",
            self._log_cursor,
            self._attrs.get("eviction_log_capacity"),
            include_refused,
            strict,
        )

    def evict_keys(self, ids: Any) -> tf.Tensor:
        """Removes these ids' rows (ids without a row are ignored); returns how many rows were removed."""
        ids = self.check_ids(ids)
        return _ops.dynamic_table_evict_keys(self.resource_handle, tf.reshape(ids, [-1]))

    def export(self) -> dict[str, tf.Tensor]:
        """The table's content sorted by key: a dict of the eight `EXPORT_TENSORS` (`slots` side by side, [n, W])."""
        c = _ops.dynamic_table_export(self.resource_handle, self.num_slots)._asdict()
        n = tf.shape(c["keys"])[0]
        c["slots"] = tf.concat(c["slots"], 1) if c["slots"] else tf.zeros([n, 0], tf.float32)
        return c

    def import_(
        self,
        keys: Any,
        weights: Any,
        slots: Any = None,
        counts: Any = None,
        last_steps: Any = None,
        pending_keys: Any = None,
        pending_counts: Any = None,
        pending_last_steps: Any = None,
    ) -> Any:
        """Replaces the table's whole content (what `export` returned, or keys and rows from elsewhere).

        Missing parts default to a fresh row's: slots at the optimizer's initial values, count 1, last step the
        current step counter, no admission counters. int64 keys only (a string table's keys are fingerprints).

        Raises:
          ValueError: another dim or slot count, sizes that disagree, counts or steps out of range, duplicate
            keys, more rows than `max_rows`, admission counters beyond `max_pending_keys` or for a table without
            admission (eagerly, all of `checkpoint_check.TableSpec.validate`; in a graph the op re-checks what
            it can). A rejected import changes nothing.
        """
        contents = complete_contents(
            self._attrs.get("slot_initial_values", ()),
            self.slot_widths,
            self._step,
            {
                "keys": keys,
                "weights": weights,
                "slots": slots,
                "counts": counts,
                "last_steps": last_steps,
                "pending_keys": pending_keys,
                "pending_counts": pending_counts,
                "pending_last_steps": pending_last_steps,
            },
        )
        self.check_contents(contents, "import_")
        if all_eager(contents):
            # Everything a restore checks, for this table alone (the keys are not restricted to a shard here).
            spec = checkpoint_check.TableSpec.of(self._attrs)
            spec.validate({**{k: v.numpy() for k, v in contents.items()}, "step": np.int64(0)}, "import_")
        return self.import_contents(contents)

    # ------------------------------------------------------------------------------------------ checkpoints
    def _trackable_children(self, save_type="checkpoint", **kwargs):
        if save_type == "savedmodel" and self._tiered is not None:
            raise ValueError(
                f"DynamicTable {self._table_name!r} is tiered (storage=te.Tiered): a SavedModel of it is not "
                "supported (its rows live in a row file of this process). Export a model whose dynamic tables "
                "are in memory (restore this table's checkpoint into one: the checkpoint format is the same)."
            )
        children = dict(super()._trackable_children(save_type, **kwargs))
        if save_type == "savedmodel":
            # A SavedModel traces `_serialize_to_tensors` into a function and must know every resource it reads;
            # a checkpoint keeps the step inside the table's tensors only (see __init__).
            children["step"] = self._step
            children["log_cursor"] = self._log_cursor
        return children

    def _export_to_saved_model_graph(self, object_map, tensor_map, **kwargs):
        # A SavedModel serialises a copy made in its export graph; the copy must read the step's copy there (the
        # step is a SavedModel child, so it was exported first).
        tensors = super()._export_to_saved_model_graph(object_map=object_map, tensor_map=tensor_map, **kwargs)
        object_map[self].use_counters(object_map.get(self._step), object_map.get(self._log_cursor))
        return tensors

    def use_counters(self, step: tf.Variable | None, log_cursor: tf.Variable | None) -> None:
        """Reads `step` and `log_cursor` from now on (None: keeps its own): a SavedModel's copy of the table reads
        the copies of its counters in the export graph."""
        if step is not None:
            self._step = step
        if log_cursor is not None:
            self._log_cursor = log_cursor

    @property
    def handle_attrs(self) -> dict:
        """The attributes of the table's `TfEmbed>DynamicTableHandle` op (`config.handle_attrs`, no shared name)."""
        return dict(self._attrs)

    def _serialize_to_tensors(self) -> dict[str, tf.Tensor]:
        out = self.export()
        out["step"] = self._step.read_value()
        out.update(self.export_policy_state())
        return out

    def _checkpoint_adapter(self, path: str) -> None:
        # TensorFlow calls this when a restore reaches the table, before it reads any tensor: the whole check
        # (`checkpoint_check.check_restore`) runs here, so a truncated file or a refused policy state changes
        # nothing.
        checkpoint_check.check_restore(
            self, self.spec, path, lambda t: self.check_contents(tensor_shapes(t), "restore")
        )
        return None

    def _restore_from_tensors(self, restored_tensors: dict) -> Any:
        contents = {k: restored_tensors[k] for k in EXPORT_TENSORS}
        self.check_contents(contents, "restore")
        step = checked_step(restored_tensors["step"], self._table_name)
        checks = [step]
        if all_eager(restored_tensors):
            self.spec.validate({k: v.numpy() for k, v in restored_tensors.items()})
        else:
            checks += policy_state_checks(self.spec, restored_tensors)
        mine = restrict_to_shard(contents, self._num_shards, self._shard_index)
        self.check_fits(mine)
        with tf.control_dependencies(checks):
            imported = self.import_contents(mine)
        with tf.control_dependencies([imported]):
            restored = self.import_policy_state(restored_tensors)
        with tf.control_dependencies([restored]):
            return self._step.assign(step)

    @property
    def spec(self) -> checkpoint_check.TableSpec:
        """What a checkpoint of this table must hold (see `checkpoint_check.TableSpec.validate`)."""
        return checkpoint_check.TableSpec.of(self._attrs, self._num_shards, (self._shard_index,))

    # ------------------------------------------------------------------- lifecycle policies' checkpoint state
    def export_policy_state(self) -> dict[str, tf.Tensor]:
        """The checkpoint tensors of the table's lifecycle policies (`policy_tensor_names`; {} for none)."""
        names = policy_tensor_names(self._config)
        if not names:
            return {}
        bloom, keys, decayed = _ops.dynamic_table_export_policy_state(self.resource_handle)
        out = {"bloom_counters": bloom[tf.newaxis], "decayed_keys": keys, "decayed_counts": decayed}
        return {k: out[k] for k in names}

    def import_policy_state(self, tensors: dict) -> Any:
        """Restores what `export_policy_state` saved (of any shard count; see the module docstring)."""
        names = policy_tensor_names(self._config)
        if not names:
            return tf.no_op()
        if "bloom_counters" in names:
            bloom = tf.ensure_shape(tf.convert_to_tensor(tensors["bloom_counters"], tf.uint8), [None, None])
            index = self._shard_index
            # The same shard count: this shard's own filter; another: all of them, added by the op.
            bloom = tf.cond(
                tf.equal(tf.shape(bloom)[0], self._num_shards),
                lambda: bloom[index : index + 1],
                lambda: bloom,
            )
        else:
            bloom = tf.zeros([1, 0], tf.uint8)
        if "decayed_keys" in names:
            keys = tf.ensure_shape(tf.convert_to_tensor(tensors["decayed_keys"], tf.int64), [None])
            decayed = tf.ensure_shape(tf.convert_to_tensor(tensors["decayed_counts"], tf.float32), [None])
        else:
            keys, decayed = tf.zeros([0], tf.int64), tf.zeros([0], tf.float32)
        return _ops.dynamic_table_import_policy_state(self.resource_handle, bloom, keys, decayed)

    # -------------------------------------------------------------------------------------------- internals
    def import_contents(self, c: dict) -> Any:
        split = dict(c, slots=tf.split(c["slots"], self.slot_widths, axis=1) if self.num_slots else [])
        return _ops.dynamic_table_import(self.resource_handle, [split[k] for k in EXPORT_TENSORS])

    def check_ids(self, ids: Any) -> tf.Tensor:
        """`ids` as a tensor of the table's key dtype: any integer dtype widens to int64 for an int64 table (as
        `te.TPUEmbedding` takes any integer ids); strings only for a string table.

        Raises:
          ValueError: naming the table, for ids of another kind (floats, strings for an int64 table, integers
            for a string table).
        """
        if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
            raise ValueError(
                f"DynamicTable {self._table_name!r}: ids must be a dense tensor, got {type(ids).__name__} (pass "
                ".values, or .flat_values)"
            )
        try:
            ids = tf.convert_to_tensor(ids)  # no dtype hint: it would truncate a float array silently
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"DynamicTable {self._table_name!r}: ids must be {self._ids_kind()}; cannot convert {ids!r}: {e}"
            ) from None
        if self.key_dtype == tf.int64 and ids.dtype.is_integer:
            return tf.cast(ids, tf.int64)
        if ids.dtype != self.key_dtype:
            raise ValueError(
                f"DynamicTable {self._table_name!r}: ids have dtype {ids.dtype.name}; the table's key_dtype is "
                f"{self.key_dtype.name}, so ids must be {self._ids_kind()}"
            )
        return ids

    def _ids_kind(self) -> str:
        return "integers (any integer dtype)" if self.key_dtype == tf.int64 else "strings"

    def check_contents(self, c: dict, what: str) -> None:
        """Static checks with the table's name (the op re-checks dynamically): dim and slot count first."""
        check_contents_shapes(c, f"DynamicTable {self._table_name!r}: {what}:", self.dim, self.slot_widths)

    def check_fits(self, c: dict) -> None:
        if tf.executing_eagerly():
            n = int(c["keys"].shape[0])
            if n > self.max_rows:
                raise ValueError(
                    f"DynamicTable {self._table_name!r}: restore: the checkpoint holds {n} rows for this shard, "
                    f"more than max_rows={self.max_rows}; raise max_rows or restore into more shards. Nothing was "
                    "changed"
                )


# A tiered table's checkpoint is streamed (keys whole, rows chunk by chunk) by a registered saver, in the format
# of `_serialize_to_tensors` (tf_embed_ops/dynamic/tiered_checkpoint.py).
tiered_checkpoint.register(DynamicTable)
