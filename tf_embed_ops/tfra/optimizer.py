"""`de.DynamicEmbeddingOptimizer(keras_optimizer)`: which optimizer trains the dynamic tables, and how.

TFRA wraps a Keras optimizer so that it also updates the looked-up rows and writes them back. Here the rows are
updated in place by the table's fused optimizer (`TfEmbed>DynamicSendTPUEmbeddingGradients`), the same family as
the Keras optimizer with its hyper-parameters (`optimizer_mapping.to_table_optimizer`: SGD, Adagrad, Adam, Ftrl;
Keras 3 optimizers), and a learning rate read from the Keras optimizer at every step:

- its learning rate (schedule included) at its `iterations`, as Keras computes it;
- Adagrad: as TFRA 0.8.1 trains with it, a new row's accumulator starting at 0 whatever
  `initial_accumulator_value` says (measured against TFRA; tests/tfra/test_tfra_side_by_side.py), with Keras'
  `epsilon` under the square root: the fused Adagrad starts the accumulator at `epsilon` instead;
- Adam: with Keras' bias correction, `lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)` with `t = iterations + 1`, and
  Keras' `m / (sqrt(v) + epsilon)` (not the TPU default `m / sqrt(v + epsilon^2)`); rows not in the batch keep
  their moments, as TFRA's (which gathers only the batch's rows) do.

The function returns the same optimizer object, as TFRA's does; the model's other weights are still its job. A
table's slots are laid out for its optimizer, so a dynamic table follows the most recently wrapped optimizer until
its first training step, then keeps it (`Variable.bind`). `apply` is checked: a step that hands an optimizer the
trigger of a table bound to another one raises (the table would have been updated by the other one).
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import keras
import tensorflow as tf

from tf_embed_ops import optimizer_mapping

__all__ = ["DynamicEmbeddingOptimizer", "current_optimizer", "table_optimizer", "trigger_owner"]

_latest: list[Any] = [None]  # weakref.ref of the most recently wrapped Keras optimizer
_unbound: weakref.WeakSet = weakref.WeakSet()  # de.Variables that have not trained yet (they follow _latest)
_triggers: dict[int, tuple[weakref.ref, weakref.ref]] = {}  # id(trigger variable) -> (trigger, de.Variable)
_checked: weakref.WeakSet = weakref.WeakSet()  # Keras optimizers whose `apply` checks the triggers


def current_optimizer() -> Any:
    """The most recently wrapped Keras optimizer still alive, or None."""
    ref = _latest[0]
    return ref() if ref is not None else None


def follow_latest(variable: Any) -> None:
    """Registers a de.Variable that has not trained: it takes every optimizer wrapped from now until it trains."""
    _unbound.add(variable)
    opt = current_optimizer()
    if opt is not None and _in_this_program(variable):
        variable.bind(opt)


def stop_following(variable: Any) -> None:
    _unbound.discard(variable)


def register_trigger(trigger: Any, variable: Any) -> None:
    """Marks `trigger` (a variable whose gradient runs `variable`'s update) as belonging to `variable`."""
    for key in [k for k, (t, _) in _triggers.items() if t() is None]:
        del _triggers[key]  # triggers gone with their layers (an id may be reused)
    _triggers[id(trigger)] = (weakref.ref(trigger), weakref.ref(variable))


def trigger_owner(candidate: Any) -> Any:
    """The de.Variable whose trigger `candidate` is, or None."""
    entry = _triggers.get(id(candidate))
    if entry is None or entry[0]() is not candidate:
        return None
    return entry[1]()


def _rate(keras_opt: keras.optimizers.Optimizer, bias_corrected: bool):
    def rate() -> tf.Tensor:
        lr = tf.cast(tf.convert_to_tensor(keras_opt.learning_rate), tf.float32)
        if not bias_corrected:
            return lr
        t = tf.cast(keras_opt.iterations + 1, tf.float32)
        beta_1 = tf.cast(keras_opt.beta_1, tf.float32)
        beta_2 = tf.cast(keras_opt.beta_2, tf.float32)
        return lr * tf.sqrt(1.0 - tf.pow(beta_2, t)) / (1.0 - tf.pow(beta_1, t))

    return rate


def table_optimizer(keras_opt: keras.optimizers.Optimizer, table: str) -> Any:
    """The fused table optimizer that trains a dynamic table as `keras_opt` would (see the module docstring).

    Raises:
      ValueError: an optimizer or an option without a table equivalent, naming the table.
    """
    tpu = copy.copy(optimizer_mapping.to_table_optimizer(keras_opt, table))
    is_adam = isinstance(keras_opt, keras.optimizers.Adam)
    tpu.learning_rate = _rate(keras_opt, bias_corrected=is_adam)
    if is_adam:
        tpu.sum_inside_sqrt = False  # Keras: m / (sqrt(v) + epsilon)
        tpu.lazy_adam = True
    if isinstance(keras_opt, keras.optimizers.Adagrad):
        # TFRA 0.8.1 starts a row's accumulator at 0 (not at initial_accumulator_value) and divides by
        # sqrt(acc + epsilon); the fused Adagrad divides by sqrt(acc): starting it at epsilon is the same update.
        tpu.initial_accumulator_value = float(keras_opt.epsilon)
    return tpu


def _check_wrappable(optimizer: Any) -> None:
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise ValueError(
            f"de.DynamicEmbeddingOptimizer: {type(optimizer).__name__} is a TensorFlow 1 (tf.compat.v1.train) "
            "optimizer; wrap a Keras optimizer instead (keras.optimizers.SGD, Adagrad, Adam or Ftrl)."
        )
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            f"de.DynamicEmbeddingOptimizer: expected a Keras optimizer (keras.optimizers.SGD, Adagrad, Adam or "
            f"Ftrl); got {optimizer!r}."
        )
    # Every option the table optimizer would refuse, now, rather than at the first step.
    optimizer_mapping.to_table_optimizer(optimizer, "(any table of de.DynamicEmbeddingOptimizer)")


