"""The CTR example's serving exports (tf_embed_ops/examples/ctr_serving.py): float32, int8, int4 and pruned exports of
one trained model, each evaluated from its SavedModel; int8 keeps the test AUC within 0.001 (slow tier)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from tf_embed_ops.examples import ctr, ctr_serving


def test_auc_matches_the_pairwise_definition():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 200).astype(np.float32)
    scores = np.round(rng.normal(size=200) + labels, 1)  # rounded: many ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairwise = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (
        pos.size * neg.size
    )
    assert ctr_serving.auc(labels, scores) == pytest.approx(pairwise, abs=1e-12)


@pytest.mark.slow
def test_exports_keep_the_auc_and_shrink():
    args = argparse.Namespace(smoke=True, learning_rate=0.003, batch_size=256, quiet=True)
    results = ctr_serving.run(args)
    assert set(results) == {"float32", "int8", "int4", "pruned"}
    base = results["float32"]["test_auc"]
    assert 0.5 < base < 1.0
    assert abs(results["int8"]["test_auc"] - base) <= 0.001
    assert abs(results["int4"]["test_auc"] - base) <= 0.02
    # The tables shrink in order; at this example's dim 8 the SavedModel's graph (the decoding ops) is a large
    # part of the whole, so compare whole SavedModels with float32 only.
    tables = {k: sum(t["bytes"] for t in r["tables"].values()) for k, r in results.items()}
    assert tables["int4"] < tables["int8"] < tables["pruned"] < tables["float32"]
    assert all(
        r["saved_model_bytes"] < results["float32"]["saved_model_bytes"] for k, r in results.items() if k != "float32"
    )
    user = results["pruned"]["tables"]["user"]
    assert user["rows_exported"] == ctr.SIZES["user"] // 2 and user["prune"] == {"max_rows": 1500, "score": "l2_norm"}
