"""tf_embed_ops.keras.TPUEmbedding inside real Keras 3 training: fit updates only touched rows with the table
optimizers (checked against the numpy engine), evaluate/predict do not, save/load and checkpoints round-trip."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.keras_test_util import VOCAB, _data, _dataset, _model, emb_api
from tests.numpy_reference import RefFeature, RefTable
from tests.numpy_reference import ref_activations as activations
from tests.numpy_reference import ref_row_gradients as row_gradients
from tf_embed_ops import keras as te_keras


def test_output_shapes_and_sequence_layout():
    _, layer = _model()
    x, _, _ = _data(5)
    out = layer(x)
    assert out["user"].shape == (5, 4) and out["items"].shape == (5, 4) and out["history"].shape == (5, 3, 4)


def test_fit_updates_only_touched_rows_with_the_table_optimizers_exactly():
    """One fit step with a frozen head: the table update must equal the numpy engine's, to float32 precision."""
    model, layer = _model()
    head = model.get_layer("head")
    head.set_weights([np.linspace(-1, 1, 4 * 2 + 4 * 3).reshape(-1, 1).astype(np.float32), np.zeros(1, np.float32)])
    head.trainable = False  # a fixed head makes dL/dact a closed form for the reference
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x, y, (user, items, history) = _data(8)
    fc = layer.feature_config
    tables = {t.name: t for t in layer.embedding_tables}
    refs = {name: RefTable(layer.embedding_tables[t].numpy(), t.optimizer) for name, t in tables.items()}
    untouched_before = {name: layer.embedding_tables[t].numpy()[VOCAB - 2 :].copy() for name, t in tables.items()}

    # Reference: forward, loss = mean((xW - y)^2), dact = 2/B (pred - y) W_slice.
    feats = {
        "user": RefFeature("user", [[int(u)] for u in user]),
        "items": RefFeature("item", [[int(i) for i in r] for r in items]),
        "history": RefFeature("item", [[int(i) for i in r] for r in history], max_sequence_length=3),
    }
    acts = {k: activations(f, refs[f.table].params, fc[k].table.combiner) for k, f in feats.items()}
    xcat = np.concatenate([acts["user"], acts["items"], acts["history"].reshape(8, -1)], axis=1)
    w = head.get_weights()[0].astype(np.float64)
    dpred = 2.0 / 8 * (xcat @ w - y.numpy())
    dx = dpred @ w.T
    dacts = {"user": dx[:, :4], "items": dx[:, 4:8], "history": dx[:, 8:].reshape(8, 3, 4)}
    grads = {"user": {}, "item": {}}
    for k, f in feats.items():
        row_gradients(f, dacts[k], fc[k].table.combiner, grads[f.table])
    for name, ref in refs.items():
        ref.apply(grads[name], ref.opt.learning_rate)

    history_cb = model.fit(_dataset(x, y, 8), epochs=1, verbose=0)
    assert len(history_cb.history["loss"]) == 1
    for name, t in tables.items():
        after = layer.embedding_tables[t].numpy()
        np.testing.assert_allclose(after, refs[name].params, rtol=2e-5, atol=2e-6, err_msg=name)
        np.testing.assert_array_equal(after[VOCAB - 2 :], untouched_before[name])  # never-seen rows unchanged
        for slot, var in layer.slot_variables[t].items():
            np.testing.assert_allclose(var.numpy(), refs[name].slots[slot], rtol=2e-5, atol=2e-6)


def test_fit_reduces_loss_keras_optimizer_never_touches_tables_and_evaluate_predict_do_not_train():
    model, layer = _model()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    assert all("user" not in v.path and "item" not in v.path for v in model.trainable_weights if v.path != "")
    assert {v.name for v in model.trainable_weights} == {"table_update_trigger", "kernel", "bias"}
    x, y, _ = _data(64)
    before = {t.name: v.numpy().copy() for t, v in layer.embedding_tables.items()}
    hist = model.fit(_dataset(x, y, 16), epochs=10, verbose=0)
    losses = hist.history["loss"]
    assert losses[-1] < 0.7 * losses[0], losses
    after = {t.name: v.numpy().copy() for t, v in layer.embedding_tables.items()}
    for name in before:
        assert not np.allclose(before[name][: VOCAB - 2], after[name][: VOCAB - 2]), name
        np.testing.assert_array_equal(before[name][VOCAB - 2 :], after[name][VOCAB - 2 :])
    model.evaluate(_dataset(x, y, 16), verbose=0)
    model.predict(_dataset(x, y, 16), verbose=0)
    for t, v in layer.embedding_tables.items():
        np.testing.assert_array_equal(v.numpy(), after[t.name])
    assert float(layer._update_trigger.numpy()) == 0.0  # the trigger's gradient is exactly zero


def test_model_save_and_load_model_round_trip(tmp_path):
    model, layer = _model()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x, y, _ = _data(32)
    model.fit(_dataset(x, y, 16), epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    new_layer = loaded.get_layer("embedding")
    assert isinstance(new_layer, te_keras.TPUEmbedding)
    for (t, v), (t2, v2) in zip(layer.embedding_tables.items(), new_layer.embedding_tables.items(), strict=False):
        assert t.name == t2.name and type(t.optimizer) is type(t2.optimizer)
        np.testing.assert_array_equal(v.numpy(), v2.numpy())
        for s in layer.slot_variables[t]:
            np.testing.assert_array_equal(layer.slot_variables[t][s].numpy(), new_layer.slot_variables[t2][s].numpy())
    fc2 = new_layer.feature_config
    assert fc2["items"].table is fc2["history"].table  # sharing survives serialisation
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
    loaded.fit(_dataset(x, y, 16), epochs=1, verbose=0)  # the loaded model trains too


def test_tf_train_checkpoint_round_trip_with_tensorflows_layout(tmp_path):
    model, layer = _model()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x, y, _ = _data(32)
    model.fit(_dataset(x, y, 16), epochs=1, verbose=0)
    path = tf.train.Checkpoint(layer=layer).save(str(tmp_path / "ck"))
    keys = {k for k, _ in tf.train.list_variables(path)}
    assert "layer/_tpu_embedding/item/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "layer/_tpu_embedding/item.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE" in keys
    _, fresh = _model()
    tf.train.Checkpoint(layer=fresh).restore(path).assert_existing_objects_matched()
    for (_, v), (_, v2) in zip(layer.embedding_tables.items(), fresh.embedding_tables.items(), strict=False):
        np.testing.assert_array_equal(v.numpy(), v2.numpy())


def test_get_config_rejects_unserialisable_learning_rate_callables():
    table = emb_api.TableConfig(5, 2, name="t", optimizer=emb_api.SGD(lambda: 0.1))
    layer = te_keras.TPUEmbedding({"a": emb_api.FeatureConfig(table=table)})
    with pytest.raises(ValueError, match="learning_rate"):
        layer.get_config()
