"""to_feature_config(): a TPUEmbeddingConfiguration -> TableConfig/FeatureConfig/optimizer objects again.

So a config saved from a TPU job becomes the Python objects ``TPUEmbedding`` (TensorFlow's or ours) takes, and
``from_feature_config(*to_feature_config(c))`` gives ``c`` back field for field (see the function's notes for
what a proto cannot carry).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from tf_embed_ops.config import _optimizers
from tf_embed_ops.config._load import ConfigSource, load
from tf_embed_ops.config._resolve import first_appearance
from tf_embed_ops.config._view import EmbeddingConfig, TableInfo

_emb = tf.tpu.experimental.embedding


class DynamicLearningRate:
    """The learning rate of dynamic tag ``tag``: a zero-argument callable, as TF's optimizers take.

    A config stores only the tag; the schedule itself lived in the program that wrote it.  ``to_feature_config``
    puts one of these (shared by all tables with that tag) where the callable was, so the tags survive a round
    trip.  Give it a value or a schedule before training:

      >>> features, opt = to_feature_config(cfg)
      >>> opt.learning_rate.set(lambda: 0.01 * decay(step))   # or .set(0.01)

    Calling it before ``set`` raises RuntimeError rather than training with a made-up rate.
    """

    def __init__(self, tag: int, value: float | Callable[[], Any] | None = None):
        self.tag = tag
        self._value = value

    def set(self, value: float | Callable[[], Any]) -> None:
        """Sets the rate: a number, or a zero-argument callable evaluated at every step."""
        self._value = value

    def __call__(self) -> Any:
        if self._value is None:
            raise RuntimeError(
                f"DynamicLearningRate(tag={self.tag}) has no value: call .set(rate_or_callable) on it before training"
            )
        return self._value() if callable(self._value) else self._value

    def __repr__(self) -> str:
        return f"DynamicLearningRate(tag={self.tag}, value={self._value!r})"


def _optimizer_parts(cfg: EmbeddingConfig) -> list[bytes]:
    # Simulated quantization lives in OptimizationParameters but belongs to TableConfig, not to the optimizer.
    parts = []
    for td in cfg.to_proto().table_descriptor:
        params = td.optimization_parameters
        params.ClearField("simulated_quantization")
        parts.append(params.SerializeToString(deterministic=True))
    return parts


def _warn_if_not_canonical(cfg: EmbeddingConfig) -> None:
    # from_feature_config numbers tables and tags by first appearance (the resolver); a config numbered otherwise
    # (not one TF built) comes back renumbered.
    first_use = first_appearance(f.table_id for f in cfg.features)
    first_tags = first_appearance(t.learning_rate.tag for t in cfg.tables if t.learning_rate.is_dynamic)
    if first_use != list(range(len(cfg.tables))) or first_tags != sorted(first_tags):
        warnings.warn(
            "to_feature_config: this config numbers its tables or learning-rate tags in an order other than first "
            "use, so from_feature_config will renumber them (the model is the same)",
            stacklevel=3,
        )


def _combiner_for(combiner: str | Mapping[str, str], table: TableInfo) -> str:
    if isinstance(combiner, str):
        return combiner
    try:
        return combiner[table.name]
    except KeyError:
        raise ValueError(f"combiner: no entry for table {table.name!r}") from None


def to_feature_config(
    embedding_config: EmbeddingConfig | ConfigSource,
    *,
    combiner: str | Mapping[str, str] = "mean",
    initializer: Callable[..., Any] | None = None,
) -> tuple[Any, Any]:
    """The inverse of :func:`from_feature_config`.

    Args:
      embedding_config: an ``EmbeddingConfig``, or anything :func:`load` accepts (validated first).
      combiner: ``"mean"``, ``"sum"`` or ``"sqrtn"`` for every table, or ``{table_name: combiner}``.  The proto
        has no combiner (it is an enqueue argument).
      initializer: the ``TableConfig.initializer`` of every table (None: TensorFlow's default).  Not in the proto.

    Returns:
      ``(feature_config, optimizer)``.  ``feature_config`` is a dict keyed by feature name when every feature is
      named, the names are unique and already in sorted order (so ``tf.nest.flatten`` keeps the config's feature
      order); otherwise a tuple in feature order.  ``optimizer`` is the one optimizer object all tables share when
      their optimization parameters are identical (the tables' own ``optimizer`` is then None), else None with a
      per-table optimizer on each TableConfig.  Dynamic learning rates are :class:`DynamicLearningRate` objects,
      one per tag; set them before training.

    Notes on the round trip ``from_feature_config(*to_feature_config(c)) == c``: it holds for every config
    TensorFlow's ``TPUEmbedding`` can build (with ``num_hosts``/``num_tensor_cores``/pipelining passed back to
    ``from_feature_config``).  A proto cannot carry: Adagrad/FTRL ``initial_accumulator_value`` (the default 0.1
    is used), the unpadded vocabulary size, combiners, initializers, ``max_sequence_length`` (the sequence shape
    is kept as ``output_shape``).  Fields TF never writes come back normalised: UNSPECIFIED accumulation becomes
    ENABLED, an unset learning rate becomes constant 0, infinite clip bounds become absent, a V1-style config
    (no feature descriptors) becomes one feature per table.  Tables/tags not numbered by first use are renumbered
    (a warning says so).

    Raises:
      ConfigError: ``embedding_config`` does not load.
      ValueError: an unknown combiner, or a ``combiner`` mapping missing a table.

    Example:
      >>> features, optimizer = to_feature_config("model.pbtxt", combiner="sum")
      >>> proto = from_feature_config(features, optimizer)
    """
    cfg = load(embedding_config)
    _warn_if_not_canonical(cfg)
    dynamic = {tag: DynamicLearningRate(tag) for tag in range(cfg.num_learning_rate_tags)}

    def learning_rate(table: TableInfo) -> Any:
        return dynamic[table.learning_rate.tag] if table.learning_rate.is_dynamic else table.learning_rate.constant

    def make(table: TableInfo) -> Any:
        return _optimizers.codec_for_kind(table.optimizer.kind).make(table, learning_rate(table))

    shared = len(set(_optimizer_parts(cfg))) == 1
    global_optimizer = make(cfg.tables[0]) if shared else None
    tables = []
    for t in cfg.tables:
        q = t.simulated_quantization
        tables.append(
            _emb.TableConfig(
                vocabulary_size=t.vocabulary_size,
                dim=t.dimension,
                initializer=initializer,
                optimizer=None if shared else make(t),
                combiner=_combiner_for(combiner, t),
                name=t.name,
                quantization_config=None if q is None else _emb.QuantizationConfig(q.num_buckets, q.lower, q.upper),
            )
        )
    features = [
        _emb.FeatureConfig(
            table=tables[f.table_id],
            name=f.name or None,
            output_shape=list(f.input_shape) if f.input_shape else None,
        )
        for f in cfg.features
    ]
    names = [f.name for f in cfg.features]
    if all(names) and len(set(names)) == len(names) and names == sorted(names):
        return {f.name: feature for f, feature in zip(cfg.features, features, strict=False)}, global_optimizer
    return tuple(features), global_optimizer
