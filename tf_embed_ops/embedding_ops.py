"""Functional wrappers over the fused embedding training ops (docs/ops.md has the op contract).

Features are first normalised, as the TPU enqueue does, to a :class:`FeatureInput`; then

* :func:`embedding_activations` looks up and combines them (the forward pass, no gradient),
* :func:`send_tpu_embedding_gradients` applies one training step to the tables and slots in place (combiner
  backward, per-row gradient accumulation, clipping, weight decay, the table's optimizer),
* :func:`embedding_lookup_and_update` ties both together through ``tf.custom_gradient`` for Keras-style
  training, and :func:`adam_bias_corrected_learning_rate` gives the dynamic rate TPU Adam users supply.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tf_embed_ops import _loader, update_trigger

__all__ = [
    "FeatureInput",
    "adam_bias_corrected_learning_rate",
    "embedding_activations",
    "embedding_lookup_and_update",
    "normalize_feature",
    "send_tpu_embedding_gradients",
]

_COMBINERS = ("sum", "mean", "sqrtn")

LearningRate = float | tf.Tensor | tf.Variable | Callable[[], object]


class FeatureInput(NamedTuple):
    """One feature in the TPU enqueue's normalised form.

    Attributes:
      sample_indices_or_row_splits: int64; shape [0] = each id is its own sample (dense input), rank 1 = ragged
        row_splits (sample = row), rank 2 [nnz, r] = sparse indices (sample = row-major position of
        ``indices[:, :-1]`` inside ``sample_shape``; the last column is reduced).
      ids: int64 [nnz].
      weights: float32 [nnz], or [0] for all ones.
      sample_shape: int64 1-D, the activation's shape without the embedding dimension.
    """

    sample_indices_or_row_splits: tf.Tensor
    ids: tf.Tensor
    weights: tf.Tensor
    sample_shape: tf.Tensor


def _ops():
    return _loader.load_ops()


def _empty_int64() -> tf.Tensor:
    return tf.zeros([0], tf.int64)


def _empty_float() -> tf.Tensor:
    return tf.zeros([0], tf.float32)


def normalize_feature(x, weights=None, max_sequence_length: int = 0, feature_name: str | None = None) -> FeatureInput:
    """Normalises one feature's ids (and optional weights) to a :class:`FeatureInput`, as the TPU enqueue does.

    * Dense ``tf.Tensor``: each id is its own sample; a trailing dimension of 1 is reduced ([B, 1] -> sample
      shape [B]).  Rank >= 2 with a last dimension other than 1 is rejected (as TPUEmbedding V2 does); weights
      are not allowed.
    * ``tf.SparseTensor`` (rank >= 2): sample = position of all but the last index.
    * ``tf.RaggedTensor`` (rank 2 only): sample = row.
    * Sequence features (``max_sequence_length = L > 0``, rank-2 sparse or ragged input): sample shape [B, L];
      the k-th id of row b (for sparse input k = ``indices[:, 1]``) lands at (b, k); ids at k >= L are dropped.

    Args:
      x: the ids: a Tensor, SparseTensor or RaggedTensor of integers.
      weights: None, or float weights of the same kind and structure as ``x`` (not for dense input).
      max_sequence_length: L > 0 makes a rank-2 sparse/ragged feature a sequence feature.
      feature_name: names the feature in the errors of run-time checks (ragged sequence input is checked here,
        because its layout is derived in Python; every other form is checked by the ops).

    Returns:
      The FeatureInput.

    Raises:
      ValueError: unsupported rank or kind, weights for dense input, or weights of another kind than ``x``.

    Example:
      >>> f = normalize_feature(tf.ragged.constant([[1, 2], [3]], dtype=tf.int64))
      >>> f.sample_shape.numpy()
      array([2])
    """
    if max_sequence_length < 0:
        raise ValueError(f"max_sequence_length must be >= 0, got {max_sequence_length}")
    if isinstance(x, tf.SparseTensor):
        return _normalize_sparse(x, weights, max_sequence_length)
    if isinstance(x, tf.RaggedTensor):
        return _normalize_ragged(x, weights, max_sequence_length, feature_name)
    x = tf.convert_to_tensor(x)
    if weights is not None:
        raise ValueError("weights: dense input takes no weights (as TPUEmbedding); use a SparseTensor or RaggedTensor")
    if not x.dtype.is_integer:
        raise ValueError(f"x: ids must be integers, got {x.dtype.name}")
    rank = x.shape.rank
    if rank is None or rank < 1:
        raise ValueError(f"x: dense input must have a known rank >= 1, got shape {x.shape}")
    if rank >= 2 and x.shape[-1] != 1:
        raise ValueError(f"x: dense input of rank >= 2 must have a last dimension of 1, got shape {x.shape}")
    if rank >= 2:
        x = tf.squeeze(x, axis=-1)
    sample_shape = tf.shape(x, out_type=tf.int64)
    return FeatureInput(_empty_int64(), tf.reshape(tf.cast(x, tf.int64), [-1]), _empty_float(), sample_shape)


def _check_weights_kind(weights, kind: type, name: str):
    if weights is not None and not isinstance(weights, kind):
        raise ValueError(f"weights: must be a {name} like the ids, got {type(weights).__name__}")


def _normalize_sparse(x: tf.SparseTensor, weights, max_sequence_length: int) -> FeatureInput:
    _check_weights_kind(weights, tf.SparseTensor, "SparseTensor")
    rank = x.shape.rank
    if rank is None or rank < 2:
        raise ValueError(f"x: a SparseTensor feature must have rank >= 2, got shape {x.shape}")
    if not x.dtype.is_integer:
        raise ValueError(f"x: ids must be integers, got {x.dtype.name}")
    indices = x.indices
    ids = tf.cast(x.values, tf.int64)
    w = _empty_float() if weights is None else tf.cast(weights.values, tf.float32)
    dense_shape = tf.cast(x.dense_shape, tf.int64)
    if max_sequence_length > 0 and rank == 2:
        # Sequence: id at (b, k) -> sample (b, k) of [B, L]; k >= L dropped here so the kernel stays strict.
        keep = indices[:, 1] < max_sequence_length
        indices = tf.boolean_mask(indices, keep)
        ids = tf.boolean_mask(ids, keep)
        if weights is not None:
            w = tf.boolean_mask(w, keep)
        indices = tf.concat([indices, tf.zeros_like(indices[:, :1])], axis=1)
        sample_shape = tf.stack([dense_shape[0], tf.constant(max_sequence_length, tf.int64)])
        return FeatureInput(indices, ids, w, sample_shape)
    return FeatureInput(indices, ids, w, dense_shape[:-1])


def _checked_row_splits(splits: tf.Tensor, num_ids: tf.Tensor, feature_name: str | None) -> tf.Tensor:
    """`splits` once they are known valid: [0, ..., num_ids], non-decreasing (so every entry is in [0, num_ids]).

    ``tf.RaggedTensor.from_row_splits(..., validate=False)`` lets any splits through; the sequence layout indexes
    through them in Python, so they are checked before that (the ops check every other input form themselves).
    Comparisons only, no differences: nothing can overflow.
    """
    what = f"feature {feature_name!r}" if feature_name else "ragged feature"
    valid = tf.logical_and(
        tf.logical_and(tf.equal(splits[0], 0), tf.equal(splits[-1], num_ids)),
        tf.reduce_all(splits[1:] >= splits[:-1]),
    )
    check = tf.debugging.Assert(
        valid,
        [f"{what}: row_splits must start at 0, be non-decreasing and end at the number of ids", num_ids, splits],
        summarize=16,
    )
    with tf.control_dependencies([check]):
        return tf.identity(splits)


def _normalize_ragged(
    x: tf.RaggedTensor, weights, max_sequence_length: int, feature_name: str | None = None
) -> FeatureInput:
    _check_weights_kind(weights, tf.RaggedTensor, "RaggedTensor")
    if x.shape.rank != 2 or x.ragged_rank != 1:
        raise ValueError(f"x: a RaggedTensor feature must have rank 2 (ragged_rank 1), got shape {x.shape}")
    if not x.dtype.is_integer:
        raise ValueError(f"x: ids must be integers, got {x.dtype.name}")
    splits = tf.cast(x.row_splits, tf.int64)
    ids = tf.cast(x.values, tf.int64)
    w = _empty_float() if weights is None else tf.cast(weights.values, tf.float32)
    batch = tf.shape(splits, out_type=tf.int64)[0] - 1
    if max_sequence_length > 0:
        splits = _checked_row_splits(splits, tf.size(ids, out_type=tf.int64), feature_name)
        rows = tf.ragged.row_splits_to_segment_ids(splits, out_type=tf.int64)
        positions = tf.range(tf.size(ids, out_type=tf.int64)) - tf.gather(splits, rows)
        keep = positions < max_sequence_length
        indices = tf.stack([tf.boolean_mask(rows, keep), tf.boolean_mask(positions, keep)], axis=1)
        indices = tf.concat([indices, tf.zeros_like(indices[:, :1])], axis=1)
        ids = tf.boolean_mask(ids, keep)
        if weights is not None:
            w = tf.boolean_mask(w, keep)
        return FeatureInput(indices, ids, w, tf.stack([batch, tf.constant(max_sequence_length, tf.int64)]))
    return FeatureInput(splits, ids, w, tf.reshape(batch, [1]))


def as_feature_inputs(
    features, argument: str, convert_ids: Callable[[object, str], tf.Tensor] | None = None
) -> list[FeatureInput]:
    """Checks an op's `features` argument (one `FeatureInput` or a non-empty list) and converts its tensors.

    Args:
      features: a FeatureInput or a sequence of them.
      argument: the argument's name, for errors.
      convert_ids: `convert_ids(ids, where)` -> the ids tensor; None converts to int64 (the dynamic ops keep
        string keys).

    Returns:
      The FeatureInputs, each tensor converted to the op's dtype.

    Raises:
      ValueError: `features` is empty or holds something else than FeatureInputs.
    """
    if isinstance(features, FeatureInput):
        features = [features]
    if not isinstance(features, Sequence) or not features:
        raise ValueError(f"{argument}: expected a non-empty list of FeatureInput, got {type(features).__name__}")
    out = []
    for i, f in enumerate(features):
        if not isinstance(f, FeatureInput):
            raise ValueError(
                f"{argument}[{i}]: expected a FeatureInput (see normalize_feature), got {type(f).__name__}"
            )
        ids = (
            tf.convert_to_tensor(f.ids, tf.int64) if convert_ids is None else convert_ids(f.ids, f"{argument}[{i}].ids")
        )
        out.append(
            FeatureInput(
                tf.convert_to_tensor(f.sample_indices_or_row_splits, tf.int64),
                ids,
                tf.convert_to_tensor(f.weights, tf.float32),
                tf.convert_to_tensor(f.sample_shape, tf.int64),
            )
        )
    return out


def serialized_config(config) -> bytes:
    if isinstance(config, (bytes, str)):
        return config if isinstance(config, bytes) else config.encode("latin-1")
    if hasattr(config, "SerializeToString"):
        return config.SerializeToString()
    raise ValueError(
        f"config: expected a TPUEmbeddingConfiguration or its serialized bytes, got {type(config).__name__}"
    )


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def checked_int(value, argument: str, minimum: int = INT64_MIN, maximum: int = INT64_MAX) -> int:
    """An integer argument (Python or numpy int, or an integer scalar tensor) as a Python int in [minimum, maximum].

    Every integer the wrappers pass as an op attribute or Python-side scalar goes through this before any op
    runs: TensorFlow's attribute conversion would otherwise wrap or fail only after the op ran.

    Raises:
      ValueError: naming the argument and the value, if it is not an integer (bools and floats included) or is
        out of range.
    """
    if isinstance(value, bool):
        raise ValueError(f"{argument}: must be an integer, got {value!r}")
    try:
        out = operator.index(value)
    except TypeError:
        raise ValueError(f"{argument}: must be an integer, got {value!r}") from None
    if not minimum <= out <= maximum:
        raise ValueError(f"{argument}: must be in [{minimum}, {maximum}], got {out}")
    return out


def int64_scalar(value, argument: str, minimum: int = INT64_MIN) -> tf.Tensor:
    """An integer scalar (Python/numpy int, checked by `checked_int`, or an integer tensor) as an int64 tensor.

    Raises:
      ValueError: naming the argument, for a non-integer, a Python int out of range or a tensor of another rank.
    """
    if isinstance(value, (int, np.integer)):
        value = checked_int(value, argument, minimum)
    value = tf.convert_to_tensor(value)
    if not value.dtype.is_integer:
        raise ValueError(f"{argument}: must be an integer, got {value.dtype.name}")
    if value.shape.rank not in (None, 0):
        raise ValueError(f"{argument}: must be a scalar, got shape {value.shape}")
    return tf.cast(value, tf.int64)


def checked_combiners(combiners) -> list[str]:
    if combiners is None:
        return []
    if isinstance(combiners, str):
        raise ValueError("combiners: expected a list of strings (one per table or per feature), got a string")
    out = list(combiners)
    for i, c in enumerate(out):
        if c not in _COMBINERS:
            raise ValueError(f"combiners[{i}] = {c!r}: must be one of {_COMBINERS}")
    return out


def _handles(variables, arg: str) -> list[tf.Tensor]:
    out = []
    for i, v in enumerate(variables):
        handle = getattr(v, "handle", None)
        if handle is None or handle.dtype != tf.resource:
            raise ValueError(f"{arg}[{i}]: expected a resource tf.Variable, got {type(v).__name__}")
        out.append(handle)
    return out


def embedding_activations(features, tables, config, combiners=None, name=None) -> list[tf.Tensor]:
    """Looks up and combines the embeddings of every feature (the TPU engine's forward pass).

    Feature i reads table ``config.feature_descriptor[i].table_id``.  Its activation has shape
    ``sample_shape + [dim]``: ``sum_i w_i * E[id_i] / norm`` per sample (norm 1 / sum w / sqrt(sum w^2) for
    sum / mean / sqrtn; zero for an empty sample or a zero norm), with simulated quantization of the table rows
    when the table's config enables it.  No gradient flows to ids, weights or tables.

    Args:
      features: list of FeatureInput (see :func:`normalize_feature`), in feature-descriptor order.
      tables: list of float32 tf.Variable [vocabulary_size, dim], in table order.
      config: a ``TPUEmbeddingConfiguration`` proto (or its serialized bytes) with one feature descriptor per
        feature.
      combiners: None (all "sum", as TF's enqueue ops), or one of "sum"/"mean"/"sqrtn" per table (preferred when
        there are as many tables as features) or per feature.
      name: op name.

    Returns:
      One float32 tensor per feature.

    Raises:
      ValueError: static misuse (argument kinds, combiner names).
      tf.errors.InvalidArgumentError: inputs inconsistent with the config (ids out of range, ...).

    Example:
      >>> acts = embedding_activations([normalize_feature(ids)], [table], config, combiners=["mean"])
    """
    with tf.name_scope(name or "embedding_activations"):
        feats = as_feature_inputs(features, "features")
        handles = _handles(tables, "tables")
        if not handles:
            raise ValueError("tables: at least one table variable is required")
        return _ops().tf_embed_embedding_activations(
            sample_indices_or_row_splits=[f.sample_indices_or_row_splits for f in feats],
            embedding_indices=[f.ids for f in feats],
            aggregation_weights=[f.weights for f in feats],
            sample_shapes=[f.sample_shape for f in feats],
            tables=handles,
            config=serialized_config(config),
            combiners=checked_combiners(combiners),
        )


def learning_rate_values(learning_rates) -> list[tf.Tensor]:
    out = []
    for i, lr in enumerate(learning_rates or []):
        value = lr() if callable(lr) else lr
        tensor = tf.convert_to_tensor(value, tf.float32)
        if tensor.shape.rank not in (None, 0):
            raise ValueError(f"learning_rates[{i}]: must be a scalar, got shape {tensor.shape}")
        out.append(tensor)
    return out


def send_tpu_embedding_gradients(
    gradients,
    learning_rates,
    features,
    tables,
    slots,
    config,
    combiners=None,
    name=None,
    check_numerics=False,
    rounding_step=None,
    rounding=None,
    rounding_seed=0,
    rounding_table_ids=None,
) -> tf.Operation:
    """Applies one training step to the tables and their slots in place (our SendTPUEmbeddingGradients).

    The gradient of each activation is distributed over its sample's ids (``w_i / norm_s * dL/dact[s]``),
    summed per table row across all features sharing the table, and each touched row (every row for
    non-lazy Adam) goes through gradient clipping, decoupled weight decay, the table's optimizer and weight
    clipping.  Results are bitwise independent of the thread count.  A rejected call changes nothing.

    Args:
      gradients: one float32 tensor per feature, shaped like its activation.
      learning_rates: one scalar (float, tensor or zero-argument callable, evaluated now) per dynamic
        learning-rate tag of the config, in tag order; empty when all rates are constant.  Each must be finite
        and >= 0 (checked by the op, which then names the tag and the tables using it).
      features: the same FeatureInput list the activations were computed from.
      tables: list of tf.Variable [vocabulary_size, dim], in table order: float32, or bfloat16 / float16
        (16-bit storage: the optimizer runs in float32 and rows are rounded back, docs/low_precision.md).
      slots: per table, the list of its slot variables in Load/Retrieve order (e.g. Adam: momenta,
        velocities; SGD: []); each float32, bfloat16 or float16.
      config: the TPUEmbeddingConfiguration (proto or bytes).
      combiners: as for :func:`embedding_activations`.
      name: op name.
      check_numerics: if True, a gradient holding NaN or +-inf rejects the whole step (the error names the
        feature, the table and the position).  By default such gradients are applied, as the TPU applies them.
      rounding_step: an int64 scalar >= 0 (the training step) keying stochastic rounding's random bits; required
        when a 16-bit table or slot rounds stochastically, ignored otherwise.
      rounding: per table, "stochastic" (default) or "nearest": how its 16-bit table and slots are rounded.
      rounding_seed: the seed of stochastic rounding's generator (an int64; checked before any op runs).
      rounding_table_ids: per table, the table index that keys its stochastic rounding, each >= 0 and distinct
        (None: its position in `config`). The front ends pass each table its index among all the static tables
        of its embedding (`tf_embed_ops.tiered.engine.rounding_table_ids`), so a table rounds the same whether
        or not other tables of the embedding are tiered (docs/low_precision.md).

    Returns:
      The update op (eagerly: None after it ran).

    Raises:
      ValueError: static misuse (list lengths, argument kinds).
      tf.errors.InvalidArgumentError: inputs inconsistent with the config; nothing is changed then.

    Example:
      >>> acts = embedding_activations(feats, [table], config)
      >>> send_tpu_embedding_gradients(tape.gradient(loss, acts), [], feats, [table], [[accumulator]], config)
    """
    rounding_seed = checked_int(rounding_seed, "rounding_seed")
    if isinstance(rounding_step, (int, np.integer)):
        rounding_step = checked_int(rounding_step, "rounding_step", 0)
    with tf.name_scope(name or "send_tpu_embedding_gradients"):
        feats = as_feature_inputs(features, "features")
        grads = [tf.convert_to_tensor(g, tf.float32) for g in gradients]
        if len(grads) != len(feats):
            raise ValueError(f"gradients: expected one per feature ({len(feats)}), got {len(grads)}")
        table_handles = _handles(tables, "tables")
        if len(slots) != len(table_handles):
            raise ValueError(f"slots: expected one list per table ({len(table_handles)}), got {len(slots)}")
        slot_handles = []
        for t, table_slots in enumerate(slots):
            slot_handles.extend(_handles(table_slots, f"slots[{t}]"))
        table_ids = [checked_int(t, "rounding_table_ids", 0) for t in (rounding_table_ids or [])]
        if table_ids and len(table_ids) != len(table_handles):
            raise ValueError(f"rounding_table_ids: expected one per table ({len(table_handles)}), got {len(table_ids)}")
        args = dict(
            inputs=grads,
            learning_rates=learning_rate_values(learning_rates),
            sample_indices_or_row_splits=[f.sample_indices_or_row_splits for f in feats],
            embedding_indices=[f.ids for f in feats],
            aggregation_weights=[f.weights for f in feats],
            sample_shapes=[f.sample_shape for f in feats],
            tables=table_handles,
            slots=slot_handles,
            config=serialized_config(config),
            combiners=checked_combiners(combiners),
            check_numerics=bool(check_numerics),
            rounding=list(rounding or []),
            rounding_seed=rounding_seed,
            rounding_table_ids=table_ids,
        )
        if rounding_step is None:
            return _ops().tf_embed_send_tpu_embedding_gradients(**args)
        # The V2 op: the same plus the step that keys stochastic rounding (docs/low_precision.md). The step counts
        # from 0; a negative one (never produced by the front ends) is refused before the update.
        step = tf.convert_to_tensor(rounding_step, tf.int64)
        with tf.control_dependencies(
            [tf.debugging.assert_non_negative(step, message="rounding_step: must be >= 0 (nothing was changed)")]
        ):
            step = tf.identity(step)
        return _ops().tf_embed_send_tpu_embedding_gradients_v2(**args, rounding_step=step)


def embedding_lookup_and_update(
    features,
    tables,
    slots,
    config,
    combiners=None,
    learning_rates=None,
    trigger=None,
    check_numerics=False,
    rounding_arguments=None,
    after_update=None,
) -> list[tf.Tensor]:
    """Activations whose backward pass applies the fused table update (the Keras-layer building block).

    Returns the activations of :func:`embedding_activations` wrapped in ``tf.custom_gradient`` with one extra
    input, ``trigger`` (a float32 scalar: typically the value of a trainable dummy variable of the layer).  When
    a tape differentiates the loss with respect to ``trigger`` (or to the variable it was read from), the
    gradient function runs :func:`send_tpu_embedding_gradients` with the activations' gradients and returns a
    zero gradient for ``trigger`` computed from a table value read after the update.  The update is therefore a
    data dependency (not merely a control edge, which Grappler was measured to drop in Keras' compiled train
    step) of the trigger's gradient.  Gradients that do not reach an activation are zeros.

    Args:
      features, tables, slots, config, combiners: as for :func:`send_tpu_embedding_gradients`.
      learning_rates: per dynamic tag, floats / tensors / zero-argument callables (evaluated when the gradient
        runs, i.e. once per step).
      trigger: float32 scalar tensor the update hangs on; None uses a constant zero, which only works when
        the caller differentiates with respect to the returned activations' producer itself (rarely useful).
      check_numerics: as for :func:`send_tpu_embedding_gradients`.
      rounding_arguments: None, or a zero-argument callable returning the `rounding_step` / `rounding` /
        `rounding_seed` / `rounding_table_ids` keyword arguments of :func:`send_tpu_embedding_gradients` (called
        when the gradient runs, once per step: 16-bit tables, docs/low_precision.md).
      after_update: None, or a callable given ``[update op]`` once the update is built (e.g. to count the step
        after it, ``TPUEmbedding.advance_rounding_step``).

    Returns:
      One activation per feature.

    Example:
      >>> dummy = tf.Variable(0.0)
      >>> with tf.GradientTape() as tape:
      ...     acts = embedding_lookup_and_update(feats, [table], [[acc]], config, trigger=dummy.read_value())
      ...     loss = tf.reduce_sum(acts[0])
      >>> tape.gradient(loss, dummy)  # runs the fused update
    """
    feats = as_feature_inputs(features, "features")
    tables = list(tables)
    slots = [list(s) for s in slots]
    rates = list(learning_rates or [])
    trigger = tf.zeros([], tf.float32) if trigger is None else trigger

    def update(gradients: list) -> tf.Tensor:
        extra = rounding_arguments() if rounding_arguments is not None else {}
        op = send_tpu_embedding_gradients(
            gradients, rates, feats, tables, slots, config, combiners, check_numerics=check_numerics, **extra
        )
        if after_update is not None:
            after_update([op])
        return update_trigger.probe_after([op], tables[0])

    return update_trigger.hang_update_on_trigger(
        trigger, lambda: embedding_activations(feats, tables, config, combiners), update
    )


def adam_bias_corrected_learning_rate(
    learning_rate: LearningRate, beta1: float, beta2: float, step_variable
) -> Callable[[], tf.Tensor]:
    """The dynamic learning rate TPU Adam expects: ``lr * sqrt(1 - beta2^t) / (1 - beta1^t)`` (docs/semantics.md).

    TPU Adam applies no bias correction itself; users fold it into a callable learning rate.  Here
    ``t = step_variable + 1``: ``step_variable`` counts the steps already applied (like Keras'
    ``optimizer.iterations``), so the first update uses t = 1.

    Args:
      learning_rate: the base rate (float, tensor, variable or zero-argument callable).
      beta1, beta2: Adam's decay rates, in [0, 1).
      step_variable: integer variable/tensor of completed steps.

    Returns:
      A zero-argument callable returning the float32 corrected rate.

    Raises:
      ValueError: beta outside [0, 1).

    Example:
      >>> step = tf.Variable(0, dtype=tf.int64)
      >>> lr = adam_bias_corrected_learning_rate(0.001, 0.9, 0.999, step)
      >>> float(lr())  # 0.001 * sqrt(0.001) / 0.1
    """
    for arg, beta in (("beta1", beta1), ("beta2", beta2)):
        if not 0.0 <= float(beta) < 1.0:
            raise ValueError(f"{arg}: must be in [0, 1), got {beta}")

    def corrected() -> tf.Tensor:
        lr = learning_rate() if callable(learning_rate) else learning_rate
        lr = tf.convert_to_tensor(lr, tf.float32)
        t = tf.cast(tf.convert_to_tensor(step_variable), tf.float32) + 1.0
        return lr * tf.sqrt(1.0 - tf.pow(float(beta2), t)) / (1.0 - tf.pow(float(beta1), t))

    return corrected


tf.no_gradient("TfEmbed>EmbeddingActivations")
tf.no_gradient("TfEmbed>SendTPUEmbeddingGradients")
