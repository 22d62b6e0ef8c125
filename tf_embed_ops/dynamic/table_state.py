"""The checkpoint tensors of a dynamic table and the checks of a restore, shared by `DynamicTable` and
`ShardedDynamicTable`: which tensors a configuration writes, a shard's part of a checkpoint, the union of shards,
and the checks on the step and the policies' state that run before any row is written."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tf_embed_ops.dynamic import checkpoint_check, policies
from tf_embed_ops.dynamic import ops as _ops
from tf_embed_ops.dynamic.sharding import shard_of_keys

__all__ = [
    "CHECKPOINT_TENSORS",
    "CheckpointTensors",
    "EXPORT_TENSORS",
    "all_eager",
    "check_contents_shapes",
    "checked_step",
    "complete_contents",
    "policy_state_checks",
    "policy_tensor_names",
    "restrict_to_shard",
    "sorted_union",
    "tensor_shapes",
    "variable_name",
]

# The checkpoint's tensors: the export's eight (in `DynamicTableContents` order), then the step counter.
EXPORT_TENSORS = tuple(_ops.DynamicTableContents._fields)
CHECKPOINT_TENSORS = (*EXPORT_TENSORS, "step")


def restrict_to_shard(contents: dict, num_shards: int, shard_index: int) -> dict:
    """The part of an exported/checkpointed content that belongs to one shard (rows and admission counters).

    Filtering keeps the key order, so a sorted content stays sorted.
    """
    if num_shards == 1:
        return dict(contents)
    # Restored tensors have no static shape inside a SavedModel's restore function; boolean_mask needs the ranks.
    contents = {
        k: tf.ensure_shape(v, [None, None] if k in ("slots", "weights") else [None]) for k, v in contents.items()
    }
    out = dict(contents)
    mine = tf.equal(shard_of_keys(contents["keys"], num_shards), shard_index)
    for name in ("keys", "weights", "slots", "counts", "last_steps"):
        out[name] = tf.boolean_mask(contents[name], mine)
    pending = tf.equal(shard_of_keys(contents["pending_keys"], num_shards), shard_index)
    for name in ("pending_keys", "pending_counts", "pending_last_steps"):
        out[name] = tf.boolean_mask(contents[name], pending)
    return out


def sorted_union(parts: list[dict]) -> dict:
    """Concatenates shard contents (disjoint keys) and sorts rows and admission counters by key."""
    if len(parts) == 1:
        return dict(parts[0])
    out = {}
    keys = tf.concat([p["keys"] for p in parts], 0)
    order = tf.argsort(keys, stable=True)
    out["keys"] = tf.gather(keys, order)
    for name in ("weights", "slots", "counts", "last_steps"):
        out[name] = tf.gather(tf.concat([p[name] for p in parts], 0), order)
    pending = tf.concat([p["pending_keys"] for p in parts], 0)
    porder = tf.argsort(pending, stable=True)
    out["pending_keys"] = tf.gather(pending, porder)
    for name in ("pending_counts", "pending_last_steps"):
        out[name] = tf.gather(tf.concat([p[name] for p in parts], 0), porder)
    return out


def policy_tensor_names(config: Any) -> tuple[str, ...]:
    """The checkpoint tensors beyond `CHECKPOINT_TENSORS` that `config`'s lifecycle policies add."""
    names: tuple[str, ...] = ()
    if isinstance(getattr(config, "admission", None), policies.BloomAdmission):
        names += ("bloom_counters",)
    if isinstance(getattr(config, "eviction", None), policies.DecayedLFU):
        names += ("decayed_keys", "decayed_counts")
    return names


def checked_step(step: Any, table_name: str) -> tf.Tensor:
    """The checkpoint's step as an int64 scalar, checked (shape [], value >= 0) before any row is imported.

    Eagerly a bad step raises ValueError here; in a graph (a SavedModel's restore function) the returned tensor
    carries the check, and the import waits for it."""
    step = tf.convert_to_tensor(step)
    where = f"DynamicTable {table_name!r}: restore:"
    if not step.dtype.is_integer:
        raise ValueError(f"{where} the step must be an integer, got dtype {step.dtype.name}; nothing was changed")
    if step.shape.rank is not None and step.shape.rank != 0:
        raise ValueError(f"{where} the step must be a scalar (shape []), got shape {step.shape}; nothing was changed")
    step = tf.cast(step, tf.int64)
    if tf.executing_eagerly():
        if int(step.numpy()) < 0:
            raise ValueError(f"{where} the step must be >= 0, got {int(step.numpy())}; nothing was changed")
        return step
    with tf.control_dependencies(
        [tf.debugging.assert_equal(tf.rank(step), 0, message=f"{where} the step must be a scalar")]
    ):
        step = tf.reshape(step, [])
    with tf.control_dependencies([tf.debugging.assert_non_negative(step, message=f"{where} the step must be >= 0")]):
        return tf.identity(step)


