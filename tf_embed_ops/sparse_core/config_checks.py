"""What `te.TPUEmbeddingV2` accepts, checked as TensorFlow's class checks it: the optimizers SparseCore runs (and
how it runs them), float32 tables with string combiners, features with an `output_shape` SparseCores can split,
and the capacity limits of a `SparseCoreEmbeddingConfig`. Each error names the table, feature or field."""

from __future__ import annotations

import copy
import functools
import operator
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = [
    "MAX_LIMIT",
    "SPARSECORE_OPTIMIZERS",
    "capacity_limits",
    "check_feature",
    "check_table",
    "positive_limit",
    "sparse_core_optimizer",
]

_emb = tf.tpu.experimental.embedding
# What TensorFlow's TPUEmbeddingV2.apply_gradients can run (anything else raises there).
SPARSECORE_OPTIMIZERS = (_emb.SGD, _emb.Adagrad, _emb.AdagradMomentum, _emb.Adam, _emb.FTRL)

# The limits are int32 on SparseCore (TensorFlow's stats and preprocessing ops take and return int32).
MAX_LIMIT = 2**31 - 1


def positive_limit(value: Any, what: str) -> int:
    """A capacity limit as a Python int: an int, a numpy integer or a scalar integer tensor (what
    `compute_sparse_core_stats` returns, as TensorFlow's does), in [1, 2^31 - 1].

    Raises:
      ValueError: naming `what` (the config field and stacked table) and the value.
    """
    number = value
    if isinstance(value, (tf.Tensor, tf.Variable, np.ndarray, np.generic)):
        dtype = tf.as_dtype(value.dtype)
        if not dtype.is_integer or tuple(value.shape) != ():
            number = None
        else:
            try:
                number = int(np.asarray(value))
            except (TypeError, ValueError, NotImplementedError):  # a symbolic tensor has no value to read
                number = None
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_LIMIT:
        raise ValueError(
            f"SparseCoreEmbeddingConfig.{what} must be an integer in [1, {MAX_LIMIT}] (a Python or numpy int, or a "
            f"scalar integer tensor such as compute_sparse_core_stats returns); got {value!r}."
        )
    return number


def sparse_core_optimizer(optimizer: Any) -> Any:
    """The optimizer as SparseCore's fused update runs it: no clipping, per-row sums, lazy Adam.

    TensorFlow's SparseCore update ops take the learning rate and the algorithm's own hyper-parameters only; the
    table's clipping limits and accumulation flag are never passed, and its Adam kernel updates touched rows only.
    """
    if optimizer is None:
        return None
    sc = copy.copy(optimizer)
    sc.clip_weight_min = sc.clip_weight_max = None
    sc.clip_gradient_min = sc.clip_gradient_max = None
    sc.use_gradient_accumulation = True
    if isinstance(sc, _emb.Adam):
        sc.lazy_adam = True
    return sc


def check_table(table: Any) -> None:
    """Refuses what TensorFlow's TPUEmbeddingV2 cannot run for `table` (naming it)."""
    opt = table.optimizer
    if opt is not None and (
        opt.weight_decay_factor is not None or opt.multiply_weight_decay_factor_by_learning_rate is not None
    ):
        raise NotImplementedError(
            "weight_decay_factor and multiply_weight_decay_factor_by_learning_rate are not supported yet. But "
            f"found in table {table.name} setting."
        )
    if opt is not None and not isinstance(opt, SPARSECORE_OPTIMIZERS):
        raise ValueError(
            f"Table {table.name!r}: {type(opt).__name__} has no SparseCore update in TensorFlow's "
            "TPUEmbeddingV2; use SGD, Adagrad, AdagradMomentum, Adam or FTRL (or tf_embed_ops.TPUEmbedding)."
        )
    if not isinstance(table.combiner, str):
        raise ValueError(f"Table {table.name!r}: a CustomCombiner has no CPU meaning; use 'sum', 'mean', 'sqrtn'.")
    if getattr(table, "dtype", tf.float32) != tf.float32:
        # TensorFlow's TPUEmbeddingV2 creates every table variable as float32 whatever TableConfig.dtype says
        # (only its on-device batch initializer reads the dtype), and the fused CPU kernels are float32.
        raise ValueError(
            f"Table {table.name!r} has dtype {table.dtype.name}: TPUEmbeddingV2 stores and trains float32 "
            "tables only (TensorFlow's class also creates its variables as float32). Use an int32 table with "
            "tf.tpu.experimental.embedding.TPUEmbeddingForServing-style lookups instead."
        )


def check_feature(path: str, feature: Any, num_sc_per_chip: int) -> None:
    """Refuses a feature without `output_shape` or whose sample count SparseCores cannot split."""
    if not feature.output_shape:
        raise ValueError(
            f"Feature {path!r} has no output_shape; TPUEmbeddingV2 needs one for every feature (its sample "
            "count is the product of output_shape)."
        )
    samples = functools.reduce(operator.mul, feature.output_shape.as_list(), 1)
    if samples % num_sc_per_chip:
        raise ValueError(
            f"Feature {path!r}: sample_count {samples} (product of output_shape) is not divisible by the "
            f"number of sparsecores per chip {num_sc_per_chip}."
        )


def capacity_limits(config: Any, stacked_tables: Any, default_max_ids: int, default_max_unique_ids: int) -> tuple:
    """`(max_ids, max_unique_ids, max_ids_per_chip_per_sample)`: the per-stack limits of `config` (a
    `SparseCoreEmbeddingConfig`) as Python ints, checked (`stacked_tables`: the stacked tables' names)."""
    given_ids = config.max_ids_per_table or {}
    given_unique = config.max_unique_ids_per_table or {}
    for key in set(given_ids) | set(given_unique):
        if key not in stacked_tables:
            raise ValueError(
                f"SparseCoreEmbeddingConfig names table {key!r}, which is not a stacked table; the limits are "
                f"keyed by stacked table name: {sorted(stacked_tables)}."
            )
    max_ids, max_unique = {}, {}
    for name in stacked_tables:
        max_ids[name] = positive_limit(given_ids.get(name, default_max_ids), f"max_ids_per_table[{name!r}]")
        max_unique[name] = positive_limit(
            given_unique.get(name, default_max_unique_ids), f"max_unique_ids_per_table[{name!r}]"
        )
    per_sample = positive_limit(config.max_ids_per_chip_per_sample, "max_ids_per_chip_per_sample")
    return max_ids, max_unique, per_sample
