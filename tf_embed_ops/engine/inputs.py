"""Input normalisation: a nest of ids (and weights) -> one `FeatureInput` per feature, in feature order.

The checks and wording are TensorFlow's (`TPUEmbedding.enqueue` / `TPUEmbeddingForServing.embedding_lookup`),
then ours: every error names the feature's key path. Each feature's input is normalised by the table group that
looks it up (`backends.protocol.TableGroup.normalize_input`: a dynamic table's int64 or string keys, the others'
numbered rows).
"""

from __future__ import annotations

import difflib
import functools
from typing import Any, NamedTuple

import tensorflow as tf
from absl import logging

from tf_embed_ops import features as features_lib

__all__ = [
    "build_output_shapes",
    "Pending",
    "PendingSlot",
    "checked_pending",
    "complete_subset",
    "pending_batch",
    "merge_output_shapes",
    "normalize_inputs",
    "output_shape_positions",
    "output_shapes_from_input_shapes",
    "present_shapes",
]


def normalize_inputs(feature_config: Any, groups: Any, features: Any, weights: Any) -> tuple[list, list]:
    """Validates and normalises `features` (and `weights`) to `FeatureInput`s in flattened feature order.

    Args:
      feature_config: the nest of `FeatureConfig`s.
      groups: the embedding's table groups (`backends.protocol.TableGroup`), which between them look up every
        feature: each normalises its features' inputs.
      features: a nest matching it of dense, sparse or ragged ids.
      weights: None, or a nest matching it of weights of the ids' kind (None entries allowed).

    Returns:
      The `FeatureInput`s and the incoming output shapes (each input's shape by TensorFlow's rule).

    Raises:
      ValueError: on a structure, rank, kind or weight mismatch (naming the feature).
    """
    flat_features = _flatten_like(feature_config, features, "features")
    flat_weights = [None] * len(flat_features) if weights is None else _flatten_like(feature_config, weights, "weights")

    inputs, shapes = [], []
    group_of = {i: group for group in groups for i in group.positions}
    paths_and_configs = features_lib.flatten_with_paths(feature_config)
    for position, ((path, feature), inp, weight) in enumerate(
        zip(paths_and_configs, flat_features, flat_weights, strict=False)
    ):
        if isinstance(inp, (tf.SparseTensor, tf.RaggedTensor)):
            pass
        elif inp is None:
            raise ValueError(f"Feature {path}: got None; every feature needs an input.")
        else:
            inp = tf.convert_to_tensor(inp)
            if weight is not None:
                # TensorFlow's serving-class wording first (callers match on it), then ours.
                raise ValueError(
                    f"Weight specified for {path}, but input is dense. Weight will always be 1 in this case."
                )
        if weight is not None and not isinstance(weight, type(inp)):
            raise ValueError(
                f"Weight for {path} is of type {type(weight)} but it does not match type of the input which is "
                f"{type(inp)}. Weights must be of the same kind as the ids."
            )
        rank = inp.shape.rank
        composite = isinstance(inp, (tf.SparseTensor, tf.RaggedTensor))
        positions = output_shape_positions(path, inp, feature)
        if positions:
            # TensorFlow ignores weights (and the combiner) of such a sequence lookup; a dense id is a row
            # holding one id.
            max_len, weight = positions, None
            if isinstance(inp, tf.Tensor):
                inp = tf.RaggedTensor.from_tensor(tf.reshape(inp, [-1, 1]))
        elif composite and rank == 2 and features_lib.is_sequence(feature):
            max_len = feature.max_sequence_length
        else:
            if feature.max_sequence_length > 0 and isinstance(inp, tf.SparseTensor) and (rank or 0) > 2:
                logging.warning(
                    "Input tensor is rank %d which is above 2, the max_sequence_length setting will be ignored.",
                    rank,
                )
            max_len = 0
        try:
            normalized = group_of[position].normalize_input(feature, inp, weight, max_len, path)
        except ValueError as e:
            raise ValueError(f"Feature {path}: {e}") from e
        inputs.append(normalized)
        shapes.append(features_lib.output_shape(inp.shape, feature, not isinstance(inp, tf.Tensor)))
    return inputs, shapes


def _flatten_like(feature_config: Any, given: Any, argument: str) -> list:
    """`given` flattened, once it has the structure of `feature_config` (else a ValueError naming `argument`)."""
    features_lib.check_feature_keys(feature_config, given, argument)
    try:
        tf.nest.assert_same_structure(feature_config, given)
    except (ValueError, TypeError) as e:
        raise ValueError(f"Argument `{argument}` must have the structure of `feature_config`: {e}") from e
    return tf.nest.flatten(given)


