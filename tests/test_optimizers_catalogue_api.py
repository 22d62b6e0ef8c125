"""tf_embed_ops.optimizers classes in the mid-level API and the Keras layer: accepted, slots created and
checkpointed under their Load/Retrieve names, and serialised by the layer's config."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te

E = tf.tpu.experimental.embedding


def _feature_config():
    momentum = E.TableConfig(vocabulary_size=10, dim=4, name="m", optimizer=te.optimizers.Momentum(0.1, momentum=0.7))
    rms = E.TableConfig(
        vocabulary_size=6, dim=2, name="r", optimizer=te.optimizers.CenteredRMSProp(0.05, rho=0.8, initial_ms_value=2.0)
    )
    return {"a": E.FeatureConfig(table=momentum), "b": E.FeatureConfig(table=rms)}


def test_mid_level_trains_catalogue_tables_and_checkpoints_their_slots(tmp_path):
    fc = _feature_config()
    emb = te.TPUEmbedding(fc)
    emb.enqueue({"a": tf.constant([1, 2, 2]), "b": tf.constant([3, 4, 5])}, training=True)
    with tf.GradientTape() as tape:
        acts = emb.dequeue()
        tape.watch(acts)
        loss = tf.reduce_sum(acts["a"]) + tf.reduce_sum(acts["b"])
    table_m, table_r = fc["a"].table, fc["b"].table
    before = emb.embedding_tables[table_m].numpy().copy()
    emb.apply_gradients(tape.gradient(loss, acts))

    assert list(emb.slot_variables[table_m]) == ["momenta"]
    assert list(emb.slot_variables[table_r]) == ["ms", "mom", "mg"]
    np.testing.assert_array_equal(emb.slot_variables[table_r]["ms"].numpy()[0], [2.0, 2.0])  # untouched row
    # Momentum, first step from zero momenta: w -= lr * g, with g = 1 per occurrence of the id.
    after = emb.embedding_tables[table_m].numpy()
    np.testing.assert_allclose(before - after, np.outer([0, 1, 2, 0, 0, 0, 0, 0, 0, 0], np.ones(4)) * 0.1, rtol=1e-6)

    path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path / "ckpt"))
    keys = {name for name, _ in tf.train.list_variables(path)}
    assert {
        "embedding/m.Smomenta/.ATTRIBUTES/VARIABLE_VALUE",
        "embedding/r.Smg/.ATTRIBUTES/VARIABLE_VALUE",
        "embedding/r.Sms/.ATTRIBUTES/VARIABLE_VALUE",
        "embedding/r.Smom/.ATTRIBUTES/VARIABLE_VALUE",
    } <= keys


def test_keras_layer_config_round_trips_catalogue_optimizers():
    layer = te.keras.TPUEmbedding(_feature_config())
    config = json.loads(json.dumps(layer.get_config()))
    rebuilt = te.keras.TPUEmbedding.from_config(config)
    assert json.loads(json.dumps(rebuilt.get_config())) == config
    optimizers = {t["name"]: t["optimizer"] for t in config["feature_config"]["tables"]}
    assert optimizers["m"]["class_name"] == "tf_embed_ops.optimizers.Momentum"
    assert optimizers["m"]["config"]["momentum"] == pytest.approx(0.7)
    assert optimizers["r"]["config"]["initial_ms_value"] == pytest.approx(2.0)
