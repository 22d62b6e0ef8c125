"""A dynamic table holding keys 0..V-1 with a static table's initial rows trains BITWISE like the static table.

Reference: the static ops (TfEmbed>EmbeddingActivations / SendTPUEmbeddingGradients, themselves tested against
numpy and TensorFlow's kernels) on tf.Variables.  For every optimizer of the catalogue (iterated from its
schema), its bool hyper-parameters flipped, and clipping / weight decay / dynamic learning rate variants, several
steps of dense, ragged (weighted) and sparse features sharing the table must give bitwise the same activations,
rows and slots, key by key.  The keys are imported in shuffled order, so row indices differ from keys.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from dynamic_ops_test_util import (
    import_rows,
    int_feature,
    make_config,
    new_table,
    optimizer_cases,
    schema,
    slot_defaults,
    slot_widths,
    uses_dynamic_lr,
)

from tf_embed_ops import embedding_ops
from tf_embed_ops.dynamic import ops as dyn

VOCAB, DIM = 12, 4


def _steps(rng, num_steps, kinds):
    """Per step, per feature kind: (rows, weights or None) with keys in [0, VOCAB), duplicates included."""
    steps = []
    for _ in range(num_steps):
        step = []
        for kind in kinds:
            if kind == "dense":
                rows = [[int(rng.integers(0, VOCAB))] for _ in range(5)]
                step.append((kind, rows, None))
            else:
                rows = [list(rng.integers(0, VOCAB, int(rng.integers(0, 4)))) for _ in range(4)]
                weighted = kind in ("ragged", "ragged_sequence")
                weights = [list(rng.uniform(0.2, 2.0, len(r))) for r in rows] if weighted else None
                step.append((kind, rows, weights))
        steps.append(step)
    return steps


def _train_both(tables, feature_tables, steps, combiners, learning_rates, seed=0):
    """Runs the same steps through static and dynamic tables; asserts bitwise equality after every step.

    tables: per table (schema, overrides, options).  feature_tables: table id of each feature.
    """
    rng = np.random.default_rng(seed)
    table_dicts = [
        {"name": f"t{t}", "vocab": VOCAB, "dim": DIM, "schema": s, "overrides": o, "options": opts, "lr": 0.05}
        for t, (s, o, opts) in enumerate(tables)
    ]
    features = [(f"f{i}", t) for i, t in enumerate(feature_tables)]
    static_config = make_config(table_dicts, features)
    dynamic_config = make_config([dict(d, vocab=1000) for d in table_dicts], features)

    static_vars, static_slots, handles = [], [], []
    for s, _, _ in tables:
        w0 = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
        slots0 = [np.full(slot.shape(VOCAB, DIM), slot.default_initial_value, np.float32) for slot in s.slots]
        static_vars.append(tf.Variable(w0))
        static_slots.append([tf.Variable(v) for v in slots0])
        h = new_table(DIM, slot_defaults(s), max_rows=1000, slot_widths=slot_widths(s, DIM))
        order = rng.permutation(VOCAB)
        import_rows(h, order, w0[order], [v[order] for v in slots0])
        handles.append(h)

    for step_number, step in enumerate(steps):
        feats = [int_feature(kind, rows, weights) for kind, rows, weights in step]
        lrs = [learning_rates[step_number]] if learning_rates else []
        static_acts = embedding_ops.embedding_activations(feats, static_vars, static_config, combiners)
        dynamic_acts = dyn.dynamic_embedding_activations(
            feats, handles, step_number, dynamic_config, combiners, training=True
        )
        for a, b in zip(static_acts, dynamic_acts, strict=True):
            np.testing.assert_array_equal(b.numpy(), a.numpy())
        grads = [rng.normal(size=a.shape).astype(np.float32) for a in static_acts]
        embedding_ops.send_tpu_embedding_gradients(
            grads, lrs, feats, static_vars, static_slots, static_config, combiners
        )
        dyn.dynamic_send_tpu_embedding_gradients(grads, lrs, feats, handles, step_number, dynamic_config, combiners)
        for t, h in enumerate(handles):
            c = dyn.dynamic_table_export(h, len(static_slots[t]))
            np.testing.assert_array_equal(c.keys.numpy(), np.arange(VOCAB))
            np.testing.assert_array_equal(c.weights.numpy(), static_vars[t].numpy(), err_msg=f"table {t} weights")
            for k, slot in enumerate(static_slots[t]):
                np.testing.assert_array_equal(c.slots[k].numpy(), slot.numpy(), err_msg=f"table {t} slot {k}")


@pytest.mark.parametrize(
    "case_id,optimizer,overrides,options", optimizer_cases(), ids=[c[0] for c in optimizer_cases()]
)
def test_every_optimizer_trains_bitwise_like_the_static_table(case_id, optimizer, overrides, options):
    rng = np.random.default_rng(len(case_id))
    steps = _steps(rng, 3, ["dense", "ragged", "sparse"])
    # Positive, changing rates (the frequency estimator's dynamic rate is the step count).
    rates = [1.0, 2.0, 3.0] if uses_dynamic_lr(optimizer, options) else []
    _train_both([(optimizer, overrides, options)], [0, 0, 0], steps, ["mean"], rates)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("kind", ["dense", "ragged", "ragged_sequence", "sparse"])
@pytest.mark.parametrize("kind_of_optimizer", ["adagrad", "adam"])
def test_every_input_form_and_combiner(combiner, kind, kind_of_optimizer):
    rng = np.random.default_rng(3)
    steps = _steps(rng, 3, [kind, kind])
    _train_both([(schema(kind_of_optimizer), {}, {})], [0, 0], steps, [combiner], [])


def test_two_tables_with_per_feature_combiners_and_non_lazy_adam():
    rng = np.random.default_rng(5)
    steps = _steps(rng, 3, ["ragged", "sparse", "dense"])
    tables = [
        (schema("adam"), {"lazy_adam": False}, {}),
        (schema("ftrl"), {}, {"gradient_clip": (-0.2, 0.25), "weight_decay": 0.01}),
    ]
    _train_both(tables, [0, 1, 0], steps, ["sqrtn", "mean", "sum"], [])