def output_shape_positions(path: str, inp: Any, feature: Any) -> int:
    """The sequence length a `FeatureConfig.output_shape` implies for this input, or 0 for a plain lookup.

    TensorFlow's rule: with B samples and P = prod(output_shape), P == B is a plain lookup reshaped to
    `output_shape + [dim]`; P a larger multiple of B makes the feature a sequence of P / B positions (ids padded
    or truncated per sample, no combiner, no weights); anything else is a ValueError at lookup time. Only inputs
    with one sample axis (dense [B] or [B, 1], rank-2 sparse or ragged) can be sequences. When B is not known
    statically the lookup is plain and the reshape checks P == B when it runs.

    Raises:
      ValueError: P is neither B nor a larger multiple of it (for an input with one sample axis).
    """
    if not feature.output_shape:
        return 0
    shape = inp.shape
    if shape.rank is None:
        return 0
    dims = shape.as_list()
    sample_dims = dims if isinstance(inp, tf.Tensor) and (len(dims) == 1 or dims[-1] != 1) else dims[:-1]
    if any(d is None for d in sample_dims):
        return 0
    samples = functools.reduce(lambda a, b: a * b, sample_dims, 1)
    product = functools.reduce(lambda a, b: a * b, feature.output_shape.as_list(), 1)
    if product == samples:
        return 0
    one_sample_axis = len(sample_dims) == 1 and not (isinstance(inp, tf.Tensor) and len(dims) == 2 and dims[1] != 1)
    if samples > 0 and product > samples and product % samples == 0 and one_sample_axis:
        return product // samples
    raise ValueError(
        "Output shape set in the FeatureConfig should be the factor of the input data batch size. But instead got "
        f"output shape {feature.output_shape}, input data batch size {samples} (feature {path}: the product of "
        "output_shape must equal the number of samples, or be a larger multiple of it for a sequence lookup)."
    )


def complete_subset(feature_config: Any, features: Any, weights: Any) -> tuple[list, Any, Any]:
    """Maps a nest of some of the features onto `feature_config`, with empty stand-ins for the others.

    The stand-ins (a dense batch of no ids) keep the configuration and table order of the full feature set, so
    the kernels run unchanged; their activations are dropped.

    Returns:
      (the key paths of `features` in its flatten order, the completed features, the completed weights).

    Raises:
      ValueError: if a key path of `features` is not one of `feature_config`'s (TensorFlow's wording), or
        `weights` does not have the structure of `features`.
    """
    flat_inputs = features_lib.flatten_with_paths(features)
    if weights is not None:
        try:
            tf.nest.assert_same_structure(features, weights)
        except (ValueError, TypeError) as e:
            raise ValueError(f"Argument `weights` must have the structure of `features`: {e}") from e
        flat_weights = tf.nest.flatten(weights)
    else:
        flat_weights = [None] * len(flat_inputs)
    config_paths = [path for path, _ in features_lib.flatten_with_paths(feature_config)]
    input_keys = {path for path, _ in flat_inputs}
    if not input_keys.issubset(config_paths):
        unknown = sorted(input_keys - set(config_paths))
        hints = [
            f"{key!r} (did you mean {close[0]!r}?)"
            if (close := difflib.get_close_matches(key, config_paths, n=1))
            else repr(key)
            for key in unknown
        ]
        raise ValueError(
            f"Inputs are not a subset of feature_config. Inputs keys are {input_keys}, but feature_config keys "
            f"are {config_paths}. Unknown keys: {', '.join(hints)}."
        )
    by_path = {path: (inp, w) for (path, inp), w in zip(flat_inputs, flat_weights, strict=True)}
    full_inputs, full_weights = [], []
    for path, feature in zip(config_paths, tf.nest.flatten(feature_config), strict=True):
        # A feature with an output_shape needs that many samples to stay a plain lookup (of row 0).
        samples = feature.output_shape.num_elements() if feature.output_shape else 0
        key_dtype = getattr(feature.table, "key_dtype", tf.int64)  # a string-keyed dynamic table: string ids
        inp, w = by_path.get(path, (tf.zeros([samples], key_dtype), None))
        full_inputs.append(inp)
        full_weights.append(w)
    present = [path for path, _ in flat_inputs]
    return (
        present,
        tf.nest.pack_sequence_as(feature_config, full_inputs),
        tf.nest.pack_sequence_as(feature_config, full_weights),
    )


