"""What TFRA has and tf_embed_ops does not: each name raises an error that names the alternative.

`de.<name>` for any of these names (and the `kv_creator=` / `devices=` arguments that would select them) raise
`NotImplementedError` with the message below, before anything is created.
"""

from __future__ import annotations

__all__ = ["REFUSED", "refusal"]

_TIERED = (
    "tf_embed_ops keeps dynamic tables in this process's memory; for tables larger than memory use a tiered "
    "table (te.DynamicTableConfig(..., storage=te.Tiered(cache_bytes=..., directory=...)), docs/tiered_tables.md), "
    "and to spread one over machines te.distribute (docs/dynamic_tables.md, 'Sharding')"
)
_GPU = (
    "tf_embed_ops' dynamic tables run on the CPU (the host memory of a training job), as TFRA's default cuckoo "
    "tables do; drop the GPU device or HKV creator"
)
_HOROVOD = "Horovod is not supported; shard tables over parameter servers with te.distribute (docs/distribute.md)"

REFUSED: dict[str, str] = {
    "RedisTable": _TIERED,
    "RedisTableConfig": _TIERED,
    "RedisTableCreator": _TIERED,
    "HkvHashTable": _GPU,
    "HkvHashTableConfig": _GPU,
    "HkvHashTableCreator": _GPU,
    "HkvEvictStrategy": _GPU,
    "FileSystemSaver": "checkpoints are written by tf.train.Checkpoint / model.save (no separate file-system saver)",
    "HvdVariable": _HOROVOD,
    "DEHvdModel": _HOROVOD,
    "DEHvdBroadcastGlobalVariablesCallback": _HOROVOD,
    "ShadowVariable": (
        "there is no shadow variable: the table is trained in place by its fused optimizer; use "
        "de.keras.layers.Embedding or de.embedding_lookup(..., return_trainable=True)"
    ),
    "DynamicLayerNormalization": "not provided; use keras.layers.LayerNormalization",
    "CuckooHashTable": "the table is a tf_embed_ops dynamic table; use de.get_variable / de.Variable",
    "CuckooHashTableConfig": "not needed: de.get_variable takes init_size; other options have no equivalent",
    "CuckooHashTableCreator": "not needed: de.get_variable creates the table (kv_creator=None)",
    "TrainableWrapper": (
        "there is no trainable wrapper: de.embedding_lookup(..., return_trainable=True) returns the variable that "
        "makes the optimizer train the table"
    ),
}


def refusal(name: str) -> NotImplementedError:
    """The error for TFRA's `name`."""
    return NotImplementedError(
        f"de.{name} (TensorFlow Recommenders-Addons) is not supported by tf_embed_ops.tfra: {REFUSED[name]}."
    )
