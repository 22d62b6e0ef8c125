"""The rest of the TPU optimizer catalogue (tf_embed_ops.optimizers) through the config loader.

Each class maps into the proto and back (from_feature_config -> load -> to_feature_config -> from_feature_config
gives the same message), its slots follow the Load/Retrieve order of TensorFlow's TPU utilities, and the C++
validator rejects out-of-range hyper-parameters with the table, field and value named.
"""

from __future__ import annotations

import pytest
import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2

import tf_embed_ops.config as tec
import tf_embed_ops.optimizers as teo
from tf_embed_ops import _optimizer_schema

E = tf.tpu.experimental.embedding


def _step() -> float:
    return 3.0


# class, constructor kwargs, expected slots (name, default initial value) in Load/Retrieve order.
CASES = [
    (teo.Momentum, dict(learning_rate=0.1, momentum=0.8, use_nesterov=True), [("momenta", 0.0)]),
    (teo.RMSProp, dict(learning_rate=0.1, rho=0.8, momentum=0.5, epsilon=1e-4), [("ms", 1.0), ("mom", 0.0)]),
    (
        teo.CenteredRMSProp,
        dict(learning_rate=0.1, rho=0.7, momentum=0.2, epsilon=1e-3),
        [("ms", 1.0), ("mom", 0.0), ("mg", 0.0)],
    ),
    (teo.Adadelta, dict(learning_rate=0.5, rho=0.9, epsilon=1e-5), [("accumulators", 0.0), ("updates", 0.0)]),
    (
        teo.ProximalAdagrad,
        dict(learning_rate=0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.2),
        [("accumulators", 0.1)],
    ),
    (teo.Lion, dict(learning_rate=0.01, beta_1=0.8, beta_2=0.95, lazy_lion=False), [("momenta", 0.0)]),
    (
        teo.BoundedAdagrad,
        dict(learning_rate=0.1, update_accumulator_first=True, max_var_update=0.5, max_accumulator=10.0),
        [("accumulators", 0.1)],
    ),
    (
        teo.OnlineYogi,
        dict(learning_rate=0.1, l1_regularization_strength=0.1, beta_2=0.9),
        [("vs", 0.1), ("linears", 0.0)],
    ),
    (
        teo.ProximalYogi,
        dict(learning_rate=0.1, l2_regularization_strength=0.1, beta_1=0.5, beta_2=0.9, epsilon=1e-2),
        [("v", 0.1), ("m", 0.0)],
    ),
    (
        teo.FrequencyEstimator,
        dict(learning_rate=_step, tau=0.1, max_delta=100.0, outlier_threshold=3.0, weight_exponent=0.5),
        [("last_hit_step", 0.0)],
    ),
    (teo.Assign, dict(), []),
    (
        teo.RowWiseAdagrad,
        dict(learning_rate=0.05, epsilon=1e-6, weight_decay=0.01, decoupled_weight_decay=True),
        [("row_accumulators", 0.0)],
    ),
]
IDS = [c[0].__name__ for c in CASES]


def _feature_config(optimizer, **table_kwargs):
    table = E.TableConfig(vocabulary_size=64, dim=4, name="t", optimizer=optimizer, **table_kwargs)
    return (E.FeatureConfig(table=table, name="f"),)


