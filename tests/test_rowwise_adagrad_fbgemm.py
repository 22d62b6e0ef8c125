"""RowWiseAdagrad against FBGEMM itself: SplitTableBatchedEmbeddingBagsCodegen with EXACT_ROWWISE_ADAGRAD on its CPU
kernel, on identical weights, ids and gradients, through tf_embed_ops' fused backward op.

FBGEMM needs PyTorch, which must not share an interpreter with TensorFlow, so it runs in the benchmark peer's
virtualenv (``bash benchmarks/peers/setup_fbgemm.sh /opt/fbgemm-venv``; another path through
``TF_EMBED_OPS_FBGEMM_PYTHON``) via tests/fbgemm_rowwise_driver.py.  Without that interpreter the tests skip.

Tolerance: float32 rounding only.  Both sum a row's gradient contributions in float32 in their own order and
FBGEMM's fp32 kernel reduces the squared gradient over 8 lanes as ours does; a few ulp of difference remain, so
the comparison is rtol 1e-5 after three steps (a formula difference, e.g. epsilon inside the square root, or the
sum instead of the mean, is orders of magnitude larger; test_the_comparison_can_fail shows a small change fails).
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

import tf_embed_ops.optimizers as teo
from tests import rowwise_adagrad_support as support
from tests.serving_support import FBGEMM_PYTHON, fbgemm_available

pytestmark = pytest.mark.slow  # starts a PyTorch interpreter per case

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fbgemm_rowwise_driver.py")
LR, EPS = 0.1, 1e-8


requires_fbgemm = pytest.mark.skipif(
    not fbgemm_available(),
    reason=f"no FBGEMM interpreter at {FBGEMM_PYTHON} (create it with `bash benchmarks/peers/setup_fbgemm.sh "
    "/opt/fbgemm-venv`, or point TF_EMBED_OPS_FBGEMM_PYTHON at one with torch and fbgemm-gpu-cpu)",
)


def _run_fbgemm(tmp_path, steps: support.Steps, mode: str, weight_decay: float, momentum0: float):
    np.save(tmp_path / "w0.npy", steps.w0)
    for s, step in enumerate(steps.batches):
        for f, (ids, offsets, grad) in enumerate(step):
            np.save(tmp_path / f"ids_{s}_{f}.npy", ids)
            np.save(tmp_path / f"off_{s}_{f}.npy", offsets)
            np.save(tmp_path / f"grad_{s}_{f}.npy", grad)
    job = dict(
        rows=steps.rows,
        dim=steps.dim,
        num_features=len(steps.batches[0]),
        learning_rate=LR,
        eps=EPS,
        weight_decay=weight_decay,
        weight_decay_mode=mode,
        steps=len(steps.batches),
        momentum0=momentum0,
    )
    (tmp_path / "job.json").write_text(json.dumps(job))
    done = subprocess.run(
        [FBGEMM_PYTHON, DRIVER, str(tmp_path)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(tmp_path / "w.npy"), np.load(tmp_path / "momentum1.npy")


# (FBGEMM's WeightDecayMode, weight_decay, number of features on the table).  One feature per table takes FBGEMM's
# fp32 fast path (fbgemm::GenerateSparseAdaGrad), two take its generic CPU loop, which is also the only CPU path
# that applies weight decay: FBGEMM 1.8.0's fast path passes weight_decay=0 (embedding_backward_split_cpu_template
# .cpp), so with one feature per table FBGEMM ignores weight_decay; that is FBGEMM's gap, not a semantics to copy
# (docs/optimizers.md, "RowWiseAdagrad").
CASES = [
    ("NONE", 0.0, 1),
    ("NONE", 0.0, 2),
    ("L2", 0.05, 2),
    ("DECOUPLE", 0.05, 2),
]


@requires_fbgemm
@pytest.mark.parametrize("mode, weight_decay, num_features", CASES, ids=[f"{m}-{f}features" for m, _, f in CASES])
def test_matches_fbgemm_exact_rowwise_adagrad(tmp_path, mode, weight_decay, num_features):
    steps = support.make_steps(num_features=num_features, seed=num_features)
    momentum0 = 0.0
    fb_w, fb_m = _run_fbgemm(tmp_path, steps, mode, weight_decay, momentum0)
    optimizer = teo.RowWiseAdagrad(
        learning_rate=LR, epsilon=EPS, weight_decay=weight_decay, decoupled_weight_decay=mode == "DECOUPLE"
    )
    w, acc = support.run_ours(steps, optimizer, initial_accumulator=momentum0)
    touched = sorted({r for step in steps.batches for r in support.row_gradients(step)})
    assert len(touched) > 10
    np.testing.assert_allclose(acc[:, 0], fb_m, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(w, fb_w, rtol=1e-5, atol=1e-6)
    # Untouched rows: bitwise unchanged on both sides.
    untouched = [r for r in range(steps.rows) if r not in touched]
    np.testing.assert_array_equal(w[untouched], steps.w0[untouched])
    np.testing.assert_array_equal(fb_w[untouched], steps.w0[untouched])


@requires_fbgemm
def test_the_comparison_can_fail(tmp_path):
    # The same steps with epsilon 1e-2 instead of FBGEMM's 1e-8 (a change of the step by about 1e-2 relative where
    # the accumulator is ~1) are far outside the tolerance above: the comparison can fail.
    steps = support.make_steps(num_features=1, seed=7)
    fb_w, _ = _run_fbgemm(tmp_path, steps, "NONE", 0.0, 0.0)
    w, _ = support.run_ours(steps, teo.RowWiseAdagrad(learning_rate=LR, epsilon=1e-2))
    assert not np.allclose(w, fb_w, rtol=1e-5, atol=1e-6)
