"""from_feature_config(): TableConfig/FeatureConfig + optimizers -> the TPUEmbeddingConfiguration TensorFlow builds.

Mirrors ``tf.tpu.experimental.embedding.TPUEmbedding.__init__`` + ``_create_config_proto`` (tpu_embedding_v2.py)
and ``TableConfig._set_table_descriptor`` (tpu_embedding_v2_utils.py) field for field, with two differences:
it never mutates the user's TableConfig objects (TF writes the global optimizer and ``table_{i}`` names into
them), and it does not crash under protobuf 7 (see _optimizers.py).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_embed_ops import features as features_lib
from tf_embed_ops._tf_compat import nest, tpu_embedding_configuration_pb2
from tf_embed_ops.config import _optimizers
from tf_embed_ops.config._resolve import ResolvedTables, resolve_tables

TPUEmbeddingConfiguration = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration


def _resolve_output_shapes(feature_config: Any, features: list[Any], output_shapes: Any) -> list[tf.TensorShape]:
    """FeatureConfig.output_shape first, then ``output_shapes`` (TPUEmbedding._update_output_shapes priority)."""
    shapes = [tf.TensorShape(f.output_shape) for f in features]
    if output_shapes is None:
        return shapes
    if isinstance(output_shapes, int) and not isinstance(output_shapes, bool):
        if output_shapes < 1:
            raise ValueError(f"output_shapes: a per-replica batch size must be >= 1, got {output_shapes}")
        incoming = features_lib.batch_output_shapes(features, output_shapes)
    else:
        try:
            flat = nest.flatten_up_to(feature_config, output_shapes)
        except (TypeError, ValueError) as e:
            raise ValueError(f"output_shapes: must have the structure of feature_config ({e})") from None
        incoming = [tf.TensorShape(s) for s in flat]
    paths = [p for p, _ in nest.flatten_with_joined_string_paths(feature_config)]
    merged = []
    for path, old, new in zip(paths, shapes, incoming, strict=False):
        if old and new and old.rank is not None and new.rank is not None:
            # TPUEmbedding._check_output_shapes: a rank-1/2 incoming shape may stand for a longer sequence shape.
            skip = new.rank in (1, 2) and old.rank > new.rank
            if not skip and (old.rank != new.rank or not old.is_compatible_with(new)):
                raise ValueError(
                    f"output_shapes: feature {path or '<root>'} has FeatureConfig.output_shape {old}, which "
                    f"contradicts the given output shape {new}"
                )
        merged.append(old if old else new)
    return merged


def _check_optimizers(resolved: ResolvedTables) -> None:
    """Every table has a supported optimizer whose values the config validator accepts (ValueError otherwise)."""
    for name, table_optimizer in zip(resolved.names, resolved.optimizers, strict=True):
        if table_optimizer is None:
            raise ValueError(
                f"optimizer: table {name!r} has no optimizer; pass a global `optimizer` or set TableConfig.optimizer"
            )
        codec = _optimizers.codec_for_optimizer(table_optimizer)
        if codec is None:
            supported = ", ".join(c.__name__ for c in _optimizers.supported_optimizer_classes())
            raise ValueError(
                f"optimizer: table {name!r} has optimizer {type(table_optimizer).__name__}, which is not supported "
                f"(supported: {supported})"
            )
        if codec.check is not None:
            codec.check(table_optimizer, f"optimizer of table {name!r}: ")


def _add_table(proto: TPUEmbeddingConfiguration, resolved: ResolvedTables, table_id: int, num_hosts: int) -> None:
    """Appends table ``table_id``'s descriptor, as ``TableConfig._set_table_descriptor`` writes it."""
    table, table_optimizer = resolved.tables[table_id], resolved.optimizers[table_id]
    td = proto.table_descriptor.add()
    td.name = resolved.names[table_id]
    td.vocabulary_size = max(table.vocabulary_size, num_hosts)
    td.dimension = table.dim
    params = td.optimization_parameters
    tag = resolved.tag(table_id)
    if tag is not None:
        params.learning_rate.dynamic.tag = tag
    else:
        params.learning_rate.constant = table_optimizer.learning_rate
    _optimizers.codec_for_optimizer(table_optimizer).fill(table_optimizer, params)
    q = table.quantization_config
    if q:
        params.simulated_quantization.enabled = True
        params.simulated_quantization.num_buckets = q.num_buckets
        params.simulated_quantization.clipping_limits.lower.value = q.lower
        params.simulated_quantization.clipping_limits.upper.value = q.upper


