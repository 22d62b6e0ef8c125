"""int8/int4 serving rows against FBGEMM itself: `FloatToFusedNBitRowwiseQuantizedSBHalf` (bit rate 8 and 4) on its
CPU build must write the bytes `tf_embed_ops.serving.quantization.encode` writes, and its
`FusedNBitRowwiseQuantizedSBHalfToFloat` must read them as our TensorFlow decoder does, bitwise.

FBGEMM needs PyTorch, which must not share an interpreter with TensorFlow: it runs in the benchmark peer's virtualenv
(``bash benchmarks/peers/setup_fbgemm.sh /opt/fbgemm-venv``, or ``TF_EMBED_OPS_FBGEMM_PYTHON``) through
tests/fbgemm_quantize_driver.py; without it the tests skip. FBGEMM's operator takes only rows whose packed width is
an even number of bytes (dims multiple of 2 for int8, 4 for int4): the odd widths we also accept are checked
against the reference in test_serving_quantization.py.
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from tests.serving_support import FBGEMM_PYTHON, fbgemm_available
from tf_embed_ops.serving import quantization as q

pytestmark = pytest.mark.slow  # starts a PyTorch interpreter per case

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fbgemm_quantize_driver.py")


@pytest.mark.skipif(not fbgemm_available(), reason=f"no FBGEMM interpreter at {FBGEMM_PYTHON}")
@pytest.mark.parametrize("mode, dim", [("int8", 2), ("int8", 8), ("int8", 64), ("int4", 4), ("int4", 12), ("int4", 64)])
def test_bytes_and_decoded_values_equal_fbgemms(tmp_path, mode, dim):
    rng = np.random.default_rng(dim)
    rows = (rng.normal(size=(300, dim)) * rng.lognormal(0, 2, size=(300, 1))).astype(np.float32)
    rows[0], rows[1] = 0.0, 0.1  # constant rows (0.1 is not a float16)
    rows[2, 0] = 3e4  # a wide row
    rows[3] = np.linspace(-1e-6, 1e-6, dim)  # the scale underflows float16
    rows[4] = np.round(rows[4] * 4) / 4  # values on a coarse grid (ties in the rounding)
    np.save(tmp_path / "in.npy", rows)
    bits = 8 if mode == "int8" else 4
    proc = subprocess.run(
        [FBGEMM_PYTHON, DRIVER, str(tmp_path / "in.npy"), str(bits), str(tmp_path / "fb")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    fbgemm_bytes = np.load(tmp_path / "fb.q.npy")
    fbgemm_values = np.load(tmp_path / "fb.d.npy")
    ours = q.encode(rows, mode, "t")
    assert ours.shape == fbgemm_bytes.shape
    mismatched = np.flatnonzero((ours != fbgemm_bytes).any(axis=1))
    assert mismatched.size == 0, f"rows {mismatched[:10]} differ"
    decoded = q.decode(tf.constant(fbgemm_bytes), mode, dim).numpy()
    np.testing.assert_array_equal(decoded.view(np.uint32), fbgemm_values.astype(np.float32).view(np.uint32))
