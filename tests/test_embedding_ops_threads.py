"""Results are bitwise independent of the intra-op thread count and of the vector ISA the row loops run with
(each process fixes its own pool size; TF_EMBED_OPS_ISA=baseline turns the AVX2 copies of the loops off)."""

from __future__ import annotations

import pytest
from embedding_test_util import script_digest

_SCRIPT = r"""
import sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
sys.path.insert(0, sys.argv[2])
from embedding_test_util import make_config
from tf_embed_ops import embedding_ops as eo

rng = np.random.default_rng(7)
vocab, dim, n = 20000, 32, 30000  # large enough that every loop splits over 2 threads
out = []
quantization = {"quantization": (-0.5, 0.5, 255)}
for opt, extra in (({"name": "adagrad_momentum", "momentum": 0.9, "use_nesterov": True}, {}),
                   ({"name": "adam", "use_non_lazy_adam": True}, {}),
                   ({"name": "ftrl", "l1": 0.01, "multiply_linear_by_lr": True}, {}),
                   ({"name": "sgd", "gradient_clip": (-0.3, 0.3), "weight_clip": (-2.0, 2.0),
                     "weight_decay": 0.01}, quantization),
                   ({"name": "adagrad", "weight_decay": 0.02, "multiply_weight_decay_by_lr": True}, {}),
                   ({"name": "adam", "use_sum_inside_sqrt": False}, {})):
    config = make_config([{"name": "t", "vocab": vocab, "dim": dim, "opt": opt, "lr": 0.05, **extra}],
                         [("a", 0, [n]), ("b", 0, [n // 4])])
    table = tf.Variable(rng.normal(size=(vocab, dim)).astype(np.float32))
    num_slots = {"sgd": 0, "adagrad": 1}.get(opt["name"], 2)
    slots = [tf.Variable(rng.uniform(0.1, 1, size=(vocab, dim)).astype(np.float32)) for _ in range(num_slots)]
    for step in range(2):
        a = eo.normalize_feature(tf.constant(np.minimum(rng.zipf(1.1, n) - 1, vocab - 1), tf.int64))
        lengths = rng.integers(0, 8, n // 4)
        b = eo.normalize_feature(tf.RaggedTensor.from_row_lengths(
            tf.constant(rng.integers(0, vocab, lengths.sum()), tf.int64), lengths),
            tf.RaggedTensor.from_row_lengths(tf.constant(rng.normal(size=lengths.sum()), tf.float32), lengths))
        grads = [rng.normal(size=(n, dim)).astype(np.float32), rng.normal(size=(n // 4, dim)).astype(np.float32)]
        acts = eo.embedding_activations([a, b], [table], config, ["sqrtn"])
        out += [x.numpy().tobytes() for x in acts]
        eo.send_tpu_embedding_gradients(grads, [], [a, b], [table], [slots], config, ["sqrtn"])
    out += [v.numpy().tobytes() for v in [table, *slots]]
import hashlib
print(hashlib.sha256(b"".join(out)).hexdigest())
"""


def _digest(threads: int, isa: str | None = None) -> str:
    return script_digest(_SCRIPT, threads, isa)


@pytest.mark.slow
def test_one_and_two_threads_give_bitwise_identical_tables():
    assert _digest(1) == _digest(2)


@pytest.mark.slow
def test_baseline_and_avx2_row_loops_give_bitwise_identical_results():
    # On a CPU without AVX2 both runs take the baseline path and the test checks nothing more than determinism.
    assert _digest(2, isa="baseline") == _digest(2)
