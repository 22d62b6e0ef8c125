"""The TPU embedding optimizer catalogue beyond `tf.tpu.experimental.embedding`'s five.

TensorFlow's public API offers SGD, Adagrad, AdagradMomentum, Adam and FTRL; a `TPUEmbeddingConfiguration`
saved from a TPU job may name any optimizer of `optimization_parameters.proto`.  The classes here cover the
rest whose update rule is public (or, for BoundedAdagrad and the two Yogis, whose reading is documented in
`docs/optimizers.md`), with the same base arguments as TensorFlow's (clipping, weight decay, gradient
accumulation, slot creation function).  They subclass TensorFlow's optimizer base class, so they are accepted by
`tf.tpu.experimental.embedding.TableConfig` and create their slots the same way.

The five public optimizers are re-exported here, so one namespace has them all:

>>> import tf_embed_ops as te
>>> opt = te.optimizers.Momentum(learning_rate=0.1, momentum=0.9, use_nesterov=True)
>>> table = tf.tpu.experimental.embedding.TableConfig(vocabulary_size=100, dim=8, optimizer=opt)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2 as opt_pb2
from tensorflow.python.ops import init_ops_v2
from tensorflow.python.tpu import tpu_embedding_v2_utils

SGD = tf.tpu.experimental.embedding.SGD
Adagrad = tf.tpu.experimental.embedding.Adagrad
AdagradMomentum = tf.tpu.experimental.embedding.AdagradMomentum
Adam = tf.tpu.experimental.embedding.Adam
FTRL = tf.tpu.experimental.embedding.FTRL

__all__ = [
    "SGD", "Adagrad", "AdagradMomentum", "Adam", "FTRL",
    "Momentum", "RMSProp", "CenteredRMSProp", "Adadelta", "ProximalAdagrad", "Lion", "BoundedAdagrad",
    "OnlineYogi", "ProximalYogi", "FrequencyEstimator", "Assign",
    "set_common_optimization_parameters",
]

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


def _check(condition: bool, argument: str, requirement: str, value: Any) -> None:
    if not condition:
        raise ValueError(f"Argument `{argument}` must be {requirement}. Received: {value!r}")


def _constant(value: float) -> init_ops_v2.Initializer:
    return init_ops_v2.Constant(value, support_partition=True)


class _CatalogueOptimizer(tpu_embedding_v2_utils._Optimizer):
    """Common behaviour of this module's optimizers.

    Subclasses set `_proto_field` (the `parameters` oneof field), `_slots` (name -> attribute holding the
    initial value, in Load/Retrieve order) and `_hyper_parameters` (proto field -> attribute).
    """

    _proto_field: str = ""
    _slots: tuple[tuple[str, str], ...] = ()
    _hyper_parameters: tuple[tuple[str, str], ...] = ()
    _load_op: str | None = None  # tf.raw_ops name of the TPU Load op, where TensorFlow has one

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
        if not callable(learning_rate):
            _check(learning_rate >= 0, "learning_rate", "a non-negative float or a callable", learning_rate)
        if weight_decay_factor is not None:
            _check(weight_decay_factor >= 0, "weight_decay_factor", "non-negative", weight_decay_factor)

    def _slot_names(self) -> list[str]:
        return [name for name, _ in self._slots]

    def _slot_initializers(self) -> list[init_ops_v2.Initializer]:
        return [_constant(getattr(self, attr)) for _, attr in self._slots]

    def _set_optimization_parameters(self, parameters: opt_pb2.OptimizationParameters) -> None:
        set_common_optimization_parameters(self, parameters)
        message = getattr(parameters, self._proto_field)
        message.SetInParent()
        for field, attr in self._hyper_parameters:
            setattr(message, field, getattr(self, attr))

    @classmethod
    def _kwargs_from_hyper_parameters(cls, hyper_parameters: dict[str, Any]) -> dict[str, Any]:
        """Constructor arguments from the proto's hyper-parameter fields (the inverse of the fill)."""
        return {attr: hyper_parameters[field] for field, attr in cls._hyper_parameters}

    def _specific_arguments(self) -> dict[str, Any]:
        """This class's own constructor arguments (beyond the base ones), e.g. for Keras serialisation."""
        names = [attr for _, attr in self._hyper_parameters] + [attr for _, attr in self._slots]
        return {name: getattr(self, name) for name in names}

    def _load(self):
        if self._load_op is None:
            raise NotImplementedError(f"TensorFlow has no TPU Load op for {type(self).__name__}.")
        return getattr(tf.raw_ops, self._load_op)

    def _retrieve(self):
        if self._load_op is None:
            raise NotImplementedError(f"TensorFlow has no TPU Retrieve op for {type(self).__name__}.")
        return getattr(tf.raw_ops, self._load_op.replace("Load", "Retrieve", 1))


