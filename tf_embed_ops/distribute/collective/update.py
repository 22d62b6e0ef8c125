"""The backward half of a collective step: per-id gradient rows to the shards, one fused update per shard.

The single-process kernel sums a row's contributions `w_i / norm_s * dL/dact[s]` in a fixed order: by feature
(the table's features in input order), then by position in the feature (cc/lib/gradient_accumulation.h), from
zero, and applies the optimizer once to the sum. In the global batch (the workers' batches in worker order) a
feature's positions are worker 0's, then worker 1's, ...

Each worker therefore sends every id's contribution (the gradient of the row the lookup combined: the same float
product the kernel forms) with its local row and feature to the row's worker. The shard orders what it received
by feature, then sending worker, then position (a stable sort by feature of the workers' lists), and runs the
fused kernel on them as one feature of single-id samples with weight 1 and the "sum" combiner: it sums the same
products in the same order from zero, and the update of every row is the single-process step's, bit for bit.
Non-lazy optimizers (Adam without lazy updates) walk the whole shard each step, as one process walks the table.

Example:
    >>> apply_gradients(shards, pending, [tape.gradient(loss, p.rows) for p in pending])
"""

from __future__ import annotations

import tensorflow as tf

from tf_embed_ops import embedding_ops
from tf_embed_ops.distribute.collective import exchange as exchange_lib
from tf_embed_ops.distribute.collective import lookup as lookup_lib
from tf_embed_ops.distribute.collective.lookup import TableLookup
from tf_embed_ops.distribute.collective.shards import LayerShards

__all__ = ["apply_gradients"]


def apply_gradients(shards: LayerShards, pending: list[TableLookup], gradients: list) -> list:
    """Routes each table's per-id gradients (None: no gradient reached the table) and runs the shards' updates
    (one fused op for the static tables, one per dynamic table); returns the update ops (None entries eagerly)."""
    ex = shards.exchange
    n = ex.num_workers
    grads, inputs, updates = [], [], []
    for t, (table, p, g, trained) in enumerate(zip(shards.tables, pending, gradients, shards.trained, strict=True)):
        dynamic = shards.is_dynamic(t)
        if g is None:
            g = tf.zeros_like(p.rows)
        if isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        if not trained:  # frozen: nothing to send (every worker knows it)
            local, received = tf.zeros([0], tf.int64), tf.zeros([0, table.dim], tf.float32)
        else:
            r = exchange_lib.route(lookup_lib.owner(p.ids, n, dynamic), n)
            local = p.ids if dynamic else p.ids // n
            # (local row or key, feature); padding has feature -1 (a dynamic key may be negative).
            keys = exchange_lib.place(tf.stack([local, p.feature], axis=1), r, p.capacity, n, -1)
            values = exchange_lib.place(g, r, p.capacity, n, 0.0)
            keys = tf.reshape(ex.all_to_all(keys, p.capacity), [-1, 2])
            values = tf.reshape(ex.all_to_all(values, p.capacity), [-1, table.dim])
            valid = keys[:, 1] >= 0
            keys, values = tf.boolean_mask(keys, valid), tf.boolean_mask(values, valid)
            order = tf.argsort(keys[:, 1], stable=True)  # feature, then worker, then position
            local, received = tf.gather(keys[:, 0], order), tf.gather(values, order)
        feature = embedding_ops.FeatureInput(
            sample_indices_or_row_splits=tf.zeros([0], tf.int64),
            ids=local,
            weights=tf.zeros([0], tf.float32),
            sample_shape=tf.shape(local, out_type=tf.int64),
        )
        if dynamic:
            if trained:  # the shard's group: its fused update, then its step advances
                updates.append(shards.dynamic_group(t).send_gradients([received], [feature]))
        else:
            inputs.append(feature)
            grads.append(received)
    if shards.shard is not None:
        updates.append(shards.shard.send_gradients(grads, list(shards.shard.dynamic_learning_rates), inputs))
    return updates
