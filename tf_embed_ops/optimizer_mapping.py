"""Keras optimizers (and their string names) as table optimizers, mapped as keras-rs maps them for SparseCore.

`keras.optimizers.SGD / Adagrad / Adam / Ftrl` objects and the strings `"sgd" / "adagrad" / "adam" / "ftrl"`
become the `tf.tpu.experimental.embedding` optimizer of the same family before any table configuration is built,
so everything downstream sees only the public TPU optimizer classes. Options with no TPU meaning raise
`ValueError` naming the table and the option. docs/keras.md has the mapping as a table.

A learning-rate schedule (or callable) becomes a `KerasLearningRate`: evaluated once per table update, on the
Keras optimizer's own `iterations`, which it then advances by one (nothing else steps a table optimizer).

Example:
    >>> to_table_optimizer(keras.optimizers.Adam(0.01, clipvalue=1.0), "user")
    <tf.tpu.experimental.embedding.Adam ...>   # learning_rate=0.01, clipvalue=(-1.0, 1.0)
"""

from __future__ import annotations

import weakref
from typing import Any

import keras
import tensorflow as tf

from tf_embed_ops import _tf_compat

__all__ = ["KerasLearningRate", "STRING_OPTIMIZERS", "to_table_optimizer"]

_emb = tf.tpu.experimental.embedding

# The families and the strings that name them: keras class -> (TPU class, copied arguments, {option: its
# default}); an option away from its default has no TPU meaning and is rejected.
_MAPPINGS = (
    (keras.optimizers.Adagrad, _emb.Adagrad, ("initial_accumulator_value",), {"epsilon": 1e-7}),
    (keras.optimizers.Adam, _emb.Adam, ("beta_1", "beta_2", "epsilon"), {"amsgrad": False}),
    (
        keras.optimizers.Ftrl,
        _emb.FTRL,
        (
            "learning_rate_power",
            "initial_accumulator_value",
            "l1_regularization_strength",
            "l2_regularization_strength",
            "beta",
        ),
        {"l2_shrinkage_regularization_strength": 0.0},
    ),
    (keras.optimizers.SGD, _emb.SGD, (), {"momentum": 0.0, "nesterov": False}),
)
STRING_OPTIMIZERS = {"sgd": _emb.SGD, "adagrad": _emb.Adagrad, "adam": _emb.Adam, "ftrl": _emb.FTRL}
# Optimizer-wide Keras options with no TPU meaning, and the value that means "off".
_UNSUPPORTED_COMMON = {"clipnorm": None, "global_clipnorm": None, "use_ema": False, "loss_scale_factor": None}

# One KerasLearningRate per Keras optimizer: tables (or the global default) sharing an optimizer share one
# dynamic learning-rate tag, so its iterations advance once per step, not once per table.
_LEARNING_RATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@keras.saving.register_keras_serializable(package="tf_embed_ops")
class KerasLearningRate:
    """A zero-argument learning rate read from a Keras optimizer: the schedule at `iterations`, then a step.

    Serialisable (the Keras optimizer's config, schedule included), so layers using it survive `model.save`.
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer):
        self.optimizer = optimizer

    def __call__(self) -> tf.Tensor:
        # Keras' own property: the schedule at the current iterations (or the callable's value).
        rate = tf.cast(tf.convert_to_tensor(self.optimizer.learning_rate), tf.float32)
        with tf.control_dependencies([rate]):
            self.optimizer.iterations.assign_add(1)
        return tf.identity(rate)

    def get_config(self) -> dict:
        return {"optimizer": keras.saving.serialize_keras_object(self.optimizer)}

    @classmethod
    def from_config(cls, config: dict) -> KerasLearningRate:
        return cls(keras.saving.deserialize_keras_object(config["optimizer"]))


def _learning_rate(optimizer: keras.optimizers.Optimizer, table: str) -> Any:
    rate = _tf_compat.keras_learning_rate_as_given(optimizer)
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) or callable(rate):
        if optimizer not in _LEARNING_RATES:
            _LEARNING_RATES[optimizer] = KerasLearningRate(optimizer)
        return _LEARNING_RATES[optimizer]
    value = optimizer.get_config()["learning_rate"]
    if not isinstance(value, float):
        raise ValueError(f"Table {table!r}: unsupported learning_rate {value!r} of type {type(value).__name__}.")
    return value


def _from_keras(optimizer: keras.optimizers.Optimizer, table: str) -> Any:
    mapping = next((m for m in _MAPPINGS if isinstance(optimizer, m[0])), None)
    if mapping is None:
        raise ValueError(
            f"Table {table!r}: unsupported optimizer {type(optimizer).__name__}: no TPU equivalent; use "
            "keras.optimizers.SGD, Adagrad, Adam or Ftrl (or a tf.tpu.experimental.embedding optimizer)."
        )
    keras_class, tpu_class, copied, unsupported = mapping
    for option, off in {**_UNSUPPORTED_COMMON, **unsupported}.items():
        value = getattr(optimizer, option)
        if value != off:
            raise ValueError(
                f"Table {table!r}: option {keras_class.__name__}.{option}={value!r} has no TPU equivalent "
                f"(only {off!r} is supported)."
            )
    kwargs = {name: getattr(optimizer, name) for name in copied}
    kwargs["learning_rate"] = _learning_rate(optimizer, table)
    if optimizer.weight_decay is not None:
        kwargs["weight_decay_factor"] = optimizer.weight_decay
    if optimizer.clipvalue is not None:
        kwargs["clipvalue"] = optimizer.clipvalue
    if optimizer.gradient_accumulation_steps is not None:
        kwargs["use_gradient_accumulation"] = True
    try:
        return tpu_class(**kwargs)
    except ValueError as e:
        raise ValueError(f"Table {table!r}: {keras_class.__name__} -> {tpu_class.__name__}: {e}") from e


def to_table_optimizer(optimizer: Any, table: Any) -> Any:
    """The TPU optimizer for a Keras optimizer or its string name; anything else is returned unchanged.

    Args:
      optimizer: a `keras.optimizers.Optimizer`, one of `STRING_OPTIMIZERS`' names, or anything else (a TPU
        optimizer or None pass through; the caller checks them).
      table: the table's name (or index), for error messages.

    Raises:
      ValueError: an unknown string, a Keras optimizer without a TPU family, or an option with no TPU meaning.
    """
    if isinstance(optimizer, str):
        if optimizer not in STRING_OPTIMIZERS:
            raise ValueError(
                f"Table {table!r}: unknown optimizer name {optimizer!r}; use one of {sorted(STRING_OPTIMIZERS)}."
            )
        return STRING_OPTIMIZERS[optimizer]()
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return _from_keras(optimizer, table)
    return optimizer
