"""A Keras table without an optimizer is refused at construction unless the user names it in `frozen_tables`.

Before, such a table (no `TableConfig.optimizer`, no layer-level `optimizer`) was looked up and silently never
trained by `model.fit`. Now `te.keras.TPUEmbedding` and `te.keras.DistributedEmbedding` raise a ValueError naming
the table and the fix; `frozen_tables=[name]` says the table keeps its values (no optimizer, no slots, never
trained), also next to a layer-level default optimizer, which then trains every other table as before.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops import keras as te_keras

emb = tf.tpu.experimental.embedding


def _tables(frozen_optimizer=None, other_optimizer=None):
    init = tf.random_uniform_initializer(-1.0, 1.0, seed=4)
    pretrained = emb.TableConfig(20, 3, init, frozen_optimizer, combiner="sum", name="pretrained")
    other = emb.TableConfig(20, 3, init, other_optimizer, combiner="sum", name="other")
    return {"p": emb.FeatureConfig(pretrained), "o": emb.FeatureConfig(other)}


def _fit(layer) -> dict:
    """{table name: changed by one epoch of fit}."""
    inputs = {k: keras.Input(shape=(), dtype="int64", name=k) for k in ("p", "o")}
    acts = layer(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Concatenate()([acts["p"], acts["o"]])))
    model.compile(keras.optimizers.SGD(0.1), "mse")
    before = {t.name: v.numpy().copy() for t, v in layer.embedding_tables.items()}
    x = {"p": np.arange(16) % 20, "o": np.arange(16) % 20}
    model.fit(x, np.ones(16, np.float32), batch_size=8, epochs=1, verbose=0)
    return {t.name: not np.array_equal(v.numpy(), before[t.name]) for t, v in layer.embedding_tables.items()}


def test_a_table_without_an_optimizer_is_refused_naming_it():
    features = _tables(other_optimizer=emb.SGD(0.1))
    with pytest.raises(ValueError, match=r"Table 'pretrained' has no optimizer .*frozen_tables=\['pretrained'\]"):
        te_keras.TPUEmbedding(features)
    # Nothing was written into the configs.
    assert features["p"].table.optimizer is None and isinstance(features["o"].table.optimizer, emb.SGD)


def test_a_frozen_table_is_never_trained_and_the_others_are():
    layer = te_keras.TPUEmbedding(_tables(other_optimizer=emb.SGD(0.5)), frozen_tables=["pretrained"])
    assert {t.name: sorted(s) for t, s in layer.slot_variables.items()}.get("pretrained", []) == []
    assert _fit(layer) == {"pretrained": False, "other": True}


def test_a_frozen_table_does_not_take_the_layers_default_optimizer():
    features = _tables()
    layer = te_keras.TPUEmbedding(features, emb.Adagrad(0.5), frozen_tables=["pretrained"])
    assert features["p"].table.optimizer is None and isinstance(features["o"].table.optimizer, emb.Adagrad)
    assert _fit(layer) == {"pretrained": False, "other": True}
    assert layer.get_config()["optimizer"]["class_name"] == "Adagrad"  # the default is still the layer's


@pytest.mark.parametrize(
    "frozen, features, message",
    [
        (["nope"], _tables(other_optimizer=emb.SGD(0.1)), r"frozen_tables: unknown table 'nope'; the layer's tables"),
        ("pretrained", _tables(other_optimizer=emb.SGD(0.1)), r"frozen_tables: expected a list of table names"),
        (["pretrained"], _tables(emb.SGD(0.1), emb.SGD(0.1)), r"table 'pretrained' has its own optimizer \(SGD\)"),
    ],
)
def test_bad_frozen_tables_are_refused(frozen, features, message):
    optimizers = [f.table.optimizer for f in features.values()]
    with pytest.raises(ValueError, match=message):
        te_keras.TPUEmbedding(features, frozen_tables=frozen)
    assert [f.table.optimizer for f in features.values()] == optimizers


def test_frozen_tables_survive_get_config_and_load_model(tmp_path):
    layer = te_keras.TPUEmbedding(_tables(), emb.SGD(0.1), frozen_tables=["pretrained"], name="emb")
    config = layer.get_config()
    assert config["frozen_tables"] == ["pretrained"]
    again = te_keras.TPUEmbedding.from_config(config)
    assert {t.name: t.optimizer is None for t in again.embedding_tables} == {"pretrained": True, "other": False}
    inputs = {k: keras.Input(shape=(), dtype="int64", name=k) for k in ("p", "o")}
    model = keras.Model(inputs, layer(inputs)["p"])
    model.save(str(tmp_path / "m.keras"))
    loaded = keras.models.load_model(str(tmp_path / "m.keras")).get_layer("emb")
    assert loaded.get_config()["frozen_tables"] == ["pretrained"]


def test_a_config_saved_before_frozen_tables_loads_with_its_untrained_tables_frozen():
    config = te_keras.TPUEmbedding(_tables(other_optimizer=emb.SGD(0.1)), frozen_tables=["pretrained"]).get_config()
    del config["frozen_tables"]  # as written before the option existed
    assert te_keras.TPUEmbedding.from_config(config).get_config()["frozen_tables"] == ["pretrained"]


def test_a_dynamic_table_without_an_optimizer_is_refused_too():
    dynamic = te.DynamicTableConfig("users", 4, combiner="sum")
    with pytest.raises(ValueError, match=r"Table 'users' has no optimizer"):
        te_keras.TPUEmbedding({"u": emb.FeatureConfig(dynamic)})


def test_distributed_embedding_refuses_a_table_without_an_optimizer_unless_frozen():
    table = te_keras.TableConfig(name="pretrained", vocabulary_size=20, embedding_dim=3, optimizer=None)
    trained = te_keras.TableConfig(name="other", vocabulary_size=20, embedding_dim=3, optimizer="sgd")
    features = {
        "p": te_keras.FeatureConfig(name="p", table=table, input_shape=(8,), output_shape=(8, 3)),
        "o": te_keras.FeatureConfig(name="o", table=trained, input_shape=(8,), output_shape=(8, 3)),
    }
    with pytest.raises(ValueError, match=r"Table 'pretrained': optimizer is None.*frozen_tables=\['pretrained'\]"):
        te_keras.DistributedEmbedding(features)
    layer = te_keras.DistributedEmbedding(features, frozen_tables=["pretrained"])
    assert {t.name: t.optimizer is None for t in layer.embedding_tables} == {"pretrained": True, "other": False}
    config = layer.get_config()
    assert config["frozen_tables"] == ["pretrained"]
    assert te_keras.DistributedEmbedding.from_config(config).get_config()["frozen_tables"] == ["pretrained"]
