"""Row encodings of served tables (tf_embed_ops/serving/quantization.py) against a numpy reference written from
FBGEMM's reference encoder (FloatOrHalfToFusedNBitRowwiseQuantizedSBHalfRef), one row and one value at a time;
lookups through encoded tables against lookups in the decoded table, for every combiner and input kind."""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from tf_embed_ops import embedding_ops
from tf_embed_ops import keras as te_keras
from tf_embed_ops.serving import quantization as q
from tf_embed_ops.serving.tables import ServedTable

F32 = np.float32


def _half(x: float) -> float:
    """float -> IEEE half (round to nearest even) -> float, through struct (not numpy's float16)."""
    return struct.unpack("<e", struct.pack("<e", float(x)))[0]


def _reference_row(row: np.ndarray, nbits: int) -> tuple[list[int], float, float]:
    """FBGEMM's reference N-bit row-wise encoder for one row: (codes, scale, bias), float32 arithmetic."""
    levels = (1 << nbits) - 1
    lo, hi = F32(row.min()), F32(row.max())
    bias = F32(_half(lo))
    span = F32(hi - bias)
    scale = F32(1.0) if span == 0 else F32(span / F32(levels))
    scale = F32(_half(scale))
    if scale == 0:
        scale = F32(1.0)
    inverse = F32(F32(1.0) / scale)
    if np.isinf(inverse):
        scale, inverse = F32(1.0), F32(1.0)
    codes = []
    for x in row:
        v = F32(F32(F32(x) - bias) * inverse)
        r = int(np.rint(v))  # lrintf: ties to even
        codes.append(max(0, min(levels, r)))
    return codes, float(scale), float(bias)


def _reference_encode(weights: np.ndarray, nbits: int) -> np.ndarray:
    out = []
    for row in weights:
        codes, scale, bias = _reference_row(row, nbits)
        if nbits == 4:
            codes = codes + [0] * (len(codes) % 2)
            packed = [codes[i] | (codes[i + 1] << 4) for i in range(0, len(codes), 2)]
        else:
            packed = codes
        out.append(bytes(packed) + struct.pack("<ee", scale, bias))
    return np.frombuffer(b"".join(out), np.uint8).reshape(len(out), -1)


