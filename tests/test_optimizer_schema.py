"""The optimizer schema drives Python and C++ alike: same accept/reject decisions on every range's boundaries.

For every schema entry and every range of a hyper-parameter, the values at each bound, just inside and just outside
it (the neighbouring float32), and the non-finite values go through (a) the Python front end (the generated class,
or TensorFlow's class plus ``from_feature_config``) and (b) a config proto validated by C++ (``tec.load``).  The
expected decision is computed here from the bound's definition, not from the code under test.  Every entry also
round-trips Python -> TPUEmbeddingConfiguration -> ``to_feature_config`` -> the same proto.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2

import tf_embed_ops.config as tec
import tf_embed_ops.optimizers as teo
from tf_embed_ops import _loader, _optimizer_schema

E = tf.tpu.experimental.embedding
SCHEMAS = _optimizer_schema.schemas()
KINDS = [s.kind for s in SCHEMAS]


def _step() -> float:
    return 3.0


def _class(schema):
    return getattr(E, schema.python_class) if schema.origin == "tensorflow" else getattr(teo, schema.python_class)


def _learning_rate(schema):
    return _step if schema.needs_dynamic_learning_rate else 0.1


def _feature_config(optimizer):
    table = E.TableConfig(vocabulary_size=16, dim=2, name="t", optimizer=optimizer)
    return (E.FeatureConfig(table=table, name="f"),)


def _f32(x: float) -> float:
    return float(np.float32(x))


def _next(x: float, toward: float) -> float:
    return float(np.nextafter(np.float32(x), np.float32(toward), dtype=np.float32))


def _boundary_cases(r: _optimizer_schema.Range):
    """(value, expected accepted) at, just inside and just outside each bound, and the non-finite values.

    The expectation comes from the bound's definition: the bound itself is valid iff inclusive, the float32 just
    inside is valid (if the other bound allows it), the float32 just outside is not.
    """
    lo = -math.inf if r.lower is None else r.lower
    hi = math.inf if r.upper is None else r.upper

    def valid(v: float) -> bool:
        if math.isnan(v) or (r.finite and math.isinf(v)):
            return False
        above = v > lo or (v == lo and (r.lower is None or r.lower_inclusive))
        below = v < hi or (v == hi and (r.upper is None or r.upper_inclusive))
        return above and below

    cases = []
    for bound, inward in ((r.lower, math.inf), (r.upper, -math.inf)):
        if bound is None:
            continue
        inside, outside = _next(bound, inward), _next(bound, -inward)
        cases += [(_f32(bound), valid(bound)), (inside, valid(inside)), (outside, False)]
    cases += [(math.inf, not r.finite and r.upper is None), (-math.inf, not r.finite and r.lower is None)]
    cases += [(math.nan, False)]
    if r.lower is None and r.upper is None:
        cases += [(float(np.finfo(np.float32).max), True), (float(-np.finfo(np.float32).max), True)]
    return cases


RANGE_CASES = [
    pytest.param(s, h, value, expected, id=f"{s.kind}.{h.proto_name}={value!r}")
    for s in SCHEMAS
    for h in s.hyper_parameters
    if h.type == "float"
    for value, expected in _boundary_cases(h.range)
]


def _python_accepts(schema, python_name, value) -> bool:
    """The Python front end's decision: constructing the optimizer and building a config from it."""
    kwargs = {python_name: value}
    try:
        optimizer = _class(schema)(learning_rate=_learning_rate(schema), **kwargs)
        tec.from_feature_config(_feature_config(optimizer))
    except ValueError as e:
        assert python_name in str(e)  # the message names the argument
        return False
    return True


def _cxx_accepts(schema, proto_name, value) -> bool:
    """The C++ validator's decision on a config whose field holds ``value`` (the rest as the Python defaults)."""
    optimizer = _class(schema)(learning_rate=_learning_rate(schema))
    proto = tec.from_feature_config(_feature_config(optimizer))
    values = {h.python_name: getattr(optimizer, h.python_name) for h in schema.hyper_parameters}
    spec = next(h for h in schema.hyper_parameters if h.proto_name == proto_name)
    values[spec.python_name] = spec.from_proto(value)
    _optimizer_schema.refill(proto.table_descriptor[0].optimization_parameters, schema, values)
    try:
        tec.load(proto)
    except tec.InvalidConfigError as e:
        assert "table 't'" in str(e) and f"{schema.kind}.{proto_name} must be" in str(e)
        return False
    return True


