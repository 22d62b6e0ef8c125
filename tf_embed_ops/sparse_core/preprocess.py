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

import numpy as np

__all__ = ["FeaturePlan", "StackPlan", "CapacityError", "preprocess"]

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
    """Step 2 for one SparseCore: per partition, the merged entries in device order; and the counters."""
    ids_count = np.zeros(num_physical, np.int64)
    unique_count = np.zeros(num_physical, np.int64)
    per_partition = [[] for _ in range(num_physical)]
    for entries in groups:  # feature groups by ascending column offset
        srow, col, gain, feature, sample, ident = entries
        order = np.lexsort((np.arange(len(col)), col))  # by column, then input position
        srow, col, gain = srow[order], col[order], gain[order]
        feature, sample, ident = feature[order], sample[order], ident[order]
        prev_row, prev_col, head = -1, -1, -1
        merged_gain = []
        heads = []
        for k in range(len(col)):
            if srow[k] != prev_row or col[k] != prev_col:
                partition = col[k] & (num_physical - 1)
                ids_count[partition] += 1
                if col[k] != prev_col:
                    unique_count[partition] += 1
                heads.append(k)
                merged_gain.append(np.float32(gain[k]))
                head = len(heads) - 1
            else:
                merged_gain[head] = np.float32(merged_gain[head] + gain[k])
            prev_row, prev_col = srow[k], col[k]
        for h, k in enumerate(heads):
            per_partition[col[k] & (num_physical - 1)].append(
                (int(feature[k]), int(sample[k]), int(ident[k]), merged_gain[h])
            )
    return per_partition, ids_count, unique_count


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
        per_sc = _convert(rows, ids, weights, f, num_sc_per_chip, num_physical, stacks[f.stack].sample_count)
        converted[index] = per_sc

    out = [([], [], []) for _ in features]
    max_ids, max_unique, dropped = {}, {}, {}
    for name, stack in stacks.items():
        members = [i for i, f in enumerate(features) if f.stack == name]
        col_offsets = sorted({features[i].col_offset for i in members})
        capacity = max_ids_per_chip_per_sample * (stack.sample_count // num_sc_per_chip) * num_sc_per_chip
        if check_capacity and capacity % XLA_PAD_SIZE:
            raise CapacityError(
                f"The max_ids_per_chip is set to be {capacity} which is not divisible by the xla_pad_size "
                f"{XLA_PAD_SIZE} . (Table {name!r}: max_ids_per_chip_per_sample x samples.)"
            )
        used, dropped[name] = 0, 0
        max_ids[name], max_unique[name] = 0, 0
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
            max_ids[name] = max(max_ids[name], int(ids_count.max()))
            max_unique[name] = max(max_unique[name], int(unique_count.max()))
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
        # The CSR wrap runs after every SparseCore's sort, SparseCore after SparseCore.
        total = sum(len(p) for per_partition in sorted_scs for p in per_partition)
        packed = 0
        for per_partition in sorted_scs if check_capacity else ():
            for partition in range(num_physical):
                entries = per_partition[partition]
                if used + len(entries) > capacity:
                    if not allow_id_dropping:
                        remaining = total - packed  # as TensorFlow counts it: every id of the chip not yet placed
                        raise CapacityError(
                            f"The max_ids_per_chip is set to be {capacity} which is not going to fit all ids. The "
                            f"remaining id count is {remaining} . Please consider setting the allow_id_dropping to "
                            f"be true. (Table {name!r}: raise max_ids_per_chip_per_sample.)"
                        )
                    kept = capacity - used
                    dropped[name] += len(entries) - kept
                    entries = entries[:kept]
                    used = capacity
                else:
                    used += len(entries)
                packed += len(entries)
                used = -(-used // XLA_PAD_SIZE) * XLA_PAD_SIZE
                for feature, sample, ident, gain in entries:
                    out[feature][0].append(sample)
                    out[feature][1].append(ident)
                    out[feature][2].append(gain)
    result = []
    for samples, ids, gains in out:
        samples = np.asarray(samples, np.int64)
        order = np.argsort(samples, kind="stable")
        result.append((samples[order], np.asarray(ids, np.int64)[order], np.asarray(gains, np.float32)[order]))
    return result, max_ids, max_unique, dropped