class Momentum(_CatalogueOptimizer):
    """Momentum (TensorFlow's `ApplyMomentum`): `m = momentum*m + g; w -= lr*m` (Nesterov: `lr*g + lr*momentum*m`).

    Args:
      learning_rate: float, or a zero-argument callable for a dynamic learning rate.
      momentum: the momentum decay, >= 0.
      use_nesterov: use the Nesterov form.
      **kwargs: the base arguments of `tf.tpu.experimental.embedding` optimizers.
    """

    _proto_field = "momentum"
    _slots = (("momenta", "initial_momentum_value"),)
    _hyper_parameters = (("momentum", "momentum"), ("use_nesterov", "use_nesterov"))
    _load_op = "LoadTPUEmbeddingMomentumParameters"

    def __init__(self, learning_rate: LearningRate = 0.01, momentum: float = 0.9, use_nesterov: bool = False,
                 initial_momentum_value: float = 0.0, **kwargs):
        super().__init__(learning_rate, **kwargs)
        _check(momentum >= 0, "momentum", "non-negative", momentum)
        self.momentum = momentum
        self.use_nesterov = use_nesterov
        self.initial_momentum_value = initial_momentum_value


class RMSProp(_CatalogueOptimizer):
    """RMSProp (TensorFlow's `ApplyRMSProp`): `ms += (g²-ms)(1-rho); mom = momentum*mom + lr*g/sqrt(ms+eps); w -= mom`.

    Args:
      learning_rate: float, or a zero-argument callable.
      rho: decay of the squared-gradient average, in [0, 1].
      momentum: momentum, >= 0.
      epsilon: added inside the square root, > 0.
      initial_ms_value: initial value of the `ms` slot (TPU default 1.0).
      **kwargs: the base arguments of `tf.tpu.experimental.embedding` optimizers.
    """

    _proto_field = "rms_prop"
    _slots = (("ms", "initial_ms_value"), ("mom", "initial_mom_value"))
    _hyper_parameters = (("rho", "rho"), ("momentum", "momentum"), ("epsilon", "epsilon"))
    _load_op = "LoadTPUEmbeddingRMSPropParameters"

    def __init__(self, learning_rate: LearningRate = 0.001, rho: float = 0.9, momentum: float = 0.0,
                 epsilon: float = 1e-7, initial_ms_value: float = 1.0, initial_mom_value: float = 0.0, **kwargs):
        super().__init__(learning_rate, **kwargs)
        _check(0 <= rho <= 1, "rho", "in [0, 1]", rho)
        _check(momentum >= 0, "momentum", "non-negative", momentum)
        _check(epsilon > 0, "epsilon", "positive", epsilon)
        self.rho, self.momentum, self.epsilon = rho, momentum, epsilon
        self.initial_ms_value, self.initial_mom_value = initial_ms_value, initial_mom_value


class CenteredRMSProp(RMSProp):
    """Centered RMSProp (TensorFlow's `ApplyCenteredRMSProp`): RMSProp with `mg += (g-mg)(1-rho)` and the
    denominator `sqrt(ms - mg² + eps)`.  Arguments as `RMSProp`, plus `initial_mg_value`."""

    _proto_field = "centered_rms_prop"
    _slots = (("ms", "initial_ms_value"), ("mom", "initial_mom_value"), ("mg", "initial_mg_value"))
    _load_op = "LoadTPUEmbeddingCenteredRMSPropParameters"

    def __init__(self, learning_rate: LearningRate = 0.001, rho: float = 0.9, momentum: float = 0.0,
                 epsilon: float = 1e-7, initial_ms_value: float = 1.0, initial_mom_value: float = 0.0,
                 initial_mg_value: float = 0.0, **kwargs):
        super().__init__(learning_rate, rho, momentum, epsilon, initial_ms_value, initial_mom_value, **kwargs)
        self.initial_mg_value = initial_mg_value


