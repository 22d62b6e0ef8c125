"""Optimizer classes <-> OptimizationParameters, one registration per class.

``from_feature_config`` finds the codec of an optimizer object by its class (walking the MRO, so subclasses
work); ``to_feature_config`` finds the codec of a table by its proto algorithm ``kind`` and builds an object of
the first class registered for it.  TensorFlow's five ``tf.tpu.experimental.embedding`` optimizers are registered
here; another optimizer class (e.g. a tf_embed_ops one) is one :func:`register_optimizer` call.

The fill functions write field for field what TensorFlow's ``_Optimizer._set_optimization_parameters`` writes,
except that ``low_dimensional_packing_status`` is assigned as an int: TensorFlow assigns the Python bool, which
protobuf 7 rejects (docs/semantics.md, "Python behaviour we do not copy").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2

from tf_embed_ops.config._view import TableInfo
from tf_embed_ops.optimizers import CATALOGUE, set_common_optimization_parameters

OptimizationParameters = optimization_parameters_pb2.OptimizationParameters
_ACCUMULATION = optimization_parameters_pb2.GradientAccumulationStatus
_PACKING = optimization_parameters_pb2.LowDimensionalPackingStatus


@dataclasses.dataclass(frozen=True)
class OptimizerCodec:
    """How one optimizer class maps to the proto.

    Attributes:
      kind: the ``OptimizationParameters.parameters`` oneof field it sets (``"adam"``...).
      optimizer_class: the Python class.
      fill: ``fill(optimizer, params)`` writes every field but the learning rate (which the table's dynamic-tag
        numbering decides) into an empty ``OptimizationParameters``.
      make: ``make(table_info, learning_rate) -> optimizer``, the inverse (None: this class is not produced by
        ``to_feature_config``).
    """

    kind: str
    optimizer_class: type
    fill: Callable[[Any, OptimizationParameters], None]
    make: Callable[[TableInfo, Any], Any] | None = None


_BY_CLASS: dict[type, OptimizerCodec] = {}
_BY_KIND: dict[str, OptimizerCodec] = {}


def register_optimizer(codec: OptimizerCodec) -> None:
    """Registers an optimizer class.  The first class registered for a ``kind`` is what ``to_feature_config``
    builds for tables of that kind."""
    _BY_CLASS[codec.optimizer_class] = codec
    if codec.make is not None:
        _BY_KIND.setdefault(codec.kind, codec)


def codec_for_optimizer(optimizer: Any) -> OptimizerCodec | None:
    for klass in type(optimizer).__mro__:
        if klass in _BY_CLASS:
            return _BY_CLASS[klass]
    return None


def codec_for_kind(kind: str) -> OptimizerCodec:
    try:
        return _BY_KIND[kind]
    except KeyError:
        raise ValueError(f"no optimizer class is registered for optimizer kind {kind!r}") from None


def supported_optimizer_classes() -> tuple[type, ...]:
    return tuple(_BY_CLASS)


# ---- the fields every TensorFlow optimizer writes (tpu_embedding_v2_utils._Optimizer) ----


# Accumulation, weight and gradient clipping, weight decay and packing, as ``_Optimizer`` writes them (without
# its protobuf-7 crash); shared with tf_embed_ops.optimizers.
fill_common = set_common_optimization_parameters


def common_kwargs(table: TableInfo, learning_rate: Any) -> dict[str, Any]:
    """The ``_Optimizer`` constructor arguments that make :func:`fill_common` write ``table``'s fields back."""
    packing = {"UNSPECIFIED": False, "ENABLED": True}.get(table.low_dimensional_packing_status, _PACKING.DISABLED)
    clip = table.gradient_clipping
    return {
        "learning_rate": learning_rate,
        "use_gradient_accumulation": table.gradient_accumulation,
        "clip_weight_min": table.weight_clipping.lower,
        "clip_weight_max": table.weight_clipping.upper,
        "weight_decay_factor": table.weight_decay_factor or None,
        "multiply_weight_decay_factor_by_learning_rate": table.multiply_weight_decay_factor_by_learning_rate,
        "clipvalue": (clip.lower, clip.upper) if clip.active else None,
        "low_dimensional_packing_status": packing,
    }


def _slot_default(table: TableInfo, slot: str) -> float:
    # Adagrad/FTRL's initial_accumulator_value is not in the proto; the C++ optimizer's default (0.1) stands in.
    return next(s.default_initial_value for s in table.optimizer.slots if s.name == slot)


# ---- TensorFlow's five optimizers (tpu_embedding_v2_utils.py) ----

