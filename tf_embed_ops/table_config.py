"""`te.TableConfig`: TensorFlow's `TableConfig` plus the storage dtype of the table and its slots.

TensorFlow's `tf.tpu.experimental.embedding.TableConfig` accepts only float32 (and int32) tables. This subclass
accepts everything it does, plus:

* ``storage_dtype``: the dtype the table's rows are stored in: ``tf.float32`` (default), ``tf.bfloat16`` or
  ``tf.float16``;
* ``slot_storage_dtype``: the same for the optimizer's slots (accumulators, momenta, ...); default: the table's
  ``storage_dtype``, so a bfloat16 table halves its slots' memory too. Set ``tf.float32`` to keep fp32 state;
* ``rounding``: how a 16-bit row is written back after the fp32 optimizer step: ``"stochastic"`` (default) or
  ``"nearest"`` (round to nearest even);
* ``storage``: where the rows live: None (default) in memory, as TensorFlow variables; ``te.Tiered(cache_bytes=...,
  directory=...)`` in a row file on disk behind a DRAM cache of the hot rows (docs/tiered_tables.md).

It is a `TableConfig`, so it goes wherever TensorFlow's goes (`FeatureConfig`, `te.TPUEmbedding`, the Keras
layer, `te.distribute`, `te.config.from_feature_config`). The TPU configuration proto has no storage dtype: the
serialized config is the same as for a float32 table, and the kernels read the storage dtype from the table
and slot variables themselves (docs/low_precision.md).

Example:
    >>> table = TableConfig(1000, 16, name="video", storage_dtype=tf.bfloat16)
    >>> table.storage_dtype, table.slot_storage_dtype, table.rounding
    (tf.bfloat16, tf.bfloat16, 'stochastic')
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_embed_ops import _tf_compat
from tf_embed_ops.low_precision import (
    ROUNDINGS,
    STORAGE_DTYPES,
    is_low_precision,
    set_storage_attributes,
    storage_options,
)
from tf_embed_ops.tiered import config as tiered_config

__all__ = [
    "ROUNDINGS",
    "STORAGE_DTYPES",
    "TableConfig",
    "is_low_precision",
    "needs_rounding_step",
    "rounding",
    "slot_storage_dtype",
    "storage_dtype",
]


class TableConfig(tf.tpu.experimental.embedding.TableConfig):
    """A `tf.tpu.experimental.embedding.TableConfig` with a storage dtype (module docstring).

    Args:
      vocabulary_size, dim, initializer, optimizer, combiner, name, quantization_config, layout, dtype: as
        TensorFlow's `TableConfig`.
      storage_dtype: tf.float32 (default), tf.bfloat16 or tf.float16 (or their names).
      slot_storage_dtype: the slots' dtype, same choices; None (default) = `storage_dtype`.
      rounding: "stochastic" or "nearest"; None (default) = "stochastic". Used only where something is 16-bit.
      storage: None (default: in memory) or `te.Tiered(cache_bytes=..., directory=...)`: the rows and slots on
        disk behind a DRAM row cache (docs/tiered_tables.md; trained by `te.TPUEmbedding`).

    Raises:
      ValueError: an unsupported dtype, rounding or storage (the message names the table and the value), or
        anything TensorFlow's `TableConfig` rejects.
    """

    def __init__(
        self,
        vocabulary_size: int,
        dim: int,
        initializer: Any = None,
        optimizer: Any = None,
        combiner: Any = "mean",
        name: str | None = None,
        quantization_config: Any = None,
        layout: Any = None,
        dtype: tf.DType = tf.float32,
        *,
        storage_dtype: Any = tf.float32,
        slot_storage_dtype: Any = None,
        rounding: str | None = None,
        storage: tiered_config.Tiered | None = None,
    ):
        label = repr(name) if name is not None else f"(unnamed, vocabulary_size={vocabulary_size}, dim={dim})"
        tiered = tiered_config.check_storage(f"TableConfig {label}", storage)
        owner = f"TableConfig {label}"
        options = storage_options(owner, storage_dtype, slot_storage_dtype, rounding)
        row_dtype = options[0]
        if row_dtype != tf.float32 and tf.as_dtype(dtype) != tf.float32:
            raise ValueError(
                f"TableConfig {label}: storage_dtype={row_dtype.name} needs dtype=tf.float32, got {dtype!r}"
            )
        if tiered is not None and tf.as_dtype(dtype) != tf.float32:
            raise ValueError(f"TableConfig {label}: storage=te.Tiered needs dtype=tf.float32, got {dtype!r}")
        kwargs = {"layout": layout} if layout is not None else {}
        super().__init__(
            vocabulary_size,
            dim,
            initializer=initializer,
            optimizer=optimizer,
            combiner=combiner,
            name=name,
            quantization_config=quantization_config,
            **_tf_compat.table_config_dtype_kwargs(dtype),
            **kwargs,
        )
        set_storage_attributes(self, options, tiered)

    def __repr__(self) -> str:
        base = super().__repr__()
        return (
            f"{base[:-1]}, storage_dtype={self.storage_dtype.name!r}, "
            f"slot_storage_dtype={self.slot_storage_dtype.name!r}, rounding={self.rounding!r}, "
            f"storage={self.storage!r})"
        )


def storage_dtype(table: Any) -> tf.DType:
    """The table's storage dtype: float32 for TensorFlow's own `TableConfig`."""
    return getattr(table, "storage_dtype", tf.float32)


def slot_storage_dtype(table: Any) -> tf.DType:
    """The storage dtype of the table's slots: float32 for TensorFlow's own `TableConfig`."""
    return getattr(table, "slot_storage_dtype", tf.float32)


def rounding(table: Any) -> str:
    """How the table's 16-bit rows are rounded ("stochastic" for TensorFlow's own `TableConfig`: unused there)."""
    return getattr(table, "rounding", "stochastic")


def needs_rounding_step(tables: Any) -> bool:
    """True when a table of `tables` rounds 16-bit rows stochastically (the send op then needs a step)."""
    return any(is_low_precision(t) and rounding(t) == "stochastic" for t in tables)


def check_trainable(tables: Any, config_name: str = "TableConfig") -> None:
    """Raises RuntimeError naming the first table without an optimizer (it can be looked up, not trained).

    Args:
      tables: the table configs (static `TableConfig`s or `DynamicTableConfig`s).
      config_name: their class name, for the message.
    """
    for table in tables:
        if table.optimizer is None:
            raise RuntimeError(
                f"Table {table.name!r} has no optimizer (neither {config_name}.optimizer nor the global one); "
                "it can be looked up but not trained."
            )
