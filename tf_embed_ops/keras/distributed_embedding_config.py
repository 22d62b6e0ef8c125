"""`TableConfig` / `FeatureConfig` with keras-rs's fields, for `DistributedEmbedding` without keras-rs installed.

The fields, defaults and `get_config` layout are keras-rs 0.4.0's (`keras_rs.layers.TableConfig/FeatureConfig`),
so a model written for keras-rs reads the same with these. `DistributedEmbedding` accepts either kind.

Example:
    >>> table = TableConfig(name="user", vocabulary_size=1000, embedding_dim=16, optimizer="adagrad")
    >>> feature = FeatureConfig(name="user", table=table, input_shape=(128,), output_shape=(128, 16))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras

__all__ = ["FeatureConfig", "TableConfig"]


@dataclasses.dataclass(eq=False)
class TableConfig:
    """One embedding table (keras-rs's fields; `placement` and the partition limits have no effect on CPU)."""

    name: str
    vocabulary_size: int
    embedding_dim: int
    initializer: Any = dataclasses.field(default_factory=lambda: keras.initializers.VarianceScaling(mode="fan_out"))
    optimizer: Any = "adam"
    combiner: str = "mean"
    placement: str = "auto"
    max_ids_per_partition: int = 256
    max_unique_ids_per_partition: int = 256

    def get_config(self) -> dict[str, Any]:
        return table_config_to_dict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TableConfig:
        return cls(**table_fields_from_dict(config))


@dataclasses.dataclass(eq=False)
class FeatureConfig:
    """One input feature: its table, its input shape (`(batch,)` or `(batch, max_ids)`), its output shape."""

    name: str
    table: Any
    input_shape: Any
    output_shape: Any

    def get_config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "table": self.table.get_config(),
            "input_shape": list(self.input_shape),
            "output_shape": list(self.output_shape),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> FeatureConfig:
        config = dict(config)
        config["table"] = TableConfig.from_config(config["table"])
        return cls(**config)


def _optimizer_to_json(optimizer: Any) -> Any:
    # A string stays a string; a Keras optimizer is a Keras object; a TPU optimizer uses our own serialiser.
    from tf_embed_ops.keras import serialization  # pylint: disable=import-outside-toplevel

    if optimizer is None or isinstance(optimizer, str):
        return optimizer
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return {"keras": keras.saving.serialize_keras_object(optimizer)}
    return {"tpu": serialization.optimizer_to_dict(optimizer)}


def _optimizer_from_json(value: Any) -> Any:
    from tf_embed_ops.keras import serialization  # pylint: disable=import-outside-toplevel

    if isinstance(value, dict) and "keras" in value:
        return keras.saving.deserialize_keras_object(value["keras"])
    if isinstance(value, dict) and "tpu" in value:
        return serialization.optimizer_from_dict(value["tpu"])
    return value


def table_config_to_dict(table: Any) -> dict[str, Any]:
    """The JSON-able fields of a TableConfig of either kind (keras-rs's or ours)."""
    initializer = table.initializer
    if not isinstance(initializer, str):
        initializer = keras.saving.serialize_keras_object(initializer)
    return {
        "name": table.name,
        "vocabulary_size": table.vocabulary_size,
        "embedding_dim": table.embedding_dim,
        "initializer": initializer,
        "optimizer": _optimizer_to_json(table.optimizer),
        "combiner": table.combiner,
        "placement": table.placement,
        "max_ids_per_partition": table.max_ids_per_partition,
        "max_unique_ids_per_partition": table.max_unique_ids_per_partition,
    }


def table_fields_from_dict(config: dict[str, Any]) -> dict[str, Any]:
    """Inverse of `table_config_to_dict`: constructor arguments for either kind of TableConfig."""
    fields = dict(config)
    if not isinstance(fields["initializer"], str):
        fields["initializer"] = keras.saving.deserialize_keras_object(fields["initializer"])
    fields["optimizer"] = _optimizer_from_json(fields["optimizer"])
    return fields