def output_shapes_from_input_shapes(input_shapes: list, flat_features: list) -> list:
    """TF's rule: a rank-2 non-[B,1] input of a sequence feature gets [B, L]; otherwise drop the last axis."""
    out = []
    for shape, feature in zip(input_shapes, flat_features, strict=False):
        if shape.rank is None or shape.rank < 1:
            raise ValueError(f"Received input tensor of shape {shape}. Rank must be 1 and above.")
        out.append(features_lib.output_shape(shape, feature, shape.rank == 2 and shape[-1] != 1))
    return out


def build_output_shapes(feature_config: Any, per_replica_input_shapes: Any, per_replica_batch_size: Any) -> list | None:
    """The output shapes `build`'s arguments fix (None: neither is given): a nest of input shapes matching
    `feature_config`, or one batch size for every feature (either argument, the older form).

    Raises:
      ValueError: the shapes' structure does not match `feature_config`, or a shape's rank is below 1.
    """
    flat_features = tf.nest.flatten(feature_config)
    if per_replica_input_shapes is not None and not isinstance(per_replica_input_shapes, int):
        tf.nest.assert_same_structure(tf.nest.flatten(per_replica_input_shapes), flat_features)
        shapes = [tf.TensorShape(s) for s in tf.nest.flatten(per_replica_input_shapes)]
        return output_shapes_from_input_shapes(shapes, flat_features)
    batch = per_replica_input_shapes if per_replica_input_shapes is not None else per_replica_batch_size
    return None if batch is None else features_lib.batch_output_shapes(flat_features, batch)


def merge_output_shapes(known: list, incoming: list) -> list:
    """The output shapes with the still-unknown ones of `known` filled from `incoming` (for `config_proto`); known
    ones stay, as TF's priority order says.

    Unlike the TPU engine, the CPU kernels accept any batch shape, so a later batch of another size (say the last,
    partial one) is not an error; the configuration keeps describing the first. A shape with a zero dimension (an
    empty batch) fixes nothing: a configuration's `input_shape` must be positive, so taking it would make every
    later batch's configuration invalid.
    """

    def describes_a_batch(shape: tf.TensorShape) -> bool:
        return shape.rank is not None and shape.rank > 0 and all(d != 0 for d in shape.as_list())

    return [
        old if old.rank is not None and old.rank > 0 else (new if describes_a_batch(new) else old)
        for old, new in zip(known, incoming, strict=False)
    ]


def present_shapes(feature_config: Any, shapes: list, present: list) -> list:
    """`shapes` (one per feature) with unknown shapes for the features not in `present` (their key paths): the
    stand-ins `complete_subset` adds must not fix `config_proto`'s shapes."""
    config_paths = [path for path, _ in features_lib.flatten_with_paths(feature_config)]
    return [s if p in present else tf.TensorShape(None) for s, p in zip(shapes, config_paths, strict=True)]


class Pending(NamedTuple):
    """What `enqueue` leaves for `dequeue` and `apply_gradients` (the TPU engine keeps this hidden)."""

    inputs: list  # list[embedding_ops.FeatureInput], in feature order
    training: bool
    graph: Any  # the graph the tensors live in (None when eager)


class PendingSlot:
    """Where an object keeps its queued `Pending` batch, out of TensorFlow's object tracking. Held directly, the batch
    (a tuple of tensors, replaced by every `enqueue`) would be a tracked child of the object, and a checkpoint saved
    on another thread while training replaced it would find that child gone in the middle of its walk."""

    __slots__ = ("batch",)

    def __init__(self) -> None:
        self.batch: Pending | None = None


def _current_graph() -> Any:
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def pending_batch(inputs: list, training: bool) -> Pending:
    """The batch `enqueue` queues, in the graph it is traced in (None eagerly)."""
    return Pending(inputs, training, _current_graph())


def checked_pending(pending: Pending | None, built: bool, what: str) -> Pending:
    """The queued batch for `what` (dequeue / apply_gradients), refused when the object is not built, nothing is
    queued, or the batch lives in another graph."""
    if not built:
        raise RuntimeError(
            f"{what} called on unbuilt TPUEmbedding object. Please either call enqueue first or manually call the "
            "build method."
        )
    if pending is None:
        raise RuntimeError(f"{what} called before enqueue: there is no batch of ids to use.")
    if pending.graph is not None and pending.graph is not _current_graph():
        raise RuntimeError(
            f"{what} must run in the same tf.function (or eagerly, in the same context) as the enqueue that queued "
            "its ids; call enqueue again here."
        )
    return pending
