"""The tables of a front end as TensorFlow's mid-level class prepares them: each named (`table_{i}` unless given)
and given its optimizer (the global one where it has none; a Keras optimizer converted to its TPU optimizer),
and refused, naming the table, when its optimizer or combiner has no CPU update."""

from __future__ import annotations

import sys
from typing import Any

import tensorflow as tf

from tf_embed_ops import config as config_lib

__all__ = ["config_proto", "name_and_check_tables"]


def _supported_optimizers() -> tuple[type, ...]:
    # Every optimizer class the config loader maps into the proto: TensorFlow's five and tf_embed_ops.optimizers
    # (CustomOptimizer aside: a SparseCore program with no Load/Retrieve op and no CPU meaning).
    return config_lib.supported_optimizer_classes()


def _from_keras(optimizer: Any, table: Any) -> Any:
    # A Keras optimizer or its string name becomes its TPU optimizer (Keras is imported only for those).
    keras = sys.modules.get("keras")  # a Keras optimizer object implies Keras is imported
    if isinstance(optimizer, str) or (keras is not None and isinstance(optimizer, keras.optimizers.Optimizer)):
        from tf_embed_ops import optimizer_mapping  # pylint: disable=import-outside-toplevel

        return optimizer_mapping.to_table_optimizer(optimizer, table)
    return optimizer


def name_and_check_tables(resolved: Any) -> None:
    """Writes each table's name and optimizer into its `TableConfig` (`resolved`: `config.resolve_tables`' answer).

    Raises:
      ValueError: an optimizer no CPU update runs, or a `CustomCombiner`, naming the table.
    """
    for i, (table, name) in enumerate(zip(resolved.tables, resolved.names, strict=True)):
        # TensorFlow writes the global optimizer and the `table_{i}` name into the TableConfig itself; so do
        # we (same objects, same config proto from tf_embed_ops.config.from_feature_config).
        table.optimizer = resolved.optimizers[i]
        if table.optimizer is not None and not isinstance(table.optimizer, _supported_optimizers()):
            table.optimizer = _from_keras(table.optimizer, name)
        if table.optimizer is not None and not isinstance(table.optimizer, _supported_optimizers()):
            raise ValueError(
                f"{type(table.optimizer)} is an unsupported optimizer class (table {name!r}). "
                "Please pass an instance of tf.tpu.experimental.embedding.SGD, Adagrad, AdagradMomentum, "
                "Adam or FTRL, of a tf_embed_ops.optimizers class, or keras.optimizers.SGD, Adagrad, Adam or Ftrl."
            )
        if not isinstance(table.combiner, str):
            raise ValueError(
                f"Table {name!r} uses combiner {table.combiner!r}; only 'sum', 'mean' and 'sqrtn' "
                "are supported off SparseCore."
            )
        table.name = name


def config_proto(features: Any, output_shapes: list, pipeline_execution_with_tensor_core: bool) -> Any:
    """The `TPUEmbeddingConfiguration` of `features` (a nest, or a list of the in-memory ones) with their output
    shapes (flattened order).

    The tables already carry their (possibly global) optimizer. A table with none (lookup only, as TF's serving
    class allows) is described as SGD with learning rate 0; `apply_gradients` refuses to train it.
    """
    untrained = any(f.table.optimizer is None for f in tf.nest.flatten(features))
    return config_lib.from_feature_config(
        features,
        optimizer=tf.tpu.experimental.embedding.SGD(learning_rate=0.0) if untrained else None,
        pipeline_execution_with_tensor_core=pipeline_execution_with_tensor_core,
        output_shapes=tf.nest.pack_sequence_as(features, [tf.TensorShape(s) for s in output_shapes]),
    )


def group_config_proto(feature_config: Any, group: Any, output_shapes: list, pipeline: bool) -> Any:
    """The configuration of the in-memory `group`'s features (`output_shapes`: every feature's; an empty one without
    the group: the other groups have their own): the `feature_config` nest itself when the group has every
    feature."""
    if group is None:
        return config_lib.TPUEmbeddingConfiguration()
    features = feature_config if len(group.positions) == len(output_shapes) else list(group.features)
    return config_proto(features, [output_shapes[i] for i in group.positions], pipeline)
