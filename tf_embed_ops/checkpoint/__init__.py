"""Incremental checkpoints (docs/checkpoints.md): `IncrementalCheckpointManager` saves a full checkpoint, then
deltas of the embedding rows changed since the previous save (te.tracking), and restores a chain bit for bit."""

from tf_embed_ops.checkpoint._format import CheckpointError
from tf_embed_ops.checkpoint.manager import IncrementalCheckpointManager

__all__ = ["CheckpointError", "IncrementalCheckpointManager"]
