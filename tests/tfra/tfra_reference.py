"""A numpy model of what TFRA 0.8.1 does with a Keras optimizer, written from Keras 3's update formulas.

TFRA gathers the rows a batch touches (duplicate ids' gradients summed), applies the Keras optimizer to them and
writes them back: rows outside the batch, and their slots, do not change. One measured difference from Keras: a
row's Adagrad accumulator starts at 0, not at `initial_accumulator_value` (test_tfra_side_by_side.py checks this
model against TFRA 0.8.1 itself). `apply(kind, rows, slots, grads, t)`
is that step for the rows of the batch; `t` is the optimizer's `iterations` before the step.
"""

from __future__ import annotations

import numpy as np

LR = 0.05
ADAGRAD_INIT = 0.1
EPSILON = 1e-7
BETA_1, BETA_2 = 0.9, 0.999


def slot_count(kind: str) -> int:
    return {"sgd": 0, "adagrad": 1, "adam": 2}[kind]


def initial_slots(kind: str, n: int, dim: int) -> list[np.ndarray]:
    if kind == "adagrad":
        return [np.zeros([n, dim], np.float64)]  # TFRA's, whatever initial_accumulator_value says
    return [np.zeros([n, dim], np.float64) for _ in range(slot_count(kind))]


def apply(kind: str, w: np.ndarray, slots: list[np.ndarray], g: np.ndarray, t: int) -> None:
    """In place: keras.optimizers.SGD / Adagrad / Adam (learning rate LR, Keras defaults) on rows `w`."""
    if kind == "sgd":
        w -= LR * g
    elif kind == "adagrad":
        slots[0] += g * g
        w -= LR * g / np.sqrt(slots[0] + EPSILON)
    elif kind == "adam":
        m, v = slots
        step = t + 1
        alpha = LR * np.sqrt(1 - BETA_2**step) / (1 - BETA_1**step)
        m += (g - m) * (1 - BETA_1)
        v += (g * g - v) * (1 - BETA_2)
        w -= alpha * m / (np.sqrt(v) + EPSILON)
    else:
        raise ValueError(kind)


def keras_optimizer(kind: str, keras):
    """The Keras optimizer `apply` models (from the `keras` module given: Keras 3 or tf_keras)."""
    if kind == "sgd":
        return keras.optimizers.SGD(LR)
    if kind == "adagrad":
        return keras.optimizers.Adagrad(LR, initial_accumulator_value=ADAGRAD_INIT, epsilon=EPSILON)
    return keras.optimizers.Adam(LR, beta_1=BETA_1, beta_2=BETA_2, epsilon=EPSILON)
