"""The int8 / int4 error bound of docs/serving.md, checked numerically over rows of every magnitude.

The bound for a value of a row with minimum m and maximum M, L = 2^bits - 1 levels and s = (M - m) / L:

    |decode(encode(x)) - x| <= s/2 + 2^-11 (|m| + L s) + 2^-25 (L + 1)

s/2 is the rounding to the grid; 2^-11 (|m| + L s) is float16's relative rounding of the bias and of the scale
(times the L steps of the grid); 2^-25 (L + 1) is float16's absolute rounding below its normal range (2^-14), where
a tiny bias or scale underflows (a row of +-1e-38 stores bias -0 and decodes to zeros). The reference is float64
arithmetic on the rows themselves, the encoder and decoder are the library's numpy ones.
"""

import numpy as np
import pytest

from tf_embed_ops.serving import quantization


def _rows():
    rng = np.random.default_rng(0)
    parts = []
    for magnitude in 10.0 ** np.arange(-38, 5):
        for shift in (0.0, 1.0, -3.0, 1000.0):
            rows = rng.normal(size=(64, 7)) * magnitude + shift * magnitude * rng.normal()
            parts.append(np.clip(rows, -65000, 65000).astype(np.float32))
    # Spans whose scale falls in float16's subnormal range, and the rows of the report.
    for k in range(1, 2000, 7):
        parts.append(np.array([[0, k * 2.0**-24 * 2.55, 0.3 * k * 2.0**-24, 5e-6, 1e-9, 0, 1e-7]], np.float32))
        parts.append(np.array([[-k * 1e-9, k * 2.0**-24 * 0.225, 0.3 * k * 2.0**-24, 2e-6, 1e-9, 0, 1e-7]], np.float32))
    parts.append(np.array([[1e-38, -1e-38, 0, 1e-38, -1e-38, 1e-38, 0]], np.float32))
    return np.concatenate(parts)


def _error_and_bounds(rows, mode):
    levels = (1 << {"int8": 8, "int4": 4}[mode]) - 1
    decoded = quantization.decode_numpy(quantization.encode(rows, mode), mode, rows.shape[1])
    err = np.abs(decoded.astype(np.float64) - rows).max(axis=1)
    lo, hi = rows.min(axis=1).astype(np.float64), rows.max(axis=1).astype(np.float64)
    step = (hi - lo) / levels
    relative = step / 2 + 2.0**-11 * (np.abs(lo) + levels * step)
    return err, relative, relative + 2.0**-25 * (levels + 1)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_the_documented_bound_holds_for_rows_of_every_magnitude(mode):
    err, _, bound = _error_and_bounds(_rows(), mode)
    assert np.all(err <= bound), float((err / bound).max())
    assert (err / bound).max() > 0.5  # not vacuous: some row comes near it


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_without_float16s_absolute_term_tiny_rows_exceed_the_bound(mode):
    rows = np.array([[1e-38, -1e-38, 0, 1e-38]], np.float32)
    err, relative, bound = _error_and_bounds(rows, mode)
    assert err[0] == pytest.approx(1e-38) and err[0] > relative[0]  # the underflowed bias: the term is needed
    assert err[0] <= bound[0]
