"""What each parameter server runs: its table shards, the features reading them, and its own configuration.

The kernels read one `TPUEmbeddingConfiguration` per call.  A parameter server holds shard ``p`` of every table
with more than ``p`` shards, so its configuration is the global one restricted to those tables (vocabulary =
the shard's row count, same optimizer) and to the features reading them, with table ids and dynamic
learning-rate tags renumbered densely (the config validator requires dense tags).  Nothing else changes, so a
shard's update is exactly the single-table update on the rows it owns.

The compact protocol (`compact_call`) gives a server one input per table whose rows travel compactly: the
distinct local ids of the step, each its own sample, so the forward op returns those rows and the fused update
takes one summed gradient row per id.

Example:
    >>> plans = plan_servers(config_proto, [[0, 4, 7, 10], [0, 2]])   # table 0 over 3 servers, table 1 on 1
    >>> [p.tables for p in plans]
    [[0, 1], [0], [0]]
"""

from __future__ import annotations

from typing import NamedTuple

from tf_embed_ops._tf_compat import tpu_embedding_configuration_pb2

__all__ = ["CompactCall", "ServerPlan", "compact_call", "plan_servers"]


class ServerPlan(NamedTuple):
    """The share of one parameter server (task `task`): it holds shard `task` of each table in `tables`.

    Attributes:
      task: the parameter server's task index (= the shard index it holds of each of its tables).
      tables: global table indices with a shard on this server, ascending (local table id = position).
      features: global feature indices whose table is in `tables`, ascending (local feature order).
      tags: global dynamic learning-rate tags used by `tables`, in local tag order (local tag = position).
      row_offsets: per local table, the global id of its first row on this server.
      config: the serialized per-server `TPUEmbeddingConfiguration`.
    """

    task: int
    tables: list
    features: list
    tags: list
    row_offsets: list
    config: bytes


def plan_servers(config_proto, table_boundaries: list) -> list:
    """Splits a configuration into one per parameter server holding a shard.

    Args:
      config_proto: the global `TPUEmbeddingConfiguration` (one table descriptor per table, one feature
        descriptor per feature).
      table_boundaries: per table, its DIV boundaries (``div_shard_boundaries``): shard i = rows [b[i], b[i+1]).

    Returns:
      A list of `ServerPlan`, one per server index 0 .. max(number of shards) - 1.

    Raises:
      ValueError: if `table_boundaries` does not have one entry per table descriptor, or a boundary list does
        not span the table's vocabulary.
    """
    tables = list(config_proto.table_descriptor)
    if len(table_boundaries) != len(tables):
        raise ValueError(
            f"Argument `table_boundaries` must have one entry per table ({len(tables)}); got {len(table_boundaries)}."
        )
    for t, (desc, bounds) in enumerate(zip(tables, table_boundaries, strict=True)):
        if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != desc.vocabulary_size:
            raise ValueError(
                f"table_boundaries[{t}] = {list(bounds)} must run from 0 to the vocabulary size "
                f"{desc.vocabulary_size} of table {desc.name!r}."
            )
    num_servers = max(len(b) - 1 for b in table_boundaries)
    plans = []
    for task in range(num_servers):
        local_tables = [t for t, b in enumerate(table_boundaries) if len(b) - 1 > task]
        plans.append(_plan_one(config_proto, task, local_tables, table_boundaries))
    return plans


def _plan_one(config_proto, task: int, local_tables: list, table_boundaries: list) -> ServerPlan:
    local_id = {t: i for i, t in enumerate(local_tables)}
    sub = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration()
    sub.CopyFrom(config_proto)
    del sub.table_descriptor[:]
    del sub.feature_descriptor[:]

    tags = []
    for t in local_tables:
        desc = sub.table_descriptor.add()
        desc.CopyFrom(config_proto.table_descriptor[t])
        bounds = table_boundaries[t]
        desc.vocabulary_size = bounds[task + 1] - bounds[task]
        lr = desc.optimization_parameters.learning_rate
        if lr.HasField("dynamic"):
            if lr.dynamic.tag not in tags:
                tags.append(lr.dynamic.tag)
            lr.dynamic.tag = tags.index(lr.dynamic.tag)

    features = []
    for f, feature in enumerate(config_proto.feature_descriptor):
        if feature.table_id in local_id:
            desc = sub.feature_descriptor.add()
            desc.CopyFrom(feature)
            desc.table_id = local_id[feature.table_id]
            features.append(f)

    return ServerPlan(
        task=task,
        tables=list(local_tables),
        features=features,
        tags=tags,
        row_offsets=[table_boundaries[t][task] for t in local_tables],
        config=sub.SerializeToString(),
    )


class CompactCall(NamedTuple):
    """What one server's forward and update ops read under the compact protocol.

    Attributes:
      config: the server's configuration with its features replaced, table by table (local order): a table in
        the compact set gets one feature (its distinct rows, one id each); any other keeps its own features.
      entries: per feature descriptor of `config`, ``("rows", local table index)`` or ``("feature", global
        feature index)``.
    """

    config: bytes
    entries: list


def compact_call(plan: ServerPlan, compact_tables: set, feature_tables: list) -> CompactCall:
    """The per-server call of the compact protocol.

    Args:
      plan: the server's `ServerPlan`.
      compact_tables: global indices of the tables whose rows travel compactly.
      feature_tables: the global table index of every global feature.

    Returns:
      A `CompactCall`.
    """
    config = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration()
    config.ParseFromString(plan.config)
    originals = list(config.feature_descriptor)
    del config.feature_descriptor[:]
    entries = []
    for j, t in enumerate(plan.tables):
        if t in compact_tables:
            feature = config.feature_descriptor.add()
            feature.name = f"{config.table_descriptor[j].name}_rows"
            feature.table_id = j
            feature.input_shape.append(1)  # descriptive: the kernels take the row count from the inputs
            entries.append(("rows", j))
            continue
        for local, f in enumerate(plan.features):
            if feature_tables[f] == t:
                config.feature_descriptor.add().CopyFrom(originals[local])
                entries.append(("feature", f))
    return CompactCall(config.SerializeToString(), entries)
