"""Helpers of the sharded-embedding tests: write full tables into either class, read every table and slot."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_embed_ops.distribute import ShardedTPUEmbedding


def assign_tables(emb, values: dict) -> None:
    """Writes `{table name: full [V, dim] array}` into `emb` (a sharded embedding shard by shard)."""
    for table, var in emb.embedding_tables.items():
        full = values[table.name]
        if isinstance(emb, ShardedTPUEmbedding):
            bounds = emb.shard_boundaries[table]
            for p, shard in enumerate(var.variables):
                shard.assign(full[bounds[p] : bounds[p + 1]])
        else:
            var.assign(full)


def table_values(emb) -> dict[str, np.ndarray]:
    """`{"<table>": full table, "<table>/<slot>": full slot}` of either class."""
    out = {}
    for table, var in emb.embedding_tables.items():
        out[table.name] = tf.convert_to_tensor(var).numpy()
        for slot, slot_var in emb.slot_variables[table].items():
            out[f"{table.name}/{slot}"] = tf.convert_to_tensor(slot_var).numpy()
    return out
