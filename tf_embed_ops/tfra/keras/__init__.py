"""`de.keras`: TFRA's Keras namespace (`de.keras.layers`)."""

from tf_embed_ops.tfra.keras import layers

__all__ = ["layers"]