@pytest.mark.parametrize("schema, spec, value, expected", RANGE_CASES)
def test_python_and_cxx_decide_alike_on_range_boundaries(schema, spec, value, expected):
    assert _cxx_accepts(schema, spec.proto_name, value) is expected
    assert _python_accepts(schema, spec.python_name, value) is expected


SLOT_RANGE_CASES = [
    pytest.param(s, slot, value, expected, id=f"{s.kind}.{slot.python_name}={value!r}")
    for s in SCHEMAS
    for slot in s.slots
    if slot.python_name is not None and (slot.range.lower is not None or slot.range.upper is not None)
    for value, expected in _boundary_cases(slot.range)
]


@pytest.mark.parametrize("schema, slot, value, expected", SLOT_RANGE_CASES)
def test_slot_initial_value_ranges_are_checked_in_python(schema, slot, value, expected):
    # Slot initial values are not in the proto (a checkpoint carries them), so only Python sees them.
    assert slot.name not in optimization_parameters_pb2.OptimizationParameters.DESCRIPTOR.fields_by_name
    assert _python_accepts(schema, slot.python_name, value) is expected


def test_python_checks_the_float32_the_proto_stores():
    # 1e-50 is positive as a Python float but 0 as float32: refused on both paths, and the message says why.
    with pytest.raises(ValueError, match=r"epsilon.*> 0 and finite.*as float32: 0\.0"):
        teo.RMSProp(epsilon=1e-50)
    with pytest.raises(ValueError, match="must be finite"):
        teo.FrequencyEstimator(_step, weight_exponent=1e39)  # inf as float32


@pytest.mark.parametrize("schema", SCHEMAS, ids=KINDS)
def test_every_entry_round_trips_python_proto_python(schema):
    optimizer = _class(schema)(learning_rate=_learning_rate(schema))
    proto = tec.from_feature_config(_feature_config(optimizer))
    params = proto.table_descriptor[0].optimization_parameters
    assert _optimizer_schema.kind_of(params) == schema.kind
    assert (params.WhichOneof("parameters") == schema.kind) is schema.in_tpu_proto
    view = tec.load(proto)
    table = view.tables[0]
    # The struct's own field list (ForEachHyperParameter) is the schema's, in order.
    assert list(table.optimizer.hyperparameters) == [h.proto_name for h in schema.hyper_parameters]
    assert table.optimizer.slot_names == tuple(s.name for s in schema.slots)
    for h in schema.hyper_parameters:
        expected = getattr(optimizer, h.python_name)
        assert table.optimizer.hyperparameters[h.proto_name] == pytest.approx(h.to_proto(expected)), h.proto_name

    feature_config, global_optimizer = tec.to_feature_config(view)
    rebuilt_optimizer = global_optimizer or tf.nest.flatten(feature_config)[0].table.optimizer
    assert type(rebuilt_optimizer) is _class(schema)
    for h in schema.hyper_parameters:
        assert getattr(rebuilt_optimizer, h.python_name) == pytest.approx(getattr(optimizer, h.python_name))
    assert tec.from_feature_config(feature_config, global_optimizer) == proto


@pytest.mark.parametrize("schema", [s for s in SCHEMAS if s.origin == "catalogue"], ids=lambda s: s.kind)
def test_generated_class_signature_defaults_and_docstring(schema):
    cls = getattr(teo, schema.python_class)
    params = inspect.signature(cls).parameters
    slot_args = [s.python_name for s in schema.slots if s.python_name is not None]
    assert list(params) == ["learning_rate", *[h.python_name for h in schema.hyper_parameters], *slot_args, "kwargs"]
    optimizer = cls(learning_rate=_learning_rate(schema))
    for h in schema.hyper_parameters:
        assert getattr(optimizer, h.python_name) == h.python_default
        assert f"  {h.python_name}: " in cls.__doc__
    for s in schema.slots:
        if s.python_name is not None:
            assert getattr(optimizer, s.python_name) == pytest.approx(s.default_initial_value)
    assert optimizer._slot_names() == [s.name for s in schema.slots]


