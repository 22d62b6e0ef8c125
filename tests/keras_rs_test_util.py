"""Shared pieces of the DistributedEmbedding tests: a small ranking model over the layer, its inputs in every
kind (dense ids, dense weighted bags, ragged, sparse), and the numpy reference of one `fit` step (from
tests/numpy_reference.py, which knows nothing of keras-rs or of our layer)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tests import numpy_reference as ref

B = 8
# name -> (table, input kind, declared max ids per sample or None for one id)
FEATURES = {
    "user": ("user", "dense1", None),
    "items": ("item", "ragged", 3),
    "clicked": ("item", "dense2", 4),
    "tags": ("tag", "sparse", 2),
}
TABLES = {"user": (16, 4, "sum"), "item": (24, 3, "mean"), "tag": (12, 2, "sqrtn")}


def table_optimizers() -> dict:
    """One of each kind the mapping takes: a Keras object, a string, a Keras object with options."""
    return {
        "user": keras.optimizers.Adam(0.05),
        "item": "adagrad",
        "tag": keras.optimizers.Ftrl(0.2, l1_regularization_strength=0.01, clipvalue=0.5),
    }


def configs(table_cls, feature_cls, optimizers=None, batch=B) -> dict:
    optimizers = optimizers or table_optimizers()
    tables = {
        name: table_cls(
            name=name,
            vocabulary_size=vocab,
            embedding_dim=dim,
            initializer=keras.initializers.RandomUniform(-1.0, 1.0, seed=i),
            optimizer=optimizers[name],
            combiner=combiner,
        )
        for i, (name, (vocab, dim, combiner)) in enumerate(TABLES.items())
    }
    out = {}
    for name, (table, _, max_ids) in FEATURES.items():
        shape = (batch,) if max_ids is None else (batch, max_ids)
        out[name] = feature_cls(
            name=name, table=tables[table], input_shape=shape, output_shape=(batch, TABLES[table][1])
        )
    return out


def inputs(seed=0, batch=B, overlong=True):
    """(inputs, weights, rows): rows[name] = (ids per sample, weights per sample) as the layer must read them
    (ragged/sparse rows truncated to the declared maximum). `overlong` puts rows longer than the maximum in."""
    rng = np.random.default_rng(seed)
    x, w, rows = {}, {}, {}
    for name, (table, kind, max_ids) in FEATURES.items():
        vocab = TABLES[table][0] - 2  # the last two rows of every table are never looked up
        if kind == "dense1":
            ids = rng.integers(vocab, size=batch)
            x[name], w[name] = tf.constant(ids, tf.int64), None
            rows[name] = ([[int(i)] for i in ids], None)
            continue
        if kind == "dense2":
            ids = rng.integers(vocab, size=(batch, max_ids))
            weights = rng.uniform(0.0, 2.0, size=(batch, max_ids)).astype(np.float32)
            x[name], w[name] = tf.constant(ids, tf.int64), tf.constant(weights)
            rows[name] = (ids.tolist(), weights.tolist())
            continue
        longest = max_ids + 2 if overlong else max_ids
        lists = [list(rng.integers(vocab, size=int(rng.integers(0, longest + 1)))) for _ in range(batch)]
        lists[0] = list(rng.integers(vocab, size=longest))  # at least one row at the longest length
        weights = [list(rng.uniform(0.5, 2.0, size=len(r)).astype(np.float32)) for r in lists]
        ragged = tf.ragged.constant(lists, dtype=tf.int64, row_splits_dtype=tf.int64)
        ragged_w = tf.ragged.constant(weights, dtype=tf.float32, row_splits_dtype=tf.int64)
        if kind == "ragged":
            x[name], w[name] = ragged, None
            rows[name] = ([r[:max_ids] for r in lists], None)
        else:
            x[name], w[name] = ragged.to_sparse(), ragged_w.to_sparse()
            rows[name] = ([r[:max_ids] for r in lists], [r[:max_ids] for r in weights])
    return x, w, rows


def keras_inputs() -> dict:
    return {
        "user": keras.Input(shape=(), dtype="int64", name="user"),
        "items": keras.Input(shape=(None,), dtype="int64", ragged=True, name="items"),
        "clicked": keras.Input(shape=(FEATURES["clicked"][2],), dtype="int64", name="clicked"),
        "tags": keras.Input(shape=(None,), dtype="int64", sparse=True, name="tags"),
    }


def keras_weight_inputs() -> dict:
    return {
        "user": None,
        "items": None,
        "clicked": keras.Input(shape=(FEATURES["clicked"][2],), dtype="float32", name="clicked_w"),
        "tags": keras.Input(shape=(None,), dtype="float32", sparse=True, name="tags_w"),
    }


def ranking_model(layer) -> keras.Model:
    """Embeddings -> concat (sorted feature order) -> one Dense unit; inputs are (ids, weights) dicts."""
    ids, weights = keras_inputs(), keras_weight_inputs()
    acts = layer(ids, weights)
    x = keras.layers.Concatenate()([acts[k] for k in sorted(acts)])
    out = keras.layers.Dense(1, name="head")(x)
    model_inputs = {**ids, **{f"{k}_w": v for k, v in weights.items() if v is not None}}
    return keras.Model(model_inputs, out)


def model_feed(x, w) -> dict:
    return {**x, **{f"{k}_w": v for k, v in w.items() if v is not None}}


def forward_reference(tables: dict, rows: dict) -> dict:
    """{feature: [B, dim] float64} from the numpy reference."""
    out = {}
    for name, (table, _, _) in FEATURES.items():
        ids, weights = rows[name]
        entries, shape = ref.entries_from_rows(ids, weights)
        out[name] = ref.forward(tables[table], entries, shape, TABLES[table][2])
    return out


def fit_step_reference(tables, slots, tpu_optimizers, rows, head_w, y, learning_rates=None):
    """One `fit` step of `ranking_model` with a frozen head and mse: new ({table: values}, {table: slots})."""
    acts = forward_reference(tables, rows)
    names = sorted(FEATURES)
    x = np.concatenate([acts[k] for k in names], axis=1)
    dx = (2.0 / len(y) * (x @ head_w - y)) @ head_w.T
    dacts, start = {}, 0
    for k in names:
        dim = acts[k].shape[1]
        dacts[k], start = dx[:, start : start + dim], start + dim
    new_tables, new_slots = {}, {}
    for table, (vocab, _, combiner) in TABLES.items():
        parts = []
        for name, (t, _, _) in FEATURES.items():
            if t == table:
                entries, _ = ref.entries_from_rows(*rows[name])
                parts.append((entries, combiner, dacts[name]))
        opt = tpu_optimizers[table]
        lr = (learning_rates or {}).get(table, opt.learning_rate)
        grads = ref.row_gradients(parts, vocab)
        new_tables[table], new_slots[table] = ref.apply_step(
            ref.spec_from_optimizer(opt), lr, tables[table], slots[table], grads
        )
    return new_tables, new_slots


def tables(layer) -> dict:
    return {t.name: v.numpy().copy() for t, v in layer.embedding_tables.items()}


def slots(layer) -> dict:
    return {t.name: [v.numpy().copy() for v in s.values()] for t, s in layer.slot_variables.items()}


def check_one_fit_step(layer) -> None:
    """One `model.fit` step of `ranking_model(layer)` (frozen head, mse, the model's Adam) moves every table and
    slot as the numpy reference of its own table optimizer says, and the model's optimizer holds no table."""
    model = ranking_model(layer)
    head = model.get_layer("head")
    head_w = np.linspace(-1.0, 1.0, 12).reshape(12, 1).astype(np.float32)
    head.set_weights([head_w, np.zeros(1, np.float32)])
    head.trainable = False  # a fixed head makes dL/dact a closed form for the reference
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x, w, rows = inputs(seed=2)
    y = np.random.default_rng(3).normal(size=(B, 1))
    tpu_opts = {t.name: t.optimizer for t in layer.embedding_tables}
    before_tables, before_slots = tables(layer), slots(layer)
    expected_tables, expected_slots = fit_step_reference(
        before_tables, before_slots, tpu_opts, rows, head_w.astype(np.float64), y
    )

    model.fit(model_feed(x, w), tf.constant(y, tf.float32), batch_size=B, epochs=1, verbose=0, shuffle=False)

    after_tables, after_slots = tables(layer), slots(layer)
    for name in TABLES:
        np.testing.assert_allclose(after_tables[name], expected_tables[name], rtol=2e-5, atol=2e-6, err_msg=name)
        np.testing.assert_array_equal(after_tables[name][-2:], before_tables[name][-2:])  # never looked up
        assert not np.array_equal(after_tables[name], before_tables[name]), name
        for got, want in zip(after_slots[name], expected_slots[name], strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=name)
    # The model's Adam has slots for the update trigger (a scalar) and the head only, none table-sized.
    assert all(int(np.prod(v.shape)) < 16 for v in model.optimizer.variables)
