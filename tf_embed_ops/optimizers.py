"""The TPU embedding optimizer catalogue beyond `tf.tpu.experimental.embedding`'s five.

TensorFlow's public API offers SGD, Adagrad, AdagradMomentum, Adam and FTRL; a `TPUEmbeddingConfiguration`
saved from a TPU job may name any optimizer of `optimization_parameters.proto`.  The classes here cover the
rest whose update rule is public (or, for BoundedAdagrad and the two Yogis, whose reading is documented in
`docs/optimizers.md`), with the same base arguments as TensorFlow's (clipping, weight decay, gradient
accumulation, slot creation function).  They subclass TensorFlow's optimizer base class, so they are accepted by
`tf.tpu.experimental.embedding.TableConfig` and create their slots the same way.

Each class is generated from its entry in the optimizer schema (cc/lib/optimizers/schema.h, read through the
config module): its signature, defaults, argument checks (the ranges the C++ config validator enforces, on the
float32 values the proto will hold) and docstring.  See CONTRIBUTING.md, "Adding an optimizer".

The five public optimizers are re-exported here, so one namespace has them all:

>>> import tf_embed_ops as te
>>> opt = te.optimizers.Momentum(learning_rate=0.1, momentum=0.9, use_nesterov=True)
>>> table = tf.tpu.experimental.embedding.TableConfig(vocabulary_size=100, dim=8, optimizer=opt)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_embed_ops import _optimizer_schema, _tf_compat
from tf_embed_ops._tf_compat import init_ops_v2
from tf_embed_ops._tf_compat import optimization_parameters_pb2 as opt_pb2

SGD = tf.tpu.experimental.embedding.SGD
Adagrad = tf.tpu.experimental.embedding.Adagrad
AdagradMomentum = tf.tpu.experimental.embedding.AdagradMomentum
Adam = tf.tpu.experimental.embedding.Adam
FTRL = tf.tpu.experimental.embedding.FTRL

# The catalogue classes (Momentum, RMSProp, CenteredRMSProp, Adadelta, ProximalAdagrad, Lion, BoundedAdagrad,
# OnlineYogi, ProximalYogi, FrequencyEstimator, Assign, and FBGEMM's RowWiseAdagrad, which the TPU proto lacks)
# are generated from the optimizer schema at the end.
__all__ = ["SGD", "Adagrad", "AdagradMomentum", "Adam", "FTRL", "set_common_optimization_parameters"]

LearningRate = float | Callable[[], float]


def set_common_optimization_parameters(optimizer: Any, parameters: opt_pb2.OptimizationParameters) -> None:
    """Fills the fields every optimizer shares, as TensorFlow's `_Optimizer._set_optimization_parameters` does.

    TensorFlow's own version assigns a Python bool to the `low_dimensional_packing_status` enum field, which
    protobuf 7 rejects; this one writes the enum value.

    Args:
      optimizer: a `tf.tpu.experimental.embedding` optimizer or one of this module's.
      parameters: the table's OptimizationParameters message, filled in place.
    """
    status = opt_pb2.GradientAccumulationStatus
    parameters.gradient_accumulation_status = status.ENABLED if optimizer.use_gradient_accumulation else status.DISABLED
    if optimizer.clip_weight_min is not None:
        parameters.clipping_limits.lower.value = optimizer.clip_weight_min
    if optimizer.clip_weight_max is not None:
        parameters.clipping_limits.upper.value = optimizer.clip_weight_max
    if optimizer.clip_gradient_min is not None:
        parameters.gradient_clipping_limits.lower.value = optimizer.clip_gradient_min
    if optimizer.clip_gradient_max is not None:
        parameters.gradient_clipping_limits.upper.value = optimizer.clip_gradient_max
    if optimizer.weight_decay_factor:
        parameters.weight_decay_factor = optimizer.weight_decay_factor
        if optimizer.multiply_weight_decay_factor_by_learning_rate:
            parameters.multiply_weight_decay_factor_by_learning_rate = True
    # TensorFlow writes the raw bool (False -> UNSPECIFIED, True -> ENABLED); an enum value given by the user
    # (e.g. DISABLED, as a proto read back carries it) is kept as is.
    parameters.low_dimensional_packing_status = int(optimizer.low_dimensional_packing_status)


def _constant(value: float) -> init_ops_v2.Initializer:
    return init_ops_v2.Constant(value, support_partition=True)


class _CatalogueOptimizer(_tf_compat.OptimizerBase):
    """Common behaviour of this module's optimizers, driven by the class's `_schema` (its optimizer schema entry).

    The hyper-parameters and slot initial values are attributes named as the constructor arguments.
    """

    _schema: _optimizer_schema.OptimizerSchema

    def __init__(
        self,
        learning_rate: LearningRate,
        use_gradient_accumulation: bool = True,
        clip_weight_min: float | None = None,
        clip_weight_max: float | None = None,
        weight_decay_factor: float | None = None,
        multiply_weight_decay_factor_by_learning_rate: bool | None = None,
        slot_variable_creation_fn: Callable | None = None,
        clipvalue: float | tuple[float | None, float | None] | None = None,
        low_dimensional_packing_status: bool = False,
    ):
        super().__init__(
            learning_rate,
            use_gradient_accumulation,
            clip_weight_min,
            clip_weight_max,
            weight_decay_factor,
            multiply_weight_decay_factor_by_learning_rate,
            clipvalue,
            slot_variable_creation_fn,
            low_dimensional_packing_status,
        )
        if not callable(learning_rate) and not learning_rate >= 0:
            raise ValueError(
                f"Argument `learning_rate` must be a non-negative float or a callable. Received: {learning_rate!r}"
            )
        if weight_decay_factor is not None and not weight_decay_factor >= 0:
            raise ValueError(f"Argument `weight_decay_factor` must be non-negative. Received: {weight_decay_factor!r}")

    def _slot_names(self) -> list[str]:
        return [s.name for s in self._schema.slots]

    def _slot_initializers(self) -> list[init_ops_v2.Initializer]:
        return [
            _constant(s.default_initial_value if s.python_name is None else getattr(self, s.python_name))
            for s in self._schema.slots
        ]

    def _set_optimization_parameters(self, parameters: opt_pb2.OptimizationParameters) -> None:
        # TensorFlow's TPUEmbedding calls this to build the config a TPU runs (tf_embed_ops fills its own configs
        # through tf_embed_ops.config), so an optimizer the TPU proto lacks stops here.
        if not self._schema.in_tpu_proto:
            raise ValueError(
                f"{type(self).__name__} is not a TPU optimizer: TensorFlow's TPUEmbeddingConfiguration has no field "
                f"for it, so TensorFlow's TPUEmbedding cannot run it. Use it with tf_embed_ops' TPUEmbedding, "
                "keras.TPUEmbedding or distribute front ends, which run it on CPU."
            )
        set_common_optimization_parameters(self, parameters)
        self._schema.fill(parameters, self.specific_arguments())

    @classmethod
    def _kwargs_from_hyper_parameters(cls, hyper_parameters: dict[str, Any]) -> dict[str, Any]:
        """Constructor arguments from the proto's hyper-parameter fields (the inverse of the fill)."""
        return cls._schema.python_values(hyper_parameters)

    def specific_arguments(self) -> dict[str, Any]:
        """This class's own constructor arguments (beyond the base ones), e.g. for Keras serialisation."""
        names = [h.python_name for h in self._schema.hyper_parameters]
        names += [s.python_name for s in self._schema.slots if s.python_name is not None]
        return {name: getattr(self, name) for name in names}

    def _load(self):
        if not self._schema.load_op:
            raise NotImplementedError(f"TensorFlow has no TPU Load op for {type(self).__name__}.")
        return getattr(tf.raw_ops, self._schema.load_op)

    def _retrieve(self):
        if not self._schema.load_op:
            raise NotImplementedError(f"TensorFlow has no TPU Retrieve op for {type(self).__name__}.")
        return getattr(tf.raw_ops, self._schema.load_op.replace("Load", "Retrieve", 1))


