"""What the tests of touched-row tracking (test_tracking.py) and of incremental checkpoints, which are built on it
(test_incremental_checkpoint.py), both run: two tables' sizes and every optimizer family (Adam lazy and not, whose
non-lazy form touches every row)."""

import tensorflow as tf

import tf_embed_ops as te

_emb = tf.tpu.experimental.embedding

VA, VB, DIM = 40, 30, 4

OPTIMIZERS = {
    "sgd": lambda: _emb.SGD(0.1),
    "adagrad": lambda: _emb.Adagrad(0.1),
    "adagrad_momentum": lambda: _emb.AdagradMomentum(0.1, momentum=0.9),
    "lazy_adam": lambda: _emb.Adam(0.1, lazy_adam=True),
    "adam": lambda: _emb.Adam(0.1, lazy_adam=False),
    "ftrl": lambda: _emb.FTRL(0.1),
    "rowwise_adagrad": lambda: te.optimizers.RowWiseAdagrad(0.1),
}
