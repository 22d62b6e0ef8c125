"""Errors of the config loader.

The C++ validator (cc/config) produces every validation message; these classes carry it unchanged.  They are
``ValueError`` subclasses (static misuse of a config) and, at the same time, the TensorFlow error the kernels raise
for the same config, so ``except tf.errors.InvalidArgumentError`` catches a bad config both at ``load()`` and in a
kernel.
"""

from __future__ import annotations

import tensorflow as tf


class ConfigError(ValueError):
    """A TPUEmbeddingConfiguration was rejected.  ``str(e)`` is the validator's message; ``e.code`` its status."""

    code = "INVALID_ARGUMENT"


class InvalidConfigError(ConfigError, tf.errors.InvalidArgumentError):
    """The config is malformed or contradictory (C++ InvalidArgument)."""

    def __init__(self, message: str):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)
        self.args = (message,)


class UnimplementedConfigError(ConfigError, tf.errors.UnimplementedError):
    """The config is valid, but uses a feature (e.g. an optimizer) tf_embed_ops does not run (C++ Unimplemented)."""

    code = "UNIMPLEMENTED"

    def __init__(self, message: str):
        tf.errors.UnimplementedError.__init__(self, None, None, message)
        self.args = (message,)
