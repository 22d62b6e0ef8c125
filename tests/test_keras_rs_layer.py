"""tf_embed_ops.keras.DistributedEmbedding with our own TableConfig/FeatureConfig (no keras-rs needed): outputs
and one fit step against the numpy reference, configs we cannot honour, save/load, serving export."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import keras_rs_test_util as util
from tf_embed_ops import keras as te_keras


def _layer(optimizers=None, **kwargs):
    return te_keras.DistributedEmbedding(
        util.configs(te_keras.TableConfig, te_keras.FeatureConfig, optimizers), name="embedding", **kwargs
    )


_tables, _slots = util.tables, util.slots


def test_forward_equals_the_numpy_reference_for_every_input_kind_with_truncation():
    layer = _layer()
    x, w, rows = util.inputs(seed=1)
    out = layer(x, w)
    expected = util.forward_reference(_tables(layer), rows)
    assert set(out) == set(util.FEATURES)
    for name in util.FEATURES:
        assert out[name].shape == (util.B, util.TABLES[util.FEATURES[name][0]][1])
        np.testing.assert_allclose(out[name].numpy(), expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_get_embedding_tables_returns_every_table_by_name():
    layer = _layer()
    tables = layer.get_embedding_tables()
    assert sorted(tables) == sorted(util.TABLES)
    for name, (vocab, dim, _) in util.TABLES.items():
        assert tuple(tables[name].shape) == (vocab, dim)


def test_fit_step_moves_tables_by_their_own_optimizers_and_the_model_optimizer_holds_no_table_state():
    util.check_one_fit_step(_layer())


def test_schedule_runs_on_the_table_optimizers_iterations_and_survives_save_and_load(tmp_path):
    schedule = keras.optimizers.schedules.ExponentialDecay(0.5, decay_steps=1, decay_rate=0.5)
    sgd = keras.optimizers.SGD(schedule)
    layer = _layer({"user": sgd, "item": sgd, "tag": "sgd"})  # two tables share one Keras optimizer
    model = util.ranking_model(layer)
    head = model.get_layer("head")
    head_w = np.linspace(-1.0, 1.0, 12).reshape(12, 1).astype(np.float32)
    head.set_weights([head_w, np.zeros(1, np.float32)])
    head.trainable = False
    model.compile(optimizer="sgd", loss="mse")
    x, w, rows = util.inputs(seed=4)
    y = np.random.default_rng(5).normal(size=(util.B, 1))
    tables, slots = _tables(layer), _slots(layer)
    tpu_opts = {t.name: t.optimizer for t in layer.embedding_tables}
    for step in range(3):
        rates = {"user": 0.5 * 0.5**step, "item": 0.5 * 0.5**step}
        tables, slots = util.fit_step_reference(tables, slots, tpu_opts, rows, head_w.astype(np.float64), y, rates)
        model.fit(util.model_feed(x, w), tf.constant(y, tf.float32), batch_size=util.B, verbose=0, shuffle=False)
    assert int(sgd.iterations.numpy()) == 3  # once per step, though two tables use it
    for name, values in _tables(layer).items():
        np.testing.assert_allclose(values, tables[name], rtol=2e-5, atol=2e-6, err_msg=name)

    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    new_layer = loaded.get_layer("embedding")
    rates = [r for r in new_layer._tpu_embedding._dynamic_learning_rates]
    assert len(rates) == 1 and int(rates[0].optimizer.iterations.numpy()) == 3
    # The restored schedule continues at step 3.
    np.testing.assert_allclose(float(rates[0]()), 0.5 * 0.5**3, rtol=1e-6)


def test_save_load_round_trips_our_configs_and_weights_and_the_loaded_model_trains(tmp_path):
    layer = _layer()
    model = util.ranking_model(layer)
    model.compile(optimizer="adam", loss="mse")
    x, w, _ = util.inputs(seed=6)
    feed, y = util.model_feed(x, w), tf.ones([util.B, 1])
    model.fit(feed, y, batch_size=4, epochs=1, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    new_layer = loaded.get_layer("embedding")
    assert isinstance(new_layer, te_keras.DistributedEmbedding)
    fcs = new_layer._feature_configs
    assert all(isinstance(f, te_keras.FeatureConfig) for f in fcs.values())
    assert fcs["items"].table is fcs["clicked"].table  # sharing survives serialisation
    assert isinstance(fcs["user"].table.optimizer, keras.optimizers.Adam) and fcs["items"].table.optimizer == "adagrad"
    assert fcs["tags"].table.optimizer.clipvalue == 0.5
    assert tuple(fcs["clicked"].input_shape) == (util.B, 4)
    for name, values in _tables(layer).items():
        np.testing.assert_array_equal(new_layer.get_embedding_tables()[name].numpy(), values)
    for (t, s), (t2, s2) in zip(layer.slot_variables.items(), new_layer.slot_variables.items(), strict=True):
        assert t.name == t2.name
        for a, b in zip(s.values(), s2.values(), strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_allclose(loaded.predict(feed, verbose=0), model.predict(feed, verbose=0), rtol=1e-6)
    loaded.fit(feed, y, batch_size=4, epochs=1, verbose=0)


def test_tpu_optimizer_objects_are_accepted_and_serialised():
    opts = {"user": tf.tpu.experimental.embedding.Adagrad(0.3), "item": "sgd", "tag": "ftrl"}
    layer = _layer(opts)
    restored = te_keras.DistributedEmbedding.from_config(layer.get_config())
    opt = restored._feature_configs["user"].table.optimizer
    assert isinstance(opt, tf.tpu.experimental.embedding.Adagrad) and opt.learning_rate == pytest.approx(0.3)


def test_serving_export_needs_no_plugin_op(tmp_path):
    layer = _layer()
    model = util.ranking_model(layer)
    x, w, _ = util.inputs(seed=7, overlong=False)
    feed = util.model_feed(x, w)
    expected = model.predict(feed, verbose=0)
    signature = {
        "user": tf.TensorSpec([None], tf.int64),
        "items": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64),
        "clicked": tf.TensorSpec([None, 4], tf.int64),
        "tags": tf.SparseTensorSpec([None, None], tf.int64),
        "clicked_w": tf.TensorSpec([None, 4], tf.float32),
        "tags_w": tf.SparseTensorSpec([None, None], tf.float32),
    }
    export_dir = str(tmp_path / "served")
    names = te_keras.export_for_serving(model, export_dir, signature)
    served = tf.saved_model.load(export_dir).signatures["serving_default"]
    components = tf.nest.flatten(feed, expand_composites=True)
    flat_signature = tf.nest.flatten(signature, expand_composites=True)
    assert len(components) == len(flat_signature) == len(names)
    out = served(**{n: tf.cast(c, s.dtype) for n, c, s in zip(names, components, flat_signature, strict=True)})
    np.testing.assert_allclose(out["output_0"].numpy(), expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- bad configs


def _one(table_kwargs=None, feature_kwargs=None, **layer_kwargs):
    table = te_keras.TableConfig(**{"name": "t", "vocabulary_size": 10, "embedding_dim": 4, **(table_kwargs or {})})
    feature = {"name": "f", "table": table, "input_shape": (8,), "output_shape": (8, 4), **(feature_kwargs or {})}
    return te_keras.DistributedEmbedding({"f": te_keras.FeatureConfig(**feature)}, **layer_kwargs)


@pytest.mark.parametrize(
    "table_kwargs, feature_kwargs, layer_kwargs, match",
    [
        ({"placement": "sparsecore"}, {}, {}, r"Table 't': placement 'sparsecore' asks for SparseCore"),
        ({"placement": "hbm"}, {}, {}, r"Table 't': placement 'hbm' is not one of"),
        ({"combiner": "max"}, {}, {}, r"Table 't': combiner 'max'"),
        ({"vocabulary_size": 0}, {}, {}, r"Table 't': vocabulary_size must be a positive integer; got 0"),
        ({"embedding_dim": 2.5}, {}, {}, r"Table 't': embedding_dim must be a positive integer; got 2.5"),
        ({"max_ids_per_partition": 0}, {}, {}, r"Table 't': max_ids_per_partition must be a positive"),
        ({"max_unique_ids_per_partition": -1}, {}, {}, r"Table 't': max_unique_ids_per_partition must be a"),
        ({"optimizer": None}, {}, {}, r"Table 't': optimizer is None"),
        ({"optimizer": "rmsprop"}, {}, {}, r"Table 't': unknown optimizer name 'rmsprop'"),
        ({}, {"input_shape": (8, 3, 2)}, {}, r"Feature 'f': input_shape \(8, 3, 2\) must be \(batch,\)"),
        ({}, {"input_shape": ()}, {}, r"Feature 'f': input_shape \(\) must be"),
        ({}, {"output_shape": (8, 5)}, {}, r"Feature 'f': output_shape \(8, 5\) must be \(batch, 4\)"),
        ({}, {"output_shape": (8, 2, 4)}, {}, r"Feature 'f': output_shape \(8, 2, 4\) must be"),
        ({}, {"output_shape": (16, 4)}, {}, r"Feature 'f': .* differ in the batch size"),
        ({}, {"input_shape": (8, 0)}, {}, r"Feature 'f': input_shape\[1\] must be a positive integer; got 0"),
        ({}, {}, {"table_stacking": [["t", "u"]]}, r"table_stacking names table 'u'"),
        ({}, {}, {"table_stacking": [["t"], ["t"]]}, r"table_stacking lists table 't' more than once"),
        ({}, {}, {"table_stacking": "all"}, r"table_stacking must be 'auto', None or a list"),
        ({}, {}, {"update_stats": "yes"}, r"`update_stats` cannot be True for the TensorFlow backend"),
    ],
)
def test_configs_we_cannot_honour_are_rejected_by_name(table_kwargs, feature_kwargs, layer_kwargs, match):
    with pytest.raises(ValueError, match=match):
        _one(table_kwargs, feature_kwargs, **layer_kwargs)


@pytest.mark.parametrize("stacking", ["auto", None, [["t"]], ["t"]])
def test_table_stacking_is_accepted(stacking):
    assert _one(table_stacking=stacking).get_config()["table_stacking"] == stacking


def test_inputs_that_do_not_match_the_config_are_rejected_and_change_nothing():
    layer = _one(feature_kwargs={"input_shape": (8, 3)})
    before = _tables(layer)
    bad = [
        (tf.constant([[1, 2], [3, 4]], tf.int64), r"Feature 'f': input of shape \(2, 2\) does not match"),
        (tf.ragged.constant([[[1]], [[2]]], dtype=tf.int64), r"Feature 'f': ragged/sparse input must be"),
    ]
    for ids, match in bad:
        with tf.GradientTape() as tape, pytest.raises(ValueError, match=match):
            out = layer({"f": ids}, training=True)
            tape.gradient(tf.reduce_sum(out["f"]), layer.trainable_variables)
        for name, values in _tables(layer).items():
            np.testing.assert_array_equal(values, before[name])
    ragged = tf.ragged.constant([[1]], dtype=tf.int64)
    with pytest.raises(ValueError, match=r"Feature 'f': weights are dense but the input is ragged"):
        layer({"f": ragged}, {"f": tf.constant([[1.0]])})