def policy_state_checks(spec: checkpoint_check.TableSpec, tensors: dict) -> list:
    """In a graph (a SavedModel's restore function): assertions on the policies' tensors that the rows' import
    waits for, so a policy state the later policy import would refuse stops the restore before any row is written
    (eagerly `TableSpec.validate` checks them in numpy)."""
    where = f"DynamicTable {spec.name!r}: restore:"
    checks = []
    if "bloom_counters" in tensors:
        bloom = tf.convert_to_tensor(tensors["bloom_counters"])
        checks.append(
            tf.debugging.assert_equal(
                tf.shape(bloom, out_type=tf.int64)[-1],
                tf.constant(spec.bloom_bytes, tf.int64),
                message=f"{where} bloom_counters must be [parts, {spec.bloom_bytes}] ({spec.admission}); nothing "
                "was changed",
            )
        )
    if "decayed_counts" in tensors:
        counts = tf.convert_to_tensor(tensors["decayed_counts"])
        checks.append(
            tf.debugging.assert_equal(
                tf.reduce_all(tf.math.is_finite(counts) & (counts >= 0)),
                True,
                message=f"{where} decayed_counts must be finite and >= 0; nothing was changed",
            )
        )
        checks.append(
            tf.debugging.assert_equal(
                tf.size(counts),
                tf.size(tensors["decayed_keys"]),
                message=f"{where} decayed_keys and decayed_counts must be the same length; nothing was changed",
            )
        )
    return checks


def tensor_shapes(tensors: dict) -> dict:
    """The rows' and slots' shapes of checkpoint tensors (numpy) as `check_contents` reads them."""
    return {k: tf.TensorSpec(np.shape(tensors[k])) for k in ("weights", "slots")}


def all_eager(tensors: dict) -> bool:
    return tf.executing_eagerly() and all(hasattr(v, "numpy") for v in tensors.values())


def variable_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in str(name)) or "table"
    return cleaned if cleaned[0].isalpha() else "t_" + cleaned


class CheckpointTensors:
    """The public face of a dynamic table's checkpoint format (`DynamicTable`, `ShardedDynamicTable`): what the
    incremental checkpoints and the streamed restore read and write without TensorFlow's saveable hooks."""

    def checkpoint_tensors(self) -> dict[str, tf.Tensor]:
        """The tensors a checkpoint writes for this table (`CHECKPOINT_TENSORS` and the policies' state)."""
        return self._serialize_to_tensors()

    def restore_tensors(self, tensors: dict) -> Any:
        """Restores the table from checkpoint tensors, checked before any row is written (`checkpoint_tensors`)."""
        return self._restore_from_tensors(tensors)


def complete_contents(slot_initial_values: Any, slot_widths: list, step: tf.Variable, c: dict) -> dict:
    """`import_`'s contents with every missing part a fresh row's: slots at the optimizer's initial values
    (`slot_initial_values`, one per slot of `slot_widths`), count 1, last step `step`'s value, no admission
    counters; each converted to its dtype."""
    out = dict(c)
    out["keys"] = tf.reshape(tf.convert_to_tensor(c["keys"], tf.int64), [-1])
    out["weights"] = tf.convert_to_tensor(c["weights"], tf.float32)
    n = tf.size(out["keys"], out_type=tf.int64)
    if c["slots"] is None:
        init = [v for v, w in zip(slot_initial_values, slot_widths, strict=True) for _ in range(w)]
        out["slots"] = tf.ones([n, len(init)], tf.float32) * tf.constant(init, tf.float32, shape=[len(init)])
    else:
        out["slots"] = tf.convert_to_tensor(c["slots"], tf.float32)
    out["counts"] = tf.ones([n], tf.int64) if c["counts"] is None else tf.convert_to_tensor(c["counts"], tf.int64)
    if c["last_steps"] is None:
        out["last_steps"] = tf.fill([n], step.read_value())
    else:
        out["last_steps"] = tf.convert_to_tensor(c["last_steps"], tf.int64)
    for name in ("pending_keys", "pending_counts", "pending_last_steps"):
        out[name] = tf.zeros([0], tf.int64) if c[name] is None else tf.convert_to_tensor(c[name], tf.int64)
    return out


def check_contents_shapes(c: dict, where: str, dim: int, slot_widths: list) -> None:
    """The static checks of contents a table of `dim` and `slot_widths` takes (`where` names it and the call; the op
    re-checks dynamically): dim and slot count first."""
    weights, slots = c["weights"], c["slots"]
    num_slots = len(slot_widths)
    if weights.shape.rank is not None and weights.shape.rank != 2:
        raise ValueError(f"{where} weights must be [n, dim], got shape {weights.shape}")
    wdim = weights.shape[-1] if weights.shape.rank == 2 else None
    if wdim is not None and wdim != dim:
        raise ValueError(f"{where} the rows have dim {wdim} but the table has dim {dim}; nothing was changed")
    width = sum(slot_widths)
    if slots.shape.rank is not None:
        if slots.shape.rank != 2:
            raise ValueError(
                f"{where} slots must be [n, {width}] (the optimizer's {num_slots} slot(s) of widths "
                f"{slot_widths} side by side), got shape {slots.shape}; nothing was changed"
            )
        if slots.shape[1] is not None and slots.shape[1] != width:
            raise ValueError(
                f"{where} the slots are {slots.shape[1]} values per row but the table's optimizer keeps "
                f"{width} ({num_slots} slot(s) of widths {slot_widths}); nothing was changed"
            )
