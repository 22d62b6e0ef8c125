"""tf_embed_ops.config: the TPUEmbeddingConfiguration loader (docs/config.md).

- :func:`from_feature_config`: TableConfig/FeatureConfig + optimizers -> the proto TensorFlow's TPUEmbedding builds.
- :func:`load`: bytes / .pb / .pbtxt / message -> a validated, readable :class:`EmbeddingConfig` (validation in
  C++, shared with the kernels).
- :func:`to_feature_config`: the inverse of from_feature_config.
- :func:`resolve_tables`: how features become numbered tables (order, names, learning-rate tags), the one rule
  every front end applies; :func:`format_text` / :func:`format_json`: a loaded config as `python -m tf_embed_ops
  inspect` prints it.

Example:
  >>> import tf_embed_ops.config as tec
  >>> cfg = tec.load(tec.example_config_path())
  >>> print([(t.name, t.optimizer.kind, t.slot_names) for t in cfg.tables])
"""

from __future__ import annotations

import os

from tf_embed_ops.config._build import from_feature_config
from tf_embed_ops.config._errors import ConfigError, InvalidConfigError, UnimplementedConfigError
from tf_embed_ops.config._inspect import format_json, format_text
from tf_embed_ops.config._inverse import DynamicLearningRate, to_feature_config
from tf_embed_ops.config._load import load, parse_text
from tf_embed_ops.config._optimizers import (
    OptimizerCodec,
    register_optimizer,
    slot_shapes,
    supported_optimizer_classes,
)
from tf_embed_ops.config._resolve import ResolvedTables, resolve_tables
from tf_embed_ops.config._view import (
    ClipLimits,
    EmbeddingConfig,
    FeatureInfo,
    LearningRateInfo,
    OptimizerInfo,
    QuantizationInfo,
    SlotInfo,
    TableInfo,
    TPUEmbeddingConfiguration,
)


def example_config_path() -> str:
    """Path of the bundled example config (``tf_embed_ops/data/example_config.pbtxt``): four tables, four
    optimizers, a dynamic learning-rate tag shared by two tables, features with input shapes."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "example_config.pbtxt")


__all__ = [
    "ClipLimits",
    "ConfigError",
    "DynamicLearningRate",
    "EmbeddingConfig",
    "FeatureInfo",
    "InvalidConfigError",
    "LearningRateInfo",
    "OptimizerCodec",
    "OptimizerInfo",
    "QuantizationInfo",
    "ResolvedTables",
    "SlotInfo",
    "TPUEmbeddingConfiguration",
    "TableInfo",
    "UnimplementedConfigError",
    "example_config_path",
    "format_json",
    "format_text",
    "from_feature_config",
    "load",
    "parse_text",
    "register_optimizer",
    "resolve_tables",
    "slot_shapes",
    "supported_optimizer_classes",
    "to_feature_config",
]