_emb = tf.tpu.experimental.embedding


def _fill_sgd(opt: Any, params: OptimizationParameters) -> None:
    fill_common(opt, params)
    params.stochastic_gradient_descent.SetInParent()


def _fill_adagrad(opt: Any, params: OptimizationParameters) -> None:
    fill_common(opt, params)
    params.adagrad.SetInParent()


def _fill_adagrad_momentum(opt: Any, params: OptimizationParameters) -> None:
    fill_common(opt, params)
    m = params.adagrad_momentum
    m.SetInParent()
    m.momentum = opt.momentum
    m.use_nesterov = opt.use_nesterov
    m.exponent = opt.exponent
    m.beta2 = opt.beta2
    m.epsilon = opt.epsilon


def _fill_ftrl(opt: Any, params: OptimizationParameters) -> None:
    fill_common(opt, params)
    f = params.ftrl
    f.l1 = opt.l1_regularization_strength
    f.l2 = opt.l2_regularization_strength
    f.lr_power = opt.learning_rate_power
    f.beta = opt.beta
    f.multiply_linear_by_lr = opt.multiply_linear_by_learning_rate
    f.allow_zero_accumulator = opt.allow_zero_accumulator


def _fill_adam(opt: Any, params: OptimizationParameters) -> None:
    fill_common(opt, params)
    a = params.adam
    a.beta1 = opt.beta_1
    a.beta2 = opt.beta_2
    a.epsilon = opt.epsilon
    a.use_non_lazy_adam = not opt.lazy_adam
    a.use_sum_inside_sqrt = opt.sum_inside_sqrt


def _make_sgd(table: TableInfo, lr: Any) -> Any:
    return _emb.SGD(**common_kwargs(table, lr))


def _make_adagrad(table: TableInfo, lr: Any) -> Any:
    return _emb.Adagrad(initial_accumulator_value=_slot_default(table, "accumulators"), **common_kwargs(table, lr))


def _make_adagrad_momentum(table: TableInfo, lr: Any) -> Any:
    h = table.optimizer.hyperparameters
    return _emb.AdagradMomentum(
        momentum=h["momentum"],
        use_nesterov=h["use_nesterov"],
        exponent=h["exponent"],
        beta2=h["beta2"],
        epsilon=h["epsilon"],
        **common_kwargs(table, lr),
    )


def _make_ftrl(table: TableInfo, lr: Any) -> Any:
    h = table.optimizer.hyperparameters
    return _emb.FTRL(
        learning_rate_power=h["lr_power"],
        l1_regularization_strength=h["l1"],
        l2_regularization_strength=h["l2"],
        beta=h["beta"],
        initial_accumulator_value=_slot_default(table, "accumulators"),
        multiply_linear_by_learning_rate=h["multiply_linear_by_lr"],
        allow_zero_accumulator=h["allow_zero_accumulator"],
        **common_kwargs(table, lr),
    )


def _make_adam(table: TableInfo, lr: Any) -> Any:
    h = table.optimizer.hyperparameters
    return _emb.Adam(
        beta_1=h["beta1"],
        beta_2=h["beta2"],
        epsilon=h["epsilon"],
        lazy_adam=not h["use_non_lazy_adam"],
        sum_inside_sqrt=h["use_sum_inside_sqrt"],
        **common_kwargs(table, lr),
    )


for _codec in (
    OptimizerCodec("stochastic_gradient_descent", _emb.SGD, _fill_sgd, _make_sgd),
    OptimizerCodec("adagrad", _emb.Adagrad, _fill_adagrad, _make_adagrad),
    OptimizerCodec("adagrad_momentum", _emb.AdagradMomentum, _fill_adagrad_momentum, _make_adagrad_momentum),
    OptimizerCodec("ftrl", _emb.FTRL, _fill_ftrl, _make_ftrl),
    OptimizerCodec("adam", _emb.Adam, _fill_adam, _make_adam),
):
    register_optimizer(_codec)


# ---- the rest of the TPU catalogue (tf_embed_ops.optimizers) ----


def _catalogue_codec(cls: type) -> OptimizerCodec:
    def fill(opt: Any, params: OptimizationParameters) -> None:
        opt._set_optimization_parameters(params)

    def make(table: TableInfo, lr: Any) -> Any:
        kwargs = cls._kwargs_from_hyper_parameters(table.optimizer.hyperparameters)
        return cls(**kwargs, **common_kwargs(table, lr))

    return OptimizerCodec(cls._proto_field, cls, fill, make)


for _cls in CATALOGUE.values():
    register_optimizer(_catalogue_codec(_cls))