@pytest.mark.parametrize("cls, kwargs, slots", CASES, ids=IDS)
def test_round_trip_and_view(cls, kwargs, slots):
    opt = cls(
        **kwargs,
        clip_weight_min=-2.0,
        clip_weight_max=2.0,
        weight_decay_factor=0.01,
        multiply_weight_decay_factor_by_learning_rate=True,
    )
    proto = tec.from_feature_config(_feature_config(opt))
    params = proto.table_descriptor[0].optimization_parameters
    assert _optimizer_schema.kind_of(params) == cls._schema.kind
    assert params.clipping_limits.lower.value == -2.0 and params.clipping_limits.upper.value == 2.0
    assert params.weight_decay_factor == pytest.approx(0.01)
    assert params.multiply_weight_decay_factor_by_learning_rate

    view = tec.load(proto)
    table = view.tables[0]
    assert table.optimizer.kind == cls._schema.kind
    assert [(s.name, s.default_initial_value) for s in table.optimizer.slots] == [
        (n, pytest.approx(v)) for n, v in slots
    ]
    assert [s for s in opt._slot_names()] == [n for n, _ in slots]
    for spec in cls._schema.hyper_parameters:
        expected = spec.to_proto(getattr(opt, spec.python_name))
        assert table.optimizer.hyperparameters[spec.proto_name] == pytest.approx(expected), spec.proto_name

    feature_config, global_optimizer = tec.to_feature_config(view)
    rebuilt = tec.from_feature_config(feature_config, global_optimizer)
    assert rebuilt == proto
    rebuilt_opt = tf.nest.flatten(feature_config)[0].table.optimizer or global_optimizer
    assert type(rebuilt_opt) is cls


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("momentum.momentum", -1.0, "momentum.momentum must be >= 0 and finite, got -1"),
        ("rms_prop.rho", 1.5, "rms_prop.rho must be in [0, 1], got 1.5"),
        ("centered_rms_prop.epsilon", float("nan"), "centered_rms_prop.epsilon must be > 0 and finite, got nan"),
        ("adadelta.rho", -0.1, "adadelta.rho must be in [0, 1], got -0.1"),
        ("proximal_adagrad.l1", -1.0, "proximal_adagrad.l1 must be >= 0 and finite, got -1"),
        ("lion.beta2", 2.0, "lion.beta2 must be in [0, 1], got 2"),
        ("bounded_adagrad.max_accumulator", -3.0, "bounded_adagrad.max_accumulator must be >= 0"),
        ("online_yogi.l2", float("inf"), "online_yogi.l2 must be >= 0 and finite, got inf"),
        ("proximal_yogi.epsilon", 0.0, "proximal_yogi.epsilon must be > 0 and finite, got 0"),
        ("frequency_estimator.tau", 1.0, "frequency_estimator.tau must be in (0, 1), got 1"),
    ],
)
def test_out_of_range_hyper_parameter_names_table_field_and_value(field, value, fragment):
    message_name, attr = field.split(".")
    params = optimization_parameters_pb2.OptimizationParameters()
    params.learning_rate.dynamic.tag = 0  # frequency_estimator needs a dynamic rate; harmless for the rest
    sub = getattr(params, message_name)
    sub.SetInParent()
    # Start from valid values where zero is not.
    for name, ok in {"epsilon": 0.1, "tau": 0.5, "max_delta": 10.0}.items():
        if name in sub.DESCRIPTOR.fields_by_name:
            setattr(sub, name, ok)
    setattr(sub, attr, value)
    proto = _config_with(params)
    with pytest.raises(tec.InvalidConfigError) as info:
        tec.load(proto)
    assert "table 't' (table_id 0)" in str(info.value)
    assert fragment in str(info.value)


def _config_with(params):
    proto = tec.from_feature_config(_feature_config(E.SGD(learning_rate=0.1)))
    proto.table_descriptor[0].optimization_parameters.CopyFrom(params)
    return proto


@pytest.mark.parametrize(
    "fill, fragment",
    [
        (lambda p: setattr(p.lion, "use_non_lazy_lion", True), "non-lazy Lion needs gradient accumulation"),
        (lambda p: p.assign.SetInParent(), "assign needs gradient accumulation"),
    ],
    ids=["non_lazy_lion", "assign"],
)
def test_optimizers_that_need_accumulation_reject_disabled(fill, fragment):
    params = optimization_parameters_pb2.OptimizationParameters()
    params.learning_rate.constant = 0.1
    fill(params)
    params.gradient_accumulation_status = optimization_parameters_pb2.GradientAccumulationStatus.DISABLED
    with pytest.raises(tec.InvalidConfigError, match=fragment):
        tec.load(_config_with(params))


def test_frequency_estimator_needs_a_dynamic_learning_rate():
    params = optimization_parameters_pb2.OptimizationParameters()
    params.learning_rate.constant = 5.0
    params.frequency_estimator.tau = 0.5
    params.frequency_estimator.max_delta = 10.0
    with pytest.raises(tec.InvalidConfigError, match="learning_rate must be dynamic"):
        tec.load(_config_with(params))


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: teo.Momentum(momentum=-1.0), "momentum"),
        (lambda: teo.RMSProp(rho=2.0), "rho"),
        (lambda: teo.Adadelta(epsilon=0.0), "epsilon"),
        (lambda: teo.ProximalAdagrad(initial_accumulator_value=0.0), "initial_accumulator_value"),
        (lambda: teo.Lion(lazy_lion=False, use_gradient_accumulation=False), "lazy_lion"),
        (lambda: teo.Lion(beta_1=1.5), "beta_1"),
        (lambda: teo.BoundedAdagrad(max_var_update=-1.0), "max_var_update"),
        (lambda: teo.OnlineYogi(initial_v_value=0.0), "initial_v_value"),
        (lambda: teo.ProximalYogi(beta_2=1.0), "beta_2"),
        (lambda: teo.FrequencyEstimator(_step, tau=0.0), "tau"),
        (lambda: teo.Assign(use_gradient_accumulation=False), "use_gradient_accumulation"),
        (lambda: teo.Momentum(use_gradient_accumulation=False, clipvalue=1.0), "clipvalue"),
    ],
)
def test_python_classes_reject_bad_arguments_naming_them(make, argument):
    with pytest.raises(ValueError, match=argument):
        make()


def test_catalogue_classes_are_accepted_by_tensorflow_table_config():
    opt = teo.Momentum(learning_rate=0.1)
    table = E.TableConfig(vocabulary_size=8, dim=2, optimizer=opt)
    assert table.optimizer is opt
    assert teo.SGD is E.SGD and teo.Adam is E.Adam
