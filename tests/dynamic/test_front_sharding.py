"""shard_of_keys: plain-TF placement of dynamic-table keys, against a numpy reference of the same formula."""

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tests.dynamic.key_hash_reference import MASK as _MASK
from tests.dynamic.key_hash_reference import fmix64 as _fmix64
from tf_embed_ops.dynamic import sharding


def _reference_shard(key: int, n: int) -> int:
    return (_fmix64(key & _MASK) >> 1) % n


_EDGE_KEYS = [0, 1, -1, 2, 7, 2**62, -(2**63), 2**63 - 1, 123456789012345, -98765]


@pytest.mark.parametrize("num_shards", [1, 2, 3, 7, 64])
def test_matches_the_reference(num_shards):
    rng = np.random.default_rng(0)
    keys = np.concatenate([np.array(_EDGE_KEYS, np.int64), rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64)])
    got = te.dynamic.shard_of_keys(tf.constant(keys), num_shards).numpy()
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [_reference_shard(int(k), num_shards) for k in keys])


def test_fmix64_reference_vector():
    # MurmurHash3 fmix64(1) (published in many ports): spot-checks the uint64 TF ops.
    assert int(sharding.fmix64(tf.constant([1], tf.int64)).numpy()[0]) == _fmix64(1)
    assert _fmix64(1) == 0xB456BCFC34C2CB2C


def test_sequential_ids_spread_evenly():
    counts = np.bincount(te.dynamic.shard_of_keys(tf.range(100_000, dtype=tf.int64), 4).numpy(), minlength=4)
    assert counts.min() > 24_000 and counts.max() < 26_000
    # Multiples of the shard count would all land on shard 0 under `key % n`.
    counts = np.bincount(te.dynamic.shard_of_keys(tf.range(0, 40_000, 4, dtype=tf.int64), 4).numpy(), minlength=4)
    assert counts.min() > 2_000


def test_strings_are_placed_by_their_fingerprint_key():
    strings = tf.constant([["user_1", "user_2"], ["", "ü"]])
    keys = te.dynamic.string_keys(strings)
    assert keys.shape == (2, 2)
    np.testing.assert_array_equal(
        te.dynamic.shard_of_keys(strings, 5).numpy(), te.dynamic.shard_of_keys(keys, 5).numpy()
    )
    # The key is tf.fingerprint's 8 bytes read little-endian.
    raw = tf.fingerprint(tf.constant(["user_1"])).numpy()[0]
    assert int(keys.numpy()[0, 0]) == int.from_bytes(bytes(raw), "little", signed=True)


def test_int32_keys_are_widened_and_shape_kept():
    got = te.dynamic.shard_of_keys(tf.constant([[1, 2, 3]], tf.int32), 3)
    assert got.shape == (1, 3)
    np.testing.assert_array_equal(got.numpy()[0], [_reference_shard(k, 3) for k in (1, 2, 3)])


def test_works_in_a_graph_with_unknown_shape():
    fn = tf.function(lambda k: te.dynamic.shard_of_keys(k, 3), input_signature=[tf.TensorSpec(None, tf.int64)])
    np.testing.assert_array_equal(fn(tf.constant([5, -5], tf.int64)).numpy(), [_reference_shard(k, 3) for k in (5, -5)])


@pytest.mark.parametrize("num_shards", [0, -1, 2.0, True, None])
def test_bad_shard_count(num_shards):
    with pytest.raises(ValueError, match=r"`num_shards` must be an int >= 1; got"):
        te.dynamic.shard_of_keys(tf.constant([1], tf.int64), num_shards)


def test_float_keys_are_refused():
    with pytest.raises(ValueError, match="keys must be integers or strings; got float32"):
        te.dynamic.shard_of_keys(tf.constant([1.0]), 2)