class Adadelta(_CatalogueOptimizer):
    """Adadelta (TensorFlow's `ApplyAdadelta`).

    Args:
      learning_rate: float, or a zero-argument callable.
      rho: decay rate, in [0, 1].
      epsilon: > 0.
      **kwargs: the base arguments of `tf.tpu.experimental.embedding` optimizers.
    """

    _proto_field = "adadelta"
    _slots = (("accumulators", "initial_accumulator_value"), ("updates", "initial_update_value"))
    _hyper_parameters = (("rho", "rho"), ("epsilon", "epsilon"))
    _load_op = "LoadTPUEmbeddingAdadeltaParameters"

    def __init__(self, learning_rate: LearningRate = 0.001, rho: float = 0.95, epsilon: float = 1e-7,
                 initial_accumulator_value: float = 0.0, initial_update_value: float = 0.0, **kwargs):
        super().__init__(learning_rate, **kwargs)
        _check(0 <= rho <= 1, "rho", "in [0, 1]", rho)
        _check(epsilon > 0, "epsilon", "positive", epsilon)
        self.rho, self.epsilon = rho, epsilon
        self.initial_accumulator_value, self.initial_update_value = initial_accumulator_value, initial_update_value


class ProximalAdagrad(_CatalogueOptimizer):
    """Proximal Adagrad (TensorFlow's `ApplyProximalAdagrad`), with l1/l2 regularisation.

    Args:
      learning_rate: float, or a zero-argument callable.
      l1_regularization_strength: >= 0.
      l2_regularization_strength: >= 0.
      initial_accumulator_value: > 0 (the update divides by its square root).
      **kwargs: the base arguments of `tf.tpu.experimental.embedding` optimizers.
    """

    _proto_field = "proximal_adagrad"
    _slots = (("accumulators", "initial_accumulator_value"),)
    _hyper_parameters = (("l1", "l1_regularization_strength"), ("l2", "l2_regularization_strength"))
    _load_op = "LoadTPUEmbeddingProximalAdagradParameters"

    def __init__(self, learning_rate: LearningRate = 0.001, l1_regularization_strength: float = 0.0,
                 l2_regularization_strength: float = 0.0, initial_accumulator_value: float = 0.1, **kwargs):
        super().__init__(learning_rate, **kwargs)
        _check(l1_regularization_strength >= 0, "l1_regularization_strength", "non-negative",
               l1_regularization_strength)
        _check(l2_regularization_strength >= 0, "l2_regularization_strength", "non-negative",
               l2_regularization_strength)
        _check(initial_accumulator_value > 0, "initial_accumulator_value", "positive", initial_accumulator_value)
        self.l1_regularization_strength = l1_regularization_strength
        self.l2_regularization_strength = l2_regularization_strength
        self.initial_accumulator_value = initial_accumulator_value


class Lion(_CatalogueOptimizer):
    """Lion: `c = b1*m + (1-b1)*g; w -= lr*sign(c); m = b2*m + (1-b2)*g`.

    Args:
      learning_rate: float, or a zero-argument callable.
      beta_1: in [0, 1).
      beta_2: in [0, 1).
      lazy_lion: update only touched rows (True) or every row every step (False, needs gradient accumulation).
      **kwargs: the base arguments of `tf.tpu.experimental.embedding` optimizers.
    """

    _proto_field = "lion"
    _slots = (("momenta", "initial_momentum_value"),)
    _hyper_parameters = (("beta1", "beta_1"), ("beta2", "beta_2"), ("use_non_lazy_lion", "use_non_lazy_lion"))

    def __init__(self, learning_rate: LearningRate = 0.0001, beta_1: float = 0.9, beta_2: float = 0.99,
                 lazy_lion: bool = True, initial_momentum_value: float = 0.0, **kwargs):
        super().__init__(learning_rate, **kwargs)
        _check(0 <= beta_1 < 1, "beta_1", "in [0, 1)", beta_1)
        _check(0 <= beta_2 < 1, "beta_2", "in [0, 1)", beta_2)
        if not lazy_lion and not self.use_gradient_accumulation:
            raise ValueError("Argument `lazy_lion=False` needs gradient accumulation: set "
                             "`use_gradient_accumulation=True` (non-lazy Lion updates every row with the summed "
                             "gradient).")
        self.beta_1, self.beta_2 = beta_1, beta_2
        self.lazy_lion = lazy_lion
        self.initial_momentum_value = initial_momentum_value

    @property
    def use_non_lazy_lion(self) -> bool:
        return not self.lazy_lion

    @classmethod
    def _kwargs_from_hyper_parameters(cls, hyper_parameters):
        return {"beta_1": hyper_parameters["beta1"], "beta_2": hyper_parameters["beta2"],
                "lazy_lion": not hyper_parameters["use_non_lazy_lion"]}

    def _specific_arguments(self):
        return {"beta_1": self.beta_1, "beta_2": self.beta_2, "lazy_lion": self.lazy_lion,
                "initial_momentum_value": self.initial_momentum_value}


