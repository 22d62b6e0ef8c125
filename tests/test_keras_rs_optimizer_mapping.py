"""Keras optimizers (and "sgd"/"adagrad"/"adam"/"ftrl") as table optimizers: the mapping to the TPU optimizers,
the options with no TPU meaning (one error each, naming table and option, in every entry point), schedules
on the optimizer's iterations, and training through the mid-level API and the Keras layer (numpy reference)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops
from tests import numpy_reference as ref
from tf_embed_ops import keras as te_keras
from tf_embed_ops.keras import optimizer_mapping

emb = tf.tpu.experimental.embedding
ko = keras.optimizers


def _f32(x):
    return float(np.float32(x))


@pytest.mark.parametrize(
    "keras_opt, tpu_class, expected",
    [
        (ko.SGD(0.05), emb.SGD, {"learning_rate": _f32(0.05)}),
        (
            ko.Adagrad(0.1, initial_accumulator_value=0.2),
            emb.Adagrad,
            {"learning_rate": _f32(0.1), "initial_accumulator_value": 0.2},
        ),
        (
            ko.Adam(0.01, beta_1=0.8, beta_2=0.99, epsilon=1e-6),
            emb.Adam,
            {"learning_rate": _f32(0.01), "beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-6, "lazy_adam": True},
        ),
        (
            ko.Ftrl(
                0.1,
                learning_rate_power=-0.6,
                initial_accumulator_value=0.2,
                l1_regularization_strength=0.01,
                l2_regularization_strength=0.02,
                beta=0.3,
            ),
            emb.FTRL,
            {
                "learning_rate": _f32(0.1),
                "learning_rate_power": -0.6,
                "initial_accumulator_value": 0.2,
                "l1_regularization_strength": 0.01,
                "l2_regularization_strength": 0.02,
                "beta": 0.3,
            },
        ),
        (
            ko.Adam(0.02, weight_decay=0.01, clipvalue=0.5, gradient_accumulation_steps=2),
            emb.Adam,
            {
                "weight_decay_factor": 0.01,
                "clip_gradient_min": -0.5,
                "clip_gradient_max": 0.5,
                "use_gradient_accumulation": True,
                "multiply_weight_decay_factor_by_learning_rate": None,  # Keras multiplies by lr; keras-rs does not
            },
        ),
        (ko.SGD(0.05), emb.SGD, {"clip_gradient_min": None, "weight_decay_factor": None}),
    ],
)
def test_keras_optimizers_map_to_their_tpu_family(keras_opt, tpu_class, expected):
    tpu = optimizer_mapping.to_table_optimizer(keras_opt, "t")
    assert type(tpu) is tpu_class
    for name, value in expected.items():
        if isinstance(value, float):
            assert getattr(tpu, name) == pytest.approx(value), name
        else:
            assert getattr(tpu, name) == value, name


@pytest.mark.parametrize(
    "name, tpu_class", [("sgd", emb.SGD), ("adagrad", emb.Adagrad), ("adam", emb.Adam), ("ftrl", emb.FTRL)]
)
def test_strings_give_the_tpu_defaults(name, tpu_class):
    tpu = optimizer_mapping.to_table_optimizer(name, "t")
    default = tpu_class()
    assert type(tpu) is tpu_class and tpu.learning_rate == default.learning_rate


def test_tpu_optimizers_and_none_pass_through():
    sgd = emb.SGD(0.1)
    assert optimizer_mapping.to_table_optimizer(sgd, "t") is sgd
    assert optimizer_mapping.to_table_optimizer(None, "t") is None


UNSUPPORTED = [
    (lambda: ko.Adam(clipnorm=1.0), "clipnorm"),
    (lambda: ko.Adagrad(global_clipnorm=1.0), "global_clipnorm"),
    (lambda: ko.SGD(use_ema=True), "use_ema"),
    (lambda: ko.Ftrl(loss_scale_factor=128.0), "loss_scale_factor"),
    (lambda: ko.Adam(amsgrad=True), "amsgrad"),
    (lambda: ko.SGD(momentum=0.9), "momentum"),
    (lambda: ko.SGD(nesterov=True), "nesterov"),
    (lambda: ko.Adagrad(epsilon=1e-3), "epsilon"),
    (lambda: ko.Ftrl(l2_shrinkage_regularization_strength=0.1), "l2_shrinkage_regularization_strength"),
    (lambda: ko.RMSprop(), "unsupported optimizer RMSprop"),
    (lambda: "rmsprop", "unknown optimizer name 'rmsprop'"),
]


def _one_table(optimizer, name="user"):
    return {"a": emb.FeatureConfig(emb.TableConfig(10, 2, name=name, optimizer=optimizer))}


@pytest.mark.parametrize("make, option", UNSUPPORTED)
def test_each_option_without_tpu_meaning_is_rejected_naming_table_and_option_in_every_entry_point(make, option):
    match = rf"Table 'user': .*{option}"
    with pytest.raises(ValueError, match=match):
        optimizer_mapping.to_table_optimizer(make(), "user")
    with pytest.raises(ValueError, match=match):
        tf_embed_ops.TPUEmbedding(_one_table(make()))
    with pytest.raises(ValueError, match=match):
        te_keras.TPUEmbedding(_one_table(make()))
    table = te_keras.TableConfig(name="user", vocabulary_size=10, embedding_dim=2, optimizer=make())
    with pytest.raises(ValueError, match=match):
        te_keras.DistributedEmbedding([te_keras.FeatureConfig("a", table, (4,), (4, 2))])
    # The default optimizer of the mid-level API is checked per table, by that table's name.
    with pytest.raises(ValueError, match=match):
        tf_embed_ops.TPUEmbedding(_one_table(None), make())
    with pytest.raises(ValueError, match=match):
        te_keras.TPUEmbedding(_one_table(None), make())


def test_mid_level_api_trains_with_a_keras_schedule_on_the_optimizers_iterations():
    """Two tables share one Keras Adagrad with a schedule: each step uses schedule(iterations), which then
    advances once (not once per table); tables follow the numpy reference."""
    schedule = ko.schedules.PiecewiseConstantDecay([0], [0.5, 0.1])
    adagrad = ko.Adagrad(schedule, initial_accumulator_value=0.1)
    t1 = emb.TableConfig(6, 2, name="t1", optimizer=adagrad, initializer=tf.constant_initializer(0.5))
    t2 = emb.TableConfig(5, 3, name="t2", combiner="sum", initializer=tf.constant_initializer(-0.25))
    fc = {"a": emb.FeatureConfig(t1), "b": emb.FeatureConfig(t2)}
    layer = tf_embed_ops.TPUEmbedding(fc, adagrad)  # t2 takes it as the default optimizer
    layer.build()
    assert adagrad.iterations.numpy() == 0
    tables = {t.name: layer.embedding_tables[t].numpy().copy() for t in (t1, t2)}
    spec = ref.spec_from_optimizer(t1.optimizer)
    slots = {name: [np.full_like(v, 0.1)] for name, v in tables.items()}
    rng = np.random.default_rng(0)
    for step, lr in enumerate((0.5, 0.1, 0.1)):  # Keras: values[0] while step <= boundaries[0]
        a, b = rng.integers(6, size=4), rng.integers(5, size=4)
        ga, gb = rng.normal(size=(4, 2)), rng.normal(size=(4, 3))
        layer.enqueue({"a": tf.constant(a, tf.int64), "b": tf.constant(b, tf.int64)})
        layer.dequeue()
        layer.apply_gradients({"a": tf.constant(ga, tf.float32), "b": tf.constant(gb, tf.float32)})
        assert adagrad.iterations.numpy() == step + 1
        for name, ids, g, combiner in (("t1", a, ga, "mean"), ("t2", b, gb, "sum")):
            entries, _ = ref.entries_from_rows([[int(i)] for i in ids])
            grads = ref.row_gradients([(entries, combiner, g)], tables[name].shape[0])
            tables[name], slots[name] = ref.apply_step(spec, lr, tables[name], slots[name], grads)
    for t in (t1, t2):
        np.testing.assert_allclose(layer.embedding_tables[t].numpy(), tables[t.name], rtol=2e-5, atol=2e-6)


def test_keras_layer_accepts_a_keras_default_optimizer_and_round_trips_a_schedule():
    schedule = ko.schedules.ExponentialDecay(0.3, decay_steps=2, decay_rate=0.5)
    table = emb.TableConfig(8, 2, name="t", initializer=tf.constant_initializer(0.1))
    layer = te_keras.TPUEmbedding({"a": emb.FeatureConfig(table)}, ko.SGD(schedule), name="emb")
    assert isinstance(table.optimizer, emb.SGD)
    assert isinstance(table.optimizer.learning_rate, optimizer_mapping.KerasLearningRate)
    restored = te_keras.TPUEmbedding.from_config(layer.get_config())
    rate = next(iter(restored.embedding_tables)).optimizer.learning_rate
    assert isinstance(rate, optimizer_mapping.KerasLearningRate)
    np.testing.assert_allclose(float(rate()), 0.3, rtol=1e-6)  # step 0, then it advances
    np.testing.assert_allclose(float(rate()), 0.3 * 0.5**0.5, rtol=1e-6)


def test_keras_layer_saves_the_schedules_step_with_its_weights(tmp_path):
    schedule = ko.schedules.PiecewiseConstantDecay([1], [0.4, 0.2])
    table = emb.TableConfig(8, 2, name="t", optimizer=ko.SGD(schedule))
    layer = te_keras.TPUEmbedding({"a": emb.FeatureConfig(table)}, name="emb")
    ids = keras.Input(shape=(), dtype="int64", name="a")
    model = keras.Model({"a": ids}, keras.layers.Dense(1)(layer({"a": ids})["a"]))
    model.compile("sgd", "mse")
    x, y = {"a": np.arange(6, dtype=np.int64)}, np.ones((6, 1), np.float32)
    model.fit(x, y, batch_size=3, epochs=1, verbose=0, shuffle=False)  # two steps
    assert int(table.optimizer.learning_rate.optimizer.iterations.numpy()) == 2
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path).get_layer("emb")
    rate = next(iter(loaded.embedding_tables)).optimizer.learning_rate
    assert int(rate.optimizer.iterations.numpy()) == 2
    np.testing.assert_allclose(float(rate()), 0.2, rtol=1e-6)  # past the boundary: the schedule resumed
