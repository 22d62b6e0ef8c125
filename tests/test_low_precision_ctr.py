"""The CTR example with bfloat16 tables and slots reaches the float32 run's test AUC (within 0.002)."""

from __future__ import annotations

import argparse

import pytest

from tf_embed_ops.examples import ctr


def _args(storage_dtype: str) -> argparse.Namespace:
    return argparse.Namespace(
        smoke=False,
        config=None,
        train_size=40000,
        test_size=10000,
        epochs=3,
        batch_size=256,
        learning_rate=0.003,
        quiet=True,
        storage_dtype=storage_dtype,
    )


@pytest.mark.slow
def test_bfloat16_tables_reach_the_float32_test_auc():
    # ctr.run seeds Keras (and so the model and the data order) itself; the rounding bits are keyed by the step.
    fp32 = ctr.run(_args("float32"))["tpu_embedding"]["test_auc"]
    bf16 = ctr.run(_args("bfloat16"))["tpu_embedding"]["test_auc"]
    assert fp32 > 0.75  # the run learned the planted structure
    assert abs(bf16 - fp32) <= 0.002, (bf16, fp32)