def _rows(rng, n, dim):
    w = rng.normal(size=(n, dim)).astype(F32)
    w[0] = 0.0  # a constant row
    w[1] = 0.1  # a constant row whose value float16 does not hold
    w[2, 0] = 70.0  # a wide row
    w[3] = np.linspace(-1e-6, 1e-6, dim)  # a tiny range: the scale underflows float16
    return w


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("dim", [1, 2, 3, 8, 17, 64])
def test_rowwise_encoding_is_fbgemms_byte_for_byte_and_decodes_the_same_in_tensorflow(mode, dim):
    nbits = 8 if mode == "int8" else 4
    weights = _rows(np.random.default_rng(dim), 12, dim)
    encoded = q.encode(weights, mode, "t")
    np.testing.assert_array_equal(encoded, _reference_encode(weights, nbits))
    assert encoded.shape == (12, q.encoded_width(mode, dim)) and q.row_bytes(mode, dim) == encoded.shape[1]
    # Reference decode: scale * code + bias in float32, per value.
    want = np.zeros_like(weights)
    for i, row in enumerate(encoded):
        scale, bias = struct.unpack("<ee", bytes(row[-4:]))
        for j in range(dim):
            byte = int(row[j // (8 // nbits)])
            code = (byte >> (nbits * (j % (8 // nbits)))) & ((1 << nbits) - 1)
            want[i, j] = F32(F32(code) * F32(scale)) + F32(bias)
    got_np = q.decode_numpy(encoded, mode, dim)
    got_tf = q.decode(tf.constant(encoded), mode, dim).numpy()
    np.testing.assert_array_equal(got_np.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(got_tf.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_rowwise_error_is_bounded_per_row(mode):
    levels = 255 if mode == "int8" else 15
    weights = np.random.default_rng(5).normal(scale=3.0, size=(200, 64)).astype(F32)
    decoded = q.decode_numpy(q.encode(weights, mode, "t"), mode, 64)
    lo, hi = weights.min(1), weights.max(1)
    step = (hi - lo) / levels
    # Half a step from rounding; plus float16's relative rounding (2**-11) of the bias and of the scale (times the
    # code, at most `levels`), which can push the extremes against a clamp; plus float32 rounding.
    bound = 0.5 * step + 2.0**-11 * (np.abs(lo) + levels * step) + 1e-6 * np.abs(weights).max(1)
    err = np.abs(decoded - weights).max(1)
    assert np.all(err <= bound), (err / bound).max()
    assert err.mean() > 0.1 * bound.mean()  # the bound is not vacuous


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_values_on_the_grid_are_exact(mode):
    levels = 255 if mode == "int8" else 15
    rng = np.random.default_rng(2)
    rows = []
    for _ in range(20):
        scale = F32(2.0 ** rng.integers(-8, 2)) * F32(rng.integers(1, 8))  # float16-exact scales
        bias = F32(rng.integers(-64, 64)) * F32(2.0**-4)  # float16-exact biases
        codes = rng.integers(0, levels + 1, 9)
        codes[0], codes[1] = 0, levels  # the row spans the whole grid
        rows.append(bias + codes.astype(F32) * scale)
    weights = np.stack(rows).astype(F32)
    decoded = q.decode(tf.constant(q.encode(weights, mode, "t")), mode, 9).numpy()
    np.testing.assert_array_equal(decoded, weights)


def test_16_bit_modes_round_to_nearest_even():
    weights = np.random.default_rng(3).normal(size=(30, 7)).astype(F32)
    weights[0, :3] = [1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 65504.0]  # float16 ties, the largest float16
    half = np.array([[_half(x) for x in row] for row in weights], F32)
    np.testing.assert_array_equal(q.decode(tf.constant(q.encode(weights, "float16", "t")), "float16", 7), half)
    # bfloat16: keep the top 16 bits of float32, rounding the low 16 to nearest, ties to even.
    bits = weights.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(F32)
    encoded = q.encode(weights, "bfloat16", "t")
    assert encoded.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(q.decode(tf.constant(encoded), "bfloat16", 7).numpy(), rounded)


def test_encoder_refusals_name_the_table_and_the_value():
    with pytest.raises(ValueError, match=r"'user'.*'int3'"):
        q.encode(np.zeros([1, 2], F32), "int3", "user")
    with pytest.raises(ValueError, match=r"'user'.*row 1.*non-finite"):
        q.encode(np.array([[0.0, 1.0], [np.nan, 0.0]], F32), "int8", "user")
    for mode in ("int8", "int4", "float16"):
        with pytest.raises(ValueError, match=r"'user'.*row 0 holds -70000\.0"):
            q.encode(np.array([[-70000.0, 1.0]], F32), mode, "user")
    q.encode(np.array([[-70000.0, 1.0]], F32), "bfloat16", "user")  # bfloat16 holds it


def test_the_zero_row_encodes_exactly_in_every_mode():
    for mode in q.MODES:
        np.testing.assert_array_equal(q.decode_numpy(q.encode(np.zeros([1, 5], F32), mode), mode, 5), 0.0)


_EMB = tf.tpu.experimental.embedding


@pytest.mark.parametrize("mode", ["int8", "int4", "float16", "bfloat16"])
def test_lookups_and_combiners_equal_lookups_in_the_decoded_table(mode):
    """Every combiner, weights, sequences, sparse and dense, against the table decoded by the numpy reference
    decoder: bitwise in every mode (the lookup decodes the gathered rows, then combines them as the op does)."""
    rng = np.random.default_rng(7)
    weights = rng.normal(size=(9, 5)).astype(F32)
    served = ServedTable("t", weights, mode)
    decoded = tf.constant(q.decode_numpy(q.encode(weights, mode), mode, 5))
    ragged = tf.ragged.constant([[1, 1, 4], [], [8, 0, 2, 5]], dtype=tf.int64)
    w = tf.ragged.constant([[0.5, 1.0, 2.0], [], [1.0, 0.0, 3.0, 1.5]], dtype=tf.float32)
    cases = [
        (tf.constant([[3], [0], [8]], tf.int64), None, 0, True),
        (ragged, w, 0, False),
        (ragged.to_sparse(), w.to_sparse(), 0, False),
        (ragged, None, 2, False),
    ]
    for combiner in ("sum", "mean", "sqrtn"):
        for ids, wt, seq, dense in cases:
            fi = embedding_ops.normalize_feature(ids, wt, max_sequence_length=seq)
            got = te_keras.plain_lookup(fi, dense, served, 5, combiner).numpy()
            want = te_keras.plain_lookup(fi, dense, decoded, 5, combiner).numpy()
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
            assert np.any(got != 0)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_the_serving_forms_row_lookups_are_bitwise_the_decoded_rows(mode):
    weights = np.random.default_rng(8).normal(size=(40, 13)).astype(F32)
    served = ServedTable("t", weights, mode)
    ids = tf.constant([5, 0, 39, 5, 17], tf.int64)
    want = q.decode_numpy(q.encode(weights, mode), mode, 13)[ids.numpy()]
    np.testing.assert_array_equal(served.gather_rows(ids).numpy().view(np.uint32), want.view(np.uint32))
