"""Row encodings of a served table: numpy encoders (at export) and stock-TensorFlow decoders (in the serving graph).

Modes (`MODES`):

- ``None``: float32 rows, as trained.
- ``"float16"`` / ``"bfloat16"``: each value rounded to nearest (ties to even) in the 16-bit type.
- ``"int8"`` / ``"int4"``: row-wise asymmetric quantization in FBGEMM's fused row-wise layout with 16-bit scale and
  bias (`FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf`, bit rate 8 or 4). One uint8 row per table row:

      | packed codes: ceil(dim * bits / 8) bytes | scale: float16 | bias: float16 |   (little-endian)

  with the reference arithmetic of that function, in float32: ``bias = fp16(min(row))``;
  ``scale = fp16((max(row) - bias) / (2**bits - 1))`` (1 when the row is constant or the scale's reciprocal
  overflows); ``code = clip(rint((x - bias) * (1 / scale)), 0, 2**bits - 1)`` with ties to even (``lrintf``).
  int4 packs two codes per byte, element ``j`` in byte ``j // 2`` at bit ``4 * (j % 2)`` (low nibble first). An
  odd ``dim`` is padded with one zero code in the last byte's high nibble (FBGEMM's reference encoder does the
  same; its vectorised one refuses odd widths); the decoder drops it.
  Decoding is ``float32(code) * float32(scale) + float32(bias)``, two float32 roundings, as FBGEMM's reference
  decoder writes it.

`decode` applies to gathered rows, elementwise per row, so a lookup that gathers and then decodes produces bitwise
what decoding the whole table first and then gathering produces (the serving lookup does, then combines the rows
as the training-side op does). `decode_parts` returns the codes, scales and biases of int8/int4 rows.

`encode` refuses non-finite values and values a 16-bit scale or bias cannot hold (magnitudes above float16's
65504), naming the table and the row.

The encoders are plain numpy so that anything that writes rows for a servable (a full export, an online delta)
encodes them identically; `decode_numpy` is the reference decoder the tests compare against.

Example:
    >>> data = encode(np.array([[0.0, 0.5, 1.0]], np.float32), "int8", "user")
    >>> data.dtype, data.shape          # 3 codes + 4 bytes of scale and bias
    (dtype('uint8'), (1, 7))
    >>> decode(tf.constant(data), "int8", 3).numpy()
    array([[0.        , 0.49999997, 1.        ]], dtype=float32)
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = [
    "MODES",
    "bits",
    "check_mode",
    "decode",
    "decode_numpy",
    "decode_parts",
    "encode",
    "encoded_width",
    "is_rowwise",
    "row_bytes",
    "storage_dtype",
]

MODES = (None, "int8", "int4", "float16", "bfloat16")
_BITS = {"int8": 8, "int4": 4}
_FP16_MAX = 65504.0


def check_mode(mode: Any, table_name: str) -> str | None:
    """`mode` if it is one of `MODES`.

    Raises:
      ValueError: naming the table and the value otherwise.
    """
    if mode is not None and (not isinstance(mode, str) or mode not in MODES):
        raise ValueError(
            f"quantization for table {table_name!r}: unknown mode {mode!r}; choose one of "
            f"{', '.join(repr(m) for m in MODES)}"
        )
    return mode


def bits(mode: str | None) -> int:
    """Bits per stored value: 32, 16, 8 or 4."""
    return _BITS.get(mode, 16 if mode in ("float16", "bfloat16") else 32)


def encoded_width(mode: str | None, dim: int) -> int:
    """Columns of an encoded row: `dim` for float modes, code bytes + 4 (scale, bias) for int8/int4."""
    if mode in _BITS:
        per_byte = 8 // _BITS[mode]
        return (dim + per_byte - 1) // per_byte + 4
    return dim


def row_bytes(mode: str | None, dim: int) -> int:
    """Bytes one encoded row takes."""
    if mode in _BITS:
        return encoded_width(mode, dim)
    return dim * bits(mode) // 8


def storage_dtype(mode: str | None) -> np.dtype:
    """The numpy dtype of encoded rows."""
    if mode in _BITS:
        return np.dtype(np.uint8)
    if mode == "float16":
        return np.dtype(np.float16)
    if mode == "bfloat16":
        import ml_dtypes  # pylint: disable=import-outside-toplevel  (TensorFlow's own dependency)

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(np.float32)


def _check_values(weights: np.ndarray, mode: str | None, table_name: str) -> None:
    finite = np.isfinite(weights)
    if not finite.all():
        row = int(np.argwhere(~finite)[0][0])
        raise ValueError(f"table {table_name!r}: row {row} holds a non-finite value; it cannot be quantized ({mode})")
    if mode in ("float16", "int8", "int4") and weights.size:
        big = np.abs(weights) > _FP16_MAX
        if big.any():
            row, col = (int(i) for i in np.argwhere(big)[0])
            raise ValueError(
                f"table {table_name!r}: row {row} holds {float(weights[row, col])!r}, beyond float16's range "
                f"(|x| <= {_FP16_MAX}) in which {mode} stores values (or the row's scale and bias)"
            )


def encode(weights: Any, mode: str | None, table_name: str = "table") -> np.ndarray:
    """Encodes float32 rows [n, dim] in `mode` (see the module docstring).

    Args:
      weights: [n, dim] rows (any float dtype; read as float32).
      mode: one of `MODES`.
      table_name: for error messages.

    Returns:
      The encoded rows: uint8 [n, encoded_width] for int8/int4, float16/bfloat16/float32 [n, dim] otherwise.

    Raises:
      ValueError: an unknown mode, rows that are not rank 2, non-finite values, or values beyond float16's range
        for float16/int8/int4 (naming the table and the row).
    """
    check_mode(mode, table_name)
    weights = np.asarray(weights, np.float32)
    if weights.ndim != 2:
        raise ValueError(f"table {table_name!r}: rows must be [n, dim]; got shape {weights.shape}")
    _check_values(weights, mode, table_name)
    if mode is None:
        return weights.copy()
    if mode in ("float16", "bfloat16"):
        return weights.astype(storage_dtype(mode))
    return _encode_rowwise(weights, _BITS[mode])


def _encode_rowwise(weights: np.ndarray, nbits: int) -> np.ndarray:
    n, dim = weights.shape
    levels = (1 << nbits) - 1
    if dim == 0:
        lo = hi = np.zeros([n], np.float32)
    else:
        lo, hi = weights.min(axis=1), weights.max(axis=1)
    bias16 = lo.astype(np.float16)
    bias = bias16.astype(np.float32)
    span = hi - bias  # float32, as the reference: maximum_element - minimum_element(fp16-rounded)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        scale = np.where(span == 0, np.float32(1.0), span / np.float32(levels)).astype(np.float32)
        scale = scale.astype(np.float16).astype(np.float32)
        scale = np.where(scale == 0, np.float32(1.0), scale)
        inverse = (np.float32(1.0) / scale).astype(np.float32)
        overflow = np.isinf(inverse)
        scale = np.where(overflow, np.float32(1.0), scale)
        inverse = np.where(overflow, np.float32(1.0), inverse)
    shifted = (weights - bias[:, None]).astype(np.float32) * inverse[:, None]
    codes = np.clip(np.rint(shifted.astype(np.float32)), 0, levels).astype(np.uint8)
    if nbits == 4:
        if dim % 2:
            codes = np.concatenate([codes, np.zeros([n, 1], np.uint8)], axis=1)
        codes = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    scale_bias = np.stack([scale.astype(np.float16), bias16], axis=1).astype("<f2")
    return np.ascontiguousarray(np.concatenate([codes, scale_bias.view(np.uint8).reshape(n, 4)], axis=1))


def _split_numpy(data: np.ndarray, mode: str, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    nbytes = encoded_width(mode, dim) - 4
    codes = data[..., :nbytes]
    if mode == "int4":
        codes = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(codes.shape[:-1] + (2 * nbytes,))[..., :dim]
    scale_bias = np.ascontiguousarray(data[..., nbytes:]).view("<f2").astype(np.float32)
    return codes, scale_bias[..., 0:1], scale_bias[..., 1:2]


def decode_numpy(data: Any, mode: str | None, dim: int) -> np.ndarray:
    """Reference decoder: float32 rows [..., dim] from encoded rows (numpy, independent of TensorFlow)."""
    data = np.asarray(data)
    if mode in _BITS:
        codes, scale, bias = _split_numpy(data, mode, dim)
        return codes.astype(np.float32) * scale + bias
    return data.astype(np.float32)


def _unpack_nibbles(tf: Any, packed: Any, nbytes: int) -> Any:
    """uint8 [..., nbytes] of two codes per byte (low nibble first) -> uint8 [..., 2 * padded nbytes], in order.

    Word-wise rather than byte-wise: four bytes read as one little-endian uint32 hold codes 0..7 in nibbles 0..7;
    widened to uint64, three shift-or-mask steps move nibble k to byte k (the bit-interleaving "spread"), and the
    uint64 read back as 8 bytes is the codes in order. This costs a few operations on [..., nbytes / 4] words
    where splitting every byte and interleaving the halves (a stack on a 1-byte last axis) costs about twice the
    time of the whole int8 decode. A row whose byte count is not a multiple of 4 is padded with zero bytes.
    """
    pad = (-nbytes) % 4
    if pad:
        packed = tf.pad(packed, [[0, 0]] * (packed.shape.rank - 1) + [[0, pad]])
    words = (nbytes + pad) // 4
    outer = tf.shape(packed)[:-1]
    x = tf.cast(tf.bitcast(tf.reshape(packed, tf.concat([outer, [words, 4]], 0)), tf.uint32), tf.uint64)
    for shift, mask in ((16, 0x0000FFFF0000FFFF), (8, 0x00FF00FF00FF00FF), (4, 0x0F0F0F0F0F0F0F0F)):
        spread = tf.bitwise.bitwise_or(x, tf.bitwise.left_shift(x, tf.constant(shift, tf.uint64)))
        x = tf.bitwise.bitwise_and(spread, tf.constant(mask, tf.uint64))
    return tf.reshape(tf.bitcast(x, tf.uint8), tf.concat([outer, [8 * words]], 0))


def is_rowwise(mode: str | None) -> bool:
    """True for the row-wise integer modes (int8, int4), whose rows decode as code * scale + bias."""
    return mode in _BITS


def decode_parts(rows: Any, mode: str, dim: int) -> tuple[Any, Any, Any]:
    """The parts of gathered int8/int4 rows: (codes as float32 [..., dim], scale [...], bias [...]), float32.

    `decode` is ``codes * scale[..., None] + bias[..., None]`` (two float32 roundings, as `decode_numpy`).
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if mode not in _BITS:
        raise ValueError(f"decode_parts: {mode!r} is not a row-wise integer mode")
    if sys.byteorder != "little":  # the scale and bias bytes are little-endian; tf.bitcast reads host order
        raise NotImplementedError("int8/int4 serving tables need a little-endian host")
    nbytes = encoded_width(mode, dim) - 4
    codes = rows[..., :nbytes]
    if mode == "int4":
        codes = _unpack_nibbles(tf, codes, nbytes)[..., :dim]
    tail = tf.reshape(rows[..., nbytes:], tf.concat([tf.shape(rows)[:-1], [2, 2]], axis=0))
    scale_bias = tf.cast(tf.bitcast(tail, tf.float16), tf.float32)  # [..., 2]: scale, bias
    return tf.cast(codes, tf.float32), scale_bias[..., 0], scale_bias[..., 1]


def decode(rows: Any, mode: str | None, dim: int) -> Any:
    """Float32 rows [..., dim] from gathered encoded rows, with stock TensorFlow ops only.

    Args:
      rows: encoded rows [..., encoded_width(mode, dim)] (a tensor of `storage_dtype(mode)`).
      mode: one of `MODES`.
      dim: the table's dimension.

    Returns:
      A float32 tensor [..., dim].
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if mode not in _BITS:
        return tf.cast(rows, tf.float32)
    codes, scale, bias = decode_parts(rows, mode, dim)
    return codes * scale[..., None] + bias[..., None]
