"""TFRA's model mode: `de.enable_train_mode()` / `de.enable_inference_mode()` (process-wide, as in TFRA).

In train mode (the default) a lookup that Keras does not mark `training=False` is a training lookup: it gives new
keys their rows and its backward pass updates the table. In inference mode every lookup only reads (keys without a
row get zeros) and nothing is ever inserted or updated.
"""

from __future__ import annotations

__all__ = ["ModelMode", "enable_inference_mode", "enable_train_mode", "get_model_mode", "is_training"]


class ModelMode:
    """The two modes, by the strings TFRA uses."""

    TRAIN = "train"
    INFERENCE = "inference"
    CURRENT_SETTING = TRAIN


_mode = [ModelMode.TRAIN]


def enable_train_mode() -> None:
    """Lookups train (the default)."""
    _mode[0] = ModelMode.TRAIN


def enable_inference_mode() -> None:
    """Lookups only read: no key is inserted, no table is updated."""
    _mode[0] = ModelMode.INFERENCE


def get_model_mode() -> str:
    """`ModelMode.TRAIN` or `ModelMode.INFERENCE`."""
    return _mode[0]


def is_training(training: bool | None = None) -> bool:
    """Whether a lookup trains: train mode, and Keras did not say `training=False`."""
    return _mode[0] == ModelMode.TRAIN and training is not False