def _checked_apply(optimizer: keras.optimizers.Optimizer, original: Any):
    def apply(grads: Any, trainable_variables: Any = None) -> Any:
        for variable in trainable_variables or ():
            owner = trigger_owner(variable)
            bound = None if owner is None else owner.optimizer
            if owner is not None and bound is not optimizer:
                raise ValueError(
                    f"de.Variable {owner.name!r} is trained by another optimizer ({bound!r}), not by "
                    f"{optimizer!r}: a table follows the most recently wrapped optimizer until its first step. "
                    "Wrap each model's optimizer (de.DynamicEmbeddingOptimizer) before training that model."
                )
        return original(grads, trainable_variables)

    return apply


def DynamicEmbeddingOptimizer(self: Any, bp_v2: Any = None, synchronous: bool = False, **kwargs: Any) -> Any:
    """Makes `self` (a Keras optimizer) the optimizer of the dynamic tables; returns it.

    Args:
      self: a Keras 3 optimizer: `keras.optimizers.SGD` (without momentum), `Adagrad`, `Adam` (without amsgrad) or
        `Ftrl`.
      bp_v2: TFRA's incremental write-back; accepted and ignored (rows are updated in place).
      synchronous: TFRA's Horovod mode; True is refused.
      **kwargs: TFRA's other options; refused (no equivalent).

    Raises:
      ValueError: a TensorFlow 1 optimizer, a non-Keras object, an optimizer or option with no table equivalent
        (`amsgrad`, `momentum`, `clipnorm`, ...), `synchronous=True` or an unknown option.
    """
    if synchronous:
        raise ValueError(
            "de.DynamicEmbeddingOptimizer: synchronous=True (Horovod) is not supported; shard the tables with "
            "te.distribute."
        )
    if kwargs:
        raise ValueError(f"de.DynamicEmbeddingOptimizer: unsupported options {sorted(kwargs)}.")
    _check_wrappable(self)
    if self not in _checked:
        self.apply = _checked_apply(self, self.apply)  # an instance attribute: called as self.apply(grads, vars)
        _checked.add(self)
    _latest[0] = weakref.ref(self)
    for variable in list(_unbound):
        if _in_this_program(variable):
            variable.bind(self)
    return self


def _in_this_program(variable: Any) -> bool:
    """Whether `variable`'s table belongs to the program running now: eager tables in eager code, a TensorFlow 1
    graph's tables in that graph (a table of another graph cannot be re-laid out here, nor trained)."""
    handle = variable.table.resource_handle
    with tf.init_scope():
        if tf.executing_eagerly():
            return not tf.is_symbolic_tensor(handle)
        return getattr(handle, "graph", None) is tf.compat.v1.get_default_graph()