class BoundedAdagrad(_CatalogueOptimizer):
    """Bounded Adagrad (our documented reading of the proto's parameters; see docs/optimizers.md).

    Args:
      learning_rate: float, or a zero-argument callable.
      update_accumulator_first: use the updated accumulator for the step size.
      max_var_update: > 0 caps |Δw| per element; 0 disables.
      max_accumulator: > 0 caps the accumulator; 0 disables.
      initial_accumulator_value: > 0.
      **kwargs: the base arguments of `tf.tpu.experimental.embedding` optimizers.
    """

    _proto_field = "bounded_adagrad"
    _slots = (("accumulators", "initial_accumulator_value"),)
    _hyper_parameters = (("update_accumulator_first", "update_accumulator_first"),
                         ("max_var_update", "max_var_update"), ("max_accumulator", "max_accumulator"))

    def __init__(self, learning_rate: LearningRate = 0.001, update_accumulator_first: bool = False,
                 max_var_update: float = 0.0, max_accumulator: float = 0.0, initial_accumulator_value: float = 0.1,
                 **kwargs):
        super().__init__(learning_rate, **kwargs)
        _check(max_var_update >= 0, "max_var_update", "non-negative (0 disables it)", max_var_update)
        _check(max_accumulator >= 0, "max_accumulator", "non-negative (0 disables it)", max_accumulator)
        _check(initial_accumulator_value > 0, "initial_accumulator_value", "positive", initial_accumulator_value)
        self.update_accumulator_first = update_accumulator_first
        self.max_var_update, self.max_accumulator = max_var_update, max_accumulator
        self.initial_accumulator_value = initial_accumulator_value


class OnlineYogi(_CatalogueOptimizer):
    """Online Yogi (our documented reading: FTRL-proximal with Yogi's second moment; see docs/optimizers.md).

    Args:
      learning_rate: float, or a zero-argument callable.  No bias correction: fold it into a dynamic rate.
      l1_regularization_strength: >= 0.
      l2_regularization_strength: >= 0.
      beta_2: in [0, 1).
      initial_v_value: initial value of the `vs` slot, > 0.
      **kwargs: the base arguments of `tf.tpu.experimental.embedding` optimizers.
    """

    _proto_field = "online_yogi"
    _slots = (("vs", "initial_v_value"), ("linears", "initial_linear_value"))
    _hyper_parameters = (("l1", "l1_regularization_strength"), ("l2", "l2_regularization_strength"),
                         ("beta2", "beta_2"))

    def __init__(self, learning_rate: LearningRate = 0.001, l1_regularization_strength: float = 0.0,
                 l2_regularization_strength: float = 0.0, beta_2: float = 0.999, initial_v_value: float = 0.1,
                 initial_linear_value: float = 0.0, **kwargs):
        super().__init__(learning_rate, **kwargs)
        _check(l1_regularization_strength >= 0, "l1_regularization_strength", "non-negative",
               l1_regularization_strength)
        _check(l2_regularization_strength >= 0, "l2_regularization_strength", "non-negative",
               l2_regularization_strength)
        _check(0 <= beta_2 < 1, "beta_2", "in [0, 1)", beta_2)
        _check(initial_v_value > 0, "initial_v_value", "positive", initial_v_value)
        self.l1_regularization_strength = l1_regularization_strength
        self.l2_regularization_strength = l2_regularization_strength
        self.beta_2 = beta_2
        self.initial_v_value, self.initial_linear_value = initial_v_value, initial_linear_value