def from_feature_config(
    feature_config: Any,
    optimizer: Any = None,
    *,
    num_hosts: int = 1,
    num_tensor_cores: int = 1,
    pipeline_execution_with_tensor_core: bool = False,
    output_shapes: Any = None,
) -> TPUEmbeddingConfiguration:
    """Builds the TPUEmbeddingConfiguration TensorFlow's ``TPUEmbedding`` builds for these features.

    Tables are numbered in order of first appearance in ``tf.nest.flatten(feature_config)`` (dicts flatten in key
    order), unnamed tables are called ``table_{i}``, each vocabulary is padded to ``max(vocabulary_size,
    num_hosts)``, and each callable learning rate gets a dynamic tag: callables are collected in table order,
    de-duplicated with ``==``, and a table's tag is its callable's index (docs/semantics.md).  One feature descriptor
    per flattened feature, named only if ``FeatureConfig.name`` is set, with ``input_shape`` when the shape is fully
    known.  ``mode`` is TRAINING and ``sharding_strategy`` DIV_DEFAULT, as TensorFlow always sets them.  The
    TableConfig/optimizer objects are not modified.

    Args:
      feature_config: a ``tf.tpu.experimental.embedding.FeatureConfig`` or a nest (list/tuple/dict) of them.
      optimizer: the global optimizer, used for every table whose ``TableConfig.optimizer`` is None: a
        ``tf.tpu.experimental.embedding`` SGD, Adagrad, AdagradMomentum, Adam or FTRL, or any registered class.
      num_hosts: number of hosts the tables are sharded over (``strategy.extended.num_hosts`` on TPU).
      num_tensor_cores: ``num_replicas * cores_per_replica``.
      pipeline_execution_with_tensor_core: copied into the proto.
      output_shapes: per-replica output shapes (the activation shape without the embedding dimension) with the
        structure of ``feature_config`` (entries may be None), or an int per-replica batch size (``[B]``, or
        ``[B, max_sequence_length]`` for sequence features), as ``TPUEmbedding.build`` takes it.
        ``FeatureConfig.output_shape`` takes priority.  A feature whose shape stays unknown or partial gets no
        ``input_shape`` (it becomes known at the first batch); TensorFlow would refuse to build then.

    Returns:
      A new ``TPUEmbeddingConfiguration`` message.

    Raises:
      ValueError: ``feature_config`` holds something other than FeatureConfig; a table has no optimizer (neither
        its own nor ``optimizer``); an unsupported optimizer class; duplicate table names; bad ``num_hosts``/
        ``num_tensor_cores``; ``output_shapes`` of the wrong structure or contradicting ``FeatureConfig``.

    Example:
      >>> table = tf.tpu.experimental.embedding.TableConfig(vocabulary_size=1000, dim=16, name="video")
      >>> features = {"watched": tf.tpu.experimental.embedding.FeatureConfig(table, output_shape=[32])}
      >>> proto = from_feature_config(features, tf.tpu.experimental.embedding.Adagrad(0.1))
    """
    features = features_lib.check_feature_configs(feature_config)
    for name, value in (("num_hosts", num_hosts), ("num_tensor_cores", num_tensor_cores)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be an int >= 1, got {value!r}")

    resolved = resolve_tables(features, optimizer)
    _check_optimizers(resolved)
    proto = TPUEmbeddingConfiguration()
    for table_id in range(len(resolved.tables)):
        _add_table(proto, resolved, table_id, num_hosts)
    for feature, shape in zip(features, _resolve_output_shapes(feature_config, features, output_shapes), strict=False):
        fd = proto.feature_descriptor.add()
        if feature.name:
            fd.name = feature.name
        fd.table_id = resolved.table_id(feature.table)
        if shape.rank is not None and shape.is_fully_defined():
            fd.input_shape.extend(shape.as_list())

    proto.mode = TPUEmbeddingConfiguration.TRAINING
    proto.num_hosts = num_hosts
    proto.num_tensor_cores = num_tensor_cores
    proto.sharding_strategy = TPUEmbeddingConfiguration.DIV_DEFAULT
    proto.pipeline_execution_with_tensor_core = pipeline_execution_with_tensor_core
    return proto
