"""SparseCore's host preprocessing of one batch, ported to numpy from TensorFlow's CPU kernels.

`TPUEmbeddingV2.enqueue` runs three host ops per stacked table (TensorFlow's `sparse_core_preprocess_ops.cc`):

1. *Convert to COO* (per feature): each id gets a sample row; ids repeated back to back in one sample are merged
   (their weights added); non-`sum` combiners become per-id gains (`mean`: weight / sum of the sample's weights,
   `sqrtn`: weight / sqrt(sum of squares), computed over all ids before merging), so the device only sums.
   Rows are split over the chip's SparseCores by sample (`row // (samples / num_sc_per_chip)`), ids are moved to
   their stacked column (rotation within the low bits, plus the table's offset).
2. *Sort* (per SparseCore of the chip): the features of one table are concatenated, sorted by column, and equal
   (row, column) pairs merged. Each id goes to SparseCore `column % num_physical` (`num_physical` = replicas x
   SparseCores per chip). More ids, or more distinct columns, than `max_ids_per_table` / `max_unique_ids_per_table`
   on one SparseCore is an error (these never drop).
3. *CSR wrap* (per stacked table): the sorted ids of every SparseCore, SparseCore after SparseCore, partition after
   partition, each partition padded to a multiple of 8 slots, go into a static buffer of
   `max_ids_per_chip_per_sample x samples` slots. Ids past its end are an error, or dropped when
   `allow_id_dropping` (the first ones in that order are kept; gains of kept ids are not renormalised).

`preprocess` returns, per feature, the (sample, id, gain) triples the device would see after all three steps, and
the per-table statistics `compute_sparse_core_stats` reports. Minibatching (TensorFlow's splits) is not used by
`TPUEmbeddingV2` (it passes no splits), so it is not modelled.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any

import numpy as np

__all__ = ["FeaturePlan", "StackPlan", "CapacityError", "plans", "preprocess"]

# The CSR op pads each partition's ids to this many slots (a constant in that op).
XLA_PAD_SIZE = 8


class CapacityError(ValueError):
    """A batch exceeds a SparseCore capacity limit (TensorFlow raises InvalidArgumentError on the host)."""


@dataclasses.dataclass(frozen=True)
class FeaturePlan:
    path: str
    table: str
    stack: str
    sample_count: int  # prod(output_shape)
    row_offset: int  # first row of this feature in its stack's samples
    col_offset: int
    col_shift: int
    combiner: str
    vocabulary_size: int  # unpadded: ids outside [0, vocab) are rejected (SparseCore would read another table)


@dataclasses.dataclass(frozen=True)
class StackPlan:
    name: str
    sample_count: int  # samples of all features of the stack, one replica
    max_ids: int
    max_unique_ids: int


def _convert(rows, ids, weights, f: FeaturePlan, num_sc: int, num_shards: int, stack_samples: int):
    """Step 1 for one feature: per SparseCore lists of (stacked row, stacked col, gain, sample, id)."""
    if f.combiner == "sum":
        scale = None
    else:
        contrib = weights if f.combiner == "mean" else weights * weights
        total = np.zeros(f.sample_count, np.float32)
        np.add.at(total, rows, contrib.astype(np.float32))
        with np.errstate(divide="ignore"):
            # A sample whose weights sum to 0 contributes 0 (TensorFlow's serving lookup divides with no NaN).
            scale = np.where(total > 0, 1.0 / (total if f.combiner == "mean" else np.sqrt(total)), 0.0)
            scale = scale.astype(np.float32)
    n = len(ids)
    keep = np.ones(n, bool)
    if n > 1:
        keep[1:] = (rows[1:] != rows[:-1]) | (ids[1:] != ids[:-1])
    group = np.cumsum(keep) - 1
    merged = np.zeros(int(keep.sum()), np.float32)
    np.add.at(merged, group, weights.astype(np.float32))
    rows, ids = rows[keep], ids[keep]
    gains = merged if scale is None else merged * scale[rows]
    per_sc = f.sample_count // num_sc
    mod = num_shards - 1
    stacked_rows = rows % per_sc + f.row_offset // num_sc + (stack_samples // num_sc) * (rows // per_sc)
    cols = ((ids + f.col_shift) & mod) + (ids & ~mod) + f.col_offset
    sc = rows // per_sc
    return [(stacked_rows[sc == i], cols[sc == i], gains[sc == i], rows[sc == i], ids[sc == i]) for i in range(num_sc)]


def _sort_one_sc(groups: list, num_physical: int):
    """Step 2 for one SparseCore: per partition, the merged entries in device order; and the counters.

    Returns (per partition a tuple of arrays (feature, sample, id, gain) in device order, ids per partition,
    unique ids per partition).
    """
    mask = num_physical - 1
    ids_count = np.zeros(num_physical, np.int64)
    unique_count = np.zeros(num_physical, np.int64)
    heads_by_group = []
    for srow, col, gain, feature, sample, ident in groups:  # feature groups by ascending column offset
        n = len(col)
        order = np.lexsort((np.arange(n), col))  # by column, then input position
        srow, col, gain = srow[order], col[order], gain[order]
        new_pair = np.ones(n, bool)
        new_col = np.ones(n, bool)
        if n > 1:
            new_col[1:] = col[1:] != col[:-1]
            new_pair[1:] = new_col[1:] | (srow[1:] != srow[:-1])
        heads = order[new_pair]
        merged = np.zeros(int(new_pair.sum()), np.float32)
        # Gains of a repeated (row, column) add onto the first one's, in sorted order (float32, as the kernel).
        np.add.at(merged, np.cumsum(new_pair) - 1, gain.astype(np.float32))
        partition = col[new_pair] & mask
        ids_count += np.bincount(partition, minlength=num_physical)
        unique_count += np.bincount(col[new_col] & mask, minlength=num_physical)
        heads_by_group.append((feature[heads], sample[heads], ident[heads], merged, partition))
    feature, sample, ident, gain, partition = (np.concatenate(x) for x in zip(*heads_by_group, strict=True))
    by_partition = np.argsort(partition, kind="stable")  # keeps group order, then sorted order, per partition
    bounds = np.concatenate([[0], np.cumsum(np.bincount(partition, minlength=num_physical))])
    arrays = (feature[by_partition], sample[by_partition], ident[by_partition], gain[by_partition])
    per_partition = [tuple(a[bounds[p] : bounds[p + 1]] for a in arrays) for p in range(num_physical)]
    return per_partition, ids_count, unique_count


def _convert_features(flat_inputs: list, features: list, stacks: dict, num_sc_per_chip: int, num_physical: int):
    """Step 1 for every feature, after checking its rows and ids: {feature index: per-SparseCore COO arrays}."""
    converted = {}
    for index, ((rows, ids, weights), f) in enumerate(zip(flat_inputs, features, strict=True)):
        rows = np.asarray(rows, np.int64)
        ids = np.asarray(ids, np.int64)
        weights = np.asarray(weights, np.float32)
        if len(rows) and (rows.min() < 0 or rows.max() >= f.sample_count):
            bad = int(rows[(rows < 0) | (rows >= f.sample_count)][0])
            raise ValueError(
                f"Feature {f.path}: an id belongs to sample {bad}, outside the {f.sample_count} samples of its "
                "output_shape."
            )
        if len(rows) > 1 and np.any(rows[1:] < rows[:-1]):
            raise ValueError(
                f"Feature {f.path}: Invalid indices_or_row_splits input, indices of SparseTensor need to be sorted "
                "in ascending (non-decreasing) order."
            )
        if len(ids) and (ids.min() < 0 or ids.max() >= f.vocabulary_size):
            bad = int(ids[(ids < 0) | (ids >= f.vocabulary_size)][0])
            raise ValueError(
                f"Feature {f.path}: id {bad} is outside table {f.table!r} (vocabulary_size {f.vocabulary_size})."
            )
        converted[index] = _convert(rows, ids, weights, f, num_sc_per_chip, num_physical, stacks[f.stack].sample_count)
    return converted


def _sort_stack(
    name: str,
    stack: StackPlan,
    members: list,
    features: list,
    converted: dict,
    num_sc_per_chip: int,
    num_physical: int,
    check_capacity: bool,
):
    """Step 2 for one stacked table: (per SparseCore its per-partition sorted entries, max ids, max unique ids)."""
    col_offsets = sorted({features[i].col_offset for i in members})
    max_ids, max_unique = 0, 0
    sorted_scs = []
    for sc in range(num_sc_per_chip):
        groups = []
        for offset in col_offsets:
            parts = [(i, converted[i][sc]) for i in members if features[i].col_offset == offset]
            groups.append(
                tuple(
                    np.concatenate(x) if x else np.zeros(0, np.int64)
                    for x in zip(
                        *[(p[0], p[1], p[2], np.full(len(p[0]), i), p[3], p[4]) for i, p in parts], strict=True
                    )
                )
            )
        per_partition, ids_count, unique_count = _sort_one_sc(groups, num_physical)
        max_ids = max(max_ids, int(ids_count.max()))
        max_unique = max(max_unique, int(unique_count.max()))
        sorted_scs.append(per_partition)
        if not check_capacity:
            continue
        for partition in range(num_physical):
            if ids_count[partition] > stack.max_ids:
                raise CapacityError(
                    f"Sparse core {partition} gets {ids_count[partition]} ids while the max ids per sparse core "
                    f"is set to be {stack.max_ids} for table {name} (raise max_ids_per_table[{name!r}] in the "
                    "SparseCoreEmbeddingConfig; compute_sparse_core_stats measures it)."
                )
            if unique_count[partition] > stack.max_unique_ids:
                raise CapacityError(
                    f"Sparse core {partition} gets {unique_count[partition]} unique ids while the max unique "
                    f"ids per sparse core is set to be {stack.max_unique_ids} for table {name} (raise "
                    f"max_unique_ids_per_table[{name!r}] in the SparseCoreEmbeddingConfig)."
                )
    return sorted_scs, max_ids, max_unique


def _csr_wrap(name: str, sorted_scs: list, capacity: int, num_physical: int, allow_id_dropping: bool, out: list):
    """Step 3 for one stacked table: packs the sorted entries into `capacity` slots, SparseCore after SparseCore,
    appending what is kept to `out` (per feature (samples, ids, gains) lists).  Returns the number dropped."""
    total = sum(len(p[0]) for per_partition in sorted_scs for p in per_partition)
    used, packed, dropped = 0, 0, 0
    for per_partition in sorted_scs:
        for partition in range(num_physical):
            entries = per_partition[partition]
            count = len(entries[0])
            if used + count > capacity:
                if not allow_id_dropping:
                    remaining = total - packed  # as TensorFlow counts it: every id of the chip not yet placed
                    raise CapacityError(
                        f"The max_ids_per_chip is set to be {capacity} which is not going to fit all ids. The "
                        f"remaining id count is {remaining} . Please consider setting the allow_id_dropping to "
                        f"be true. (Table {name!r}: raise max_ids_per_chip_per_sample.)"
                    )
                kept = capacity - used
                dropped += count - kept
                entries = tuple(a[:kept] for a in entries)
                count = kept
                used = capacity
            else:
                used += count
            packed += count
            used = -(-used // XLA_PAD_SIZE) * XLA_PAD_SIZE
            feature, sample, ident, gain = entries
            for f in np.unique(feature):
                mine = feature == f
                out[f][0].append(sample[mine])
                out[f][1].append(ident[mine])
                out[f][2].append(gain[mine])
    return dropped


def preprocess(
    flat_inputs: list,
    features: list,
    stacks: dict,
    num_replicas: int,
    num_sc_per_chip: int,
    max_ids_per_chip_per_sample: int,
    allow_id_dropping: bool,
    check_capacity: bool = True,
):
    """Runs the three steps over one batch (one replica's samples).

    Args:
      flat_inputs: per feature `(rows, ids, weights)` numpy arrays (rows = sample of each id, non-decreasing).
      features: the FeaturePlans, in flattened feature order.
      stacks: {stacked name: StackPlan}.
      check_capacity: False only counts (for the stats helper), as TensorFlow's stats op does.

    Returns:
      (per feature (samples, ids, gains) arrays after merging and dropping, {stack: max ids per SparseCore},
      {stack: max unique ids per SparseCore}, {stack: number of ids dropped}).

    Raises:
      CapacityError: a limit is exceeded (and not droppable), with TensorFlow's message first.
      ValueError: a sample row or id out of range, or rows not sorted.
    """
    num_physical = num_replicas * num_sc_per_chip
    converted = _convert_features(flat_inputs, features, stacks, num_sc_per_chip, num_physical)
    out = [([], [], []) for _ in features]
    max_ids, max_unique, dropped = {}, {}, {}
    for name, stack in stacks.items():
        members = [i for i, f in enumerate(features) if f.stack == name]
        capacity = max_ids_per_chip_per_sample * (stack.sample_count // num_sc_per_chip) * num_sc_per_chip
        if check_capacity and capacity % XLA_PAD_SIZE:
            raise CapacityError(
                f"The max_ids_per_chip is set to be {capacity} which is not divisible by the xla_pad_size "
                f"{XLA_PAD_SIZE} . (Table {name!r}: max_ids_per_chip_per_sample x samples.)"
            )
        sorted_scs, max_ids[name], max_unique[name] = _sort_stack(
            name, stack, members, features, converted, num_sc_per_chip, num_physical, check_capacity
        )
        # The CSR wrap runs after every SparseCore's sort; the stats helper (check_capacity False) skips it.
        dropped[name] = (
            _csr_wrap(name, sorted_scs, capacity, num_physical, allow_id_dropping, out) if check_capacity else 0
        )
    result = []
    for samples, ids, gains in out:
        samples = np.concatenate(samples).astype(np.int64) if samples else np.zeros(0, np.int64)
        ids = np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, np.int64)
        gains = np.concatenate(gains).astype(np.float32) if gains else np.zeros(0, np.float32)
        order = np.argsort(samples, kind="stable")
        result.append((samples[order], ids[order], gains[order]))
    return result, max_ids, max_unique, dropped


def plans(flat_features: list, stacking: Any, max_ids: dict, max_unique_ids: dict) -> tuple[list, dict]:
    """The `FeaturePlan` of each feature (`flat_features`: `(path, FeatureConfig)` pairs) and the `StackPlan` of each
    stacked table, from the stacking (`tf_embed_ops.sparse_core.layout`) and the per-stack capacity limits."""
    features = []
    for path, feature in flat_features:
        stack, col_offset, col_shift = stacking.table_to_stacked_table_offset[feature.table.name]
        features.append(
            FeaturePlan(
                path=path,
                table=feature.table.name,
                stack=stack,
                sample_count=functools.reduce(operator.mul, feature.output_shape.as_list(), 1),
                row_offset=stacking.feature_to_sample_offset[path],
                col_offset=col_offset,
                col_shift=col_shift,
                combiner=feature.table.combiner,
                vocabulary_size=feature.table.vocabulary_size,
            )
        )
    stacks = {
        name: StackPlan(
            name=name,
            sample_count=stacking.table_to_sample_count[name],
            max_ids=max_ids[name],
            max_unique_ids=max_unique_ids[name],
        )
        for name in stacking.stacked_table_to_tables
    }
    return features, stacks