class ProximalYogi(_CatalogueOptimizer):
    """Proximal Yogi (the public proximal Yogi rule, no bias correction; see docs/optimizers.md).

    Args:
      learning_rate: float, or a zero-argument callable.
      l1_regularization_strength: >= 0.
      l2_regularization_strength: >= 0.
      beta_1: in [0, 1).
      beta_2: in [0, 1).
      epsilon: > 0.
      initial_v_value: initial value of the `v` slot (TPU default 0.1).
      **kwargs: the base arguments of `tf.tpu.experimental.embedding` optimizers.
    """

    _proto_field = "proximal_yogi"
    _slots = (("v", "initial_v_value"), ("m", "initial_m_value"))
    _hyper_parameters = (("l1", "l1_regularization_strength"), ("l2", "l2_regularization_strength"),
                         ("beta1", "beta_1"), ("beta2", "beta_2"), ("epsilon", "epsilon"))
    _load_op = "LoadTPUEmbeddingProximalYogiParameters"

    def __init__(self, learning_rate: LearningRate = 0.001, l1_regularization_strength: float = 0.0,
                 l2_regularization_strength: float = 0.0, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-3, initial_v_value: float = 0.1, initial_m_value: float = 0.0, **kwargs):
        super().__init__(learning_rate, **kwargs)
        _check(l1_regularization_strength >= 0, "l1_regularization_strength", "non-negative",
               l1_regularization_strength)
        _check(l2_regularization_strength >= 0, "l2_regularization_strength", "non-negative",
               l2_regularization_strength)
        _check(0 <= beta_1 < 1, "beta_1", "in [0, 1)", beta_1)
        _check(0 <= beta_2 < 1, "beta_2", "in [0, 1)", beta_2)
        _check(epsilon > 0, "epsilon", "positive", epsilon)
        self.l1_regularization_strength = l1_regularization_strength
        self.l2_regularization_strength = l2_regularization_strength
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.initial_v_value, self.initial_m_value = initial_v_value, initial_m_value


class FrequencyEstimator(_CatalogueOptimizer):
    """Frequency estimator: the table row holds D, the average number of steps between hits of the row.

    The current global step arrives as the table's learning rate, which must therefore be a callable returning
    it (as TPUEstimator passed `float(global_step)`); the gradient is ignored.  Initialise the table to
    `max_delta` (e.g. `TableConfig(initializer=tf.constant_initializer(max_delta))`); dim 1 as on TPU.

    Args:
      learning_rate: a zero-argument callable returning the current global step.
      tau: in (0, 1).
      max_delta: > 0.
      outlier_threshold: >= 0.
      weight_exponent: the exponent of the `(delta / max_delta) ** weight_exponent` weight transform.
      **kwargs: the base arguments of `tf.tpu.experimental.embedding` optimizers.
    """

    _proto_field = "frequency_estimator"
    _slots = (("last_hit_step", "initial_last_hit_step"),)
    _hyper_parameters = (("tau", "tau"), ("max_delta", "max_delta"), ("outlier_threshold", "outlier_threshold"),
                         ("weight_exponent", "weight_exponent"))
    _load_op = "LoadTPUEmbeddingFrequencyEstimatorParameters"

    def __init__(self, learning_rate: LearningRate, tau: float = 0.01, max_delta: float = 1000.0,
                 outlier_threshold: float = 2.0, weight_exponent: float = 1.0, initial_last_hit_step: float = 0.0,
                 **kwargs):
        super().__init__(learning_rate, **kwargs)
        _check(0 < tau < 1, "tau", "in (0, 1)", tau)
        _check(max_delta > 0, "max_delta", "positive", max_delta)
        _check(outlier_threshold >= 0, "outlier_threshold", "non-negative", outlier_threshold)
        self.tau, self.max_delta = tau, max_delta
        self.outlier_threshold, self.weight_exponent = outlier_threshold, weight_exponent
        self.initial_last_hit_step = initial_last_hit_step


class Assign(_CatalogueOptimizer):
    """Assign: `w = g` (the row's summed gradient).  Needs gradient accumulation; the learning rate is unused."""

    _proto_field = "assign"

    def __init__(self, learning_rate: LearningRate = 1.0, **kwargs):
        super().__init__(learning_rate, **kwargs)
        if not self.use_gradient_accumulation:
            raise ValueError("Assign needs gradient accumulation (`use_gradient_accumulation=True`): without it the "
                             "assigned value would depend on which contribution of a row came last.")


# Proto oneof field -> class; tf_embed_ops.config registers each one for from/to_feature_config.
CATALOGUE: dict[str, type[_CatalogueOptimizer]] = {
    cls._proto_field: cls
    for cls in (Momentum, RMSProp, CenteredRMSProp, Adadelta, ProximalAdagrad, Lion, BoundedAdagrad, OnlineYogi,
                ProximalYogi, FrequencyEstimator, Assign)
}