@pytest.mark.parametrize(
    "schema", [s for s in SCHEMAS if s.accumulation.always or s.accumulation.when_set], ids=lambda s: s.kind
)
def test_accumulation_rule_is_enforced_on_both_paths(schema):
    trigger = {}
    if schema.accumulation.when_set is not None:
        spec = next(h for h in schema.hyper_parameters if h.proto_name == schema.accumulation.when_set)
        trigger = {spec.python_name: spec.from_proto(True)}
    # (TensorFlow's Adam raises this itself, in its own words.)
    with pytest.raises(ValueError, match="gradient accumulation"):
        _class(schema)(learning_rate=0.1, use_gradient_accumulation=False, **trigger)

    optimizer = _class(schema)(learning_rate=0.1, **trigger)
    proto = tec.from_feature_config(_feature_config(optimizer))
    params = proto.table_descriptor[0].optimization_parameters
    params.gradient_accumulation_status = optimization_parameters_pb2.GradientAccumulationStatus.DISABLED
    with pytest.raises(tec.InvalidConfigError, match="needs gradient accumulation"):
        tec.load(proto)


def test_dynamic_learning_rate_rule_is_enforced_on_both_paths():
    schema = _optimizer_schema.schema_for_kind("frequency_estimator")
    assert schema.needs_dynamic_learning_rate
    with pytest.raises(ValueError, match="learning_rate"):
        teo.FrequencyEstimator(learning_rate=5.0)
    proto = tec.from_feature_config(_feature_config(teo.FrequencyEstimator(_step)))
    proto.table_descriptor[0].optimization_parameters.learning_rate.constant = 5.0
    with pytest.raises(tec.InvalidConfigError, match="learning_rate must be dynamic"):
        tec.load(proto)


def test_schema_covers_exactly_the_optimizers_the_kernels_run():
    assert KINDS == list(_loader.load_config_module().supported_optimizers())
    assert set(teo.CATALOGUE) == {s.kind for s in SCHEMAS if s.origin == "catalogue"}
    oneof = optimization_parameters_pb2.OptimizationParameters.DESCRIPTOR.oneofs_by_name["parameters"]
    assert {s.kind for s in SCHEMAS if s.in_tpu_proto} <= {f.name for f in oneof.fields}
    # An optimizer the TPU proto lacks has an extension field number TensorFlow's message does not use, and no
    # oneof field of its name.
    numbers = {f.number for f in optimization_parameters_pb2.OptimizationParameters.DESCRIPTOR.fields}
    for s in SCHEMAS:
        if not s.in_tpu_proto:
            assert s.extension_field not in numbers and s.kind not in {f.name for f in oneof.fields}
            assert not s.load_op


@pytest.mark.parametrize(
    "kind, proto_name, python_name, value, accepted",
    [
        # Lion's beta_1 = 1 is valid (Keras' Lion, which the proto links to, accepts beta_1 in (0, 1]).
        ("lion", "beta1", "beta_1", 1.0, True),
        ("lion", "beta2", "beta_2", 1.0, True),
        # Online Yogi's beta_2 = 1 is not: the proto's bias correction sqrt(1 - beta2^t) would be 0.
        ("online_yogi", "beta2", "beta_2", 1.0, False),
        # epsilon = 0 is not, as for TensorFlow's Adam and AdagradMomentum (0/0 on an untouched zero slot).
        ("rms_prop", "epsilon", "epsilon", 0.0, False),
        ("centered_rms_prop", "epsilon", "epsilon", 0.0, False),
        ("adadelta", "epsilon", "epsilon", 0.0, False),
    ],
)
def test_rules_decided_for_the_former_disagreements(kind, proto_name, python_name, value, accepted):
    schema = _optimizer_schema.schema_for_kind(kind)
    assert _cxx_accepts(schema, proto_name, value) is accepted
    assert _python_accepts(schema, python_name, value) is accepted
