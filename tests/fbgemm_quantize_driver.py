"""Runs in FBGEMM's interpreter (torch + fbgemm-gpu-cpu; no TensorFlow): FBGEMM's own row-wise N-bit quantization
of the float32 rows in IN.npy, and its dequantization of those bytes, for tests/test_serving_quantization_fbgemm.py.

    python fbgemm_quantize_driver.py IN.npy BITS OUT_PREFIX   # writes OUT_PREFIX.q.npy, OUT_PREFIX.d.npy
"""

import sys

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import numpy as np
import torch

rows, bits, prefix = np.load(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
fused = torch.ops.fbgemm.FloatToFusedNBitRowwiseQuantizedSBHalf(torch.from_numpy(rows), bits)
np.save(prefix + ".q.npy", fused.numpy())
np.save(prefix + ".d.npy", torch.ops.fbgemm.FusedNBitRowwiseQuantizedSBHalfToFloat(fused, bits).numpy())
