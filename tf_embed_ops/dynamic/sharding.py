"""Which shard holds a dynamic-table key: `shard_of_keys`, the one definition every sharded path uses.

Lookups and updates on parameter servers, resharding a checkpoint on restore, and the serving export all place a
key with this function, so it is written with plain TensorFlow ops (no custom op): a graph without the plugin
computes the same placement.

The key is mixed with MurmurHash3's 64-bit finaliser (`fmix64`, a bijection with good avalanche) before the
modulo: raw ids are often sequential or share low bits (ids minted as multiples of a shard count, string
fingerprints are fine either way), and `key % n` would put them all on one shard.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["fmix64", "shard_of_keys"]

_C1 = 0xFF51AFD7ED558CCD
_C2 = 0xC4CEB9FE1A85EC53


def fmix64(keys: tf.Tensor) -> tf.Tensor:
    """MurmurHash3's 64-bit finaliser over int64 keys, as uint64 (xor, shift and wrapping multiply)."""
    x = tf.bitcast(tf.convert_to_tensor(keys, tf.int64), tf.uint64)
    shift = tf.constant(33, tf.uint64)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, shift))
    x = tf.math.multiply(x, tf.constant(_C1, tf.uint64))
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, shift))
    x = tf.math.multiply(x, tf.constant(_C2, tf.uint64))
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, shift))


def shard_of_keys(keys: Any, num_shards: int) -> tf.Tensor:
    """The shard (int32 in `[0, num_shards)`) holding each key: `(fmix64(key) >> 1) mod num_shards`.

    Args:
      keys: int64 keys (any shape), or strings (placed by the key the ops give them, `tf.fingerprint`'s).
      num_shards: the number of shards, >= 1.

    Returns:
      An int32 tensor of the shape of `keys`.

    Raises:
      ValueError: if `num_shards` is not a positive int or `keys` are neither integers nor strings.

    Example:
      >>> shard_of_keys(tf.constant([1, 2, 3], tf.int64), 2).numpy()   # the same on every machine
    """
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"shard_of_keys: `num_shards` must be an int >= 1; got {num_shards!r}.")
    keys = keys if isinstance(keys, tf.Tensor) else tf.convert_to_tensor(keys)
    if keys.dtype == tf.string:
        from tf_embed_ops.dynamic.ops import string_keys_to_int64  # pylint: disable=import-outside-toplevel

        keys = string_keys_to_int64(keys)
    elif keys.dtype.is_integer:
        keys = tf.cast(keys, tf.int64)
    else:
        raise ValueError(f"shard_of_keys: keys must be integers or strings; got {keys.dtype.name}.")
    if num_shards == 1:
        return tf.zeros_like(keys, tf.int32)
    # The top 63 bits fit an int64, whose floormod TensorFlow has on every device (uint64 has none).
    mixed = tf.bitcast(tf.bitwise.right_shift(fmix64(keys), tf.constant(1, tf.uint64)), tf.int64)
    return tf.cast(tf.math.floormod(mixed, tf.constant(num_shards, tf.int64)), tf.int32)
