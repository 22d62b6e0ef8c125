"""Optimizer classes <-> OptimizationParameters, one registration per class.

``from_feature_config`` finds the codec of an optimizer object by its class (walking the MRO, so subclasses
work); ``to_feature_config`` finds the codec of a table by its proto algorithm ``kind`` and builds an object of
the first class registered for it.  Every optimizer of the optimizer schema is registered here, from its schema
entry: TensorFlow's five ``tf.tpu.experimental.embedding`` classes and the ``tf_embed_ops.optimizers`` catalogue.
Another optimizer class is one :func:`register_optimizer` call.

The fill writes field for field what TensorFlow's ``_Optimizer._set_optimization_parameters`` writes, except that
``low_dimensional_packing_status`` is assigned as an int: TensorFlow assigns the Python bool, which protobuf 7
rejects (docs/semantics.md, "Python behaviour we do not copy").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_embed_ops import _optimizer_schema
from tf_embed_ops._tf_compat import optimization_parameters_pb2
from tf_embed_ops.config._view import TableInfo
from tf_embed_ops.optimizers import CATALOGUE, set_common_optimization_parameters

OptimizationParameters = optimization_parameters_pb2.OptimizationParameters
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
      check: ``check(optimizer, where)`` raises ValueError (messages prefixed with ``where``) for a value the
        config validator would refuse; None: no check before the fill.
    """

    kind: str
    optimizer_class: type
    fill: Callable[[Any, OptimizationParameters], None]
    make: Callable[[TableInfo, Any], Any] | None = None
    check: Callable[[Any, str], None] | None = None


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


def schema_for_optimizer(optimizer: Any) -> _optimizer_schema.OptimizerSchema | None:
    """The schema entry of an optimizer object (None: its class is not registered, or its kind has no entry)."""
    codec = codec_for_optimizer(optimizer)
    if codec is None:
        return None
    try:
        return _optimizer_schema.schema_for_kind(codec.kind)
    except KeyError:
        return None


def slot_shapes(optimizer: Any, vocabulary_size: int, dim: int) -> dict[str, tuple[int, int]]:
    """``{slot name: variable shape}`` of ``optimizer``'s slots in a ``[vocabulary_size, dim]`` table: the table's
    shape, or ``(vocabulary_size, 1)`` for a per-row slot (the schema's, the one source of slot shapes)."""
    schema = schema_for_optimizer(optimizer)
    if schema is None:
        return {}
    return {s.name: s.shape(vocabulary_size, dim) for s in schema.slots}


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


def _python_arguments(schema: _optimizer_schema.OptimizerSchema, optimizer: Any) -> dict[str, Any]:
    """The optimizer object's schema arguments, read from its attributes (named as the constructor arguments)."""
    names = [h.python_name for h in schema.hyper_parameters]
    names += [s.python_name for s in schema.slots if s.python_name is not None]
    return {name: getattr(optimizer, name) for name in names}


def schema_codec(schema: _optimizer_schema.OptimizerSchema, cls: type) -> OptimizerCodec:
    """The codec of ``cls``, an optimizer class whose attributes are named as ``schema``'s Python arguments."""

    def fill(opt: Any, params: OptimizationParameters) -> None:
        fill_common(opt, params)
        schema.fill(params, _python_arguments(schema, opt))

    def make(table: TableInfo, lr: Any) -> Any:
        # Slot initial values are not in the proto (a checkpoint carries them): the schema's defaults stand in.
        slots = {s.python_name: s.default_initial_value for s in schema.slots if s.python_name is not None}
        return cls(**schema.python_values(table.optimizer.hyperparameters), **slots, **common_kwargs(table, lr))

    def check(opt: Any, where: str) -> None:
        schema.check(
            _python_arguments(schema, opt),
            learning_rate=opt.learning_rate,
            use_gradient_accumulation=opt.use_gradient_accumulation,
            where=where,
        )

    return OptimizerCodec(schema.kind, cls, fill, make, check)


_emb = tf.tpu.experimental.embedding
for _schema in _optimizer_schema.schemas():
    _cls = getattr(_emb, _schema.python_class) if _schema.origin == "tensorflow" else CATALOGUE[_schema.kind]
    register_optimizer(schema_codec(_schema, _cls))