_BASE_ARGUMENTS_DOC = "the base arguments of `tf.tpu.experimental.embedding` optimizers."


def _signature(schema: _optimizer_schema.OptimizerSchema) -> inspect.Signature:
    """learning_rate, the hyper-parameters in proto field order, the slot initial values, then **kwargs."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    lr_default = inspect.Parameter.empty if schema.default_learning_rate is None else schema.default_learning_rate
    params = [inspect.Parameter("self", kind), inspect.Parameter("learning_rate", kind, default=lr_default)]
    params += [inspect.Parameter(h.python_name, kind, default=h.python_default) for h in schema.hyper_parameters]
    params += [
        inspect.Parameter(s.python_name, kind, default=s.default_initial_value)
        for s in schema.slots
        if s.python_name is not None
    ]
    params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


def _docstring(schema: _optimizer_schema.OptimizerSchema) -> str:
    args = [f"  learning_rate: {schema.learning_rate_doc}"]
    for h in schema.hyper_parameters:
        allowed = f" Must be {h.range.text}." if h.type == "float" else ""
        args.append(f"  {h.python_name}: {h.doc}{allowed} Default {h.python_default!r}.")
    for s in schema.slots:
        if s.python_name is not None:
            allowed = f" Must be {s.range.text}." if s.range.lower is not None or s.range.upper is not None else ""
            args.append(
                f"  {s.python_name}: initial value of the `{s.name}` slot.{allowed} "
                f"Default {s.default_initial_value!r}."
            )
    args.append(f"  **kwargs: {_BASE_ARGUMENTS_DOC}")
    raises = ["Raises:", "  ValueError: an argument is outside its range."]
    if schema.needs_dynamic_learning_rate:
        raises.append("    Or `learning_rate` is not a callable.")
    if schema.accumulation.always or schema.accumulation.when_set:
        raises.append(f"    Or `use_gradient_accumulation=False` although {schema.accumulation.reason}.")
    return "\n".join([schema.summary, "", "Args:", *args, "", *raises, ""])


def _catalogue_class(schema: _optimizer_schema.OptimizerSchema) -> type:
    """The optimizer class of a catalogue schema entry: its signature, argument checks and docstring."""
    signature = _signature(schema)

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        del arguments["self"]
        base = arguments.pop("kwargs")
        learning_rate = arguments.pop("learning_rate")
        _CatalogueOptimizer.__init__(self, learning_rate, **base)
        schema.check(arguments, learning_rate=learning_rate, use_gradient_accumulation=self.use_gradient_accumulation)
        for name, value in arguments.items():
            setattr(self, name, value)

    __init__.__signature__ = signature
    namespace = {
        "__init__": __init__,
        "__doc__": _docstring(schema),
        "_schema": schema,
        "__module__": __name__,
        "__qualname__": schema.python_class,
    }
    return type(schema.python_class, (_CatalogueOptimizer,), namespace)


# Proto oneof field -> class, for every catalogue entry of the schema; tf_embed_ops.config registers each one.
CATALOGUE: dict[str, type[_CatalogueOptimizer]] = {
    s.kind: _catalogue_class(s) for s in _optimizer_schema.schemas() if s.origin == "catalogue"
}
globals().update({cls.__name__: cls for cls in CATALOGUE.values()})
__all__ += [cls.__name__ for cls in CATALOGUE.values()]
