"""The C++ validator through tf_embed_ops.config.load: every rule, garbage and truncated bytes, random bytes.

Each rule test starts from a valid config, breaks one field, and asserts the error class and that the message
names the table/feature, the field and the offending value.
"""

from __future__ import annotations

import random

import pytest
import tensorflow as tf
from google.protobuf import text_format

import tf_embed_ops.config as tec

VALID = """
table_descriptor {
  name: "video" vocabulary_size: 100 dimension: 8
  optimization_parameters {
    learning_rate { dynamic { tag: 0 } }
    gradient_accumulation_status: ENABLED
    adam { beta1: 0.9 beta2: 0.999 epsilon: 1e-7 }
  }
}
table_descriptor {
  name: "user" vocabulary_size: 50 dimension: 4
  optimization_parameters {
    learning_rate { constant: 0.1 }
    adagrad_momentum { momentum: 0.9 exponent: 2 beta2: 1 epsilon: 1e-10 }
  }
}
table_descriptor {
  name: "query" vocabulary_size: 20 dimension: 2
  optimization_parameters { learning_rate { dynamic { tag: 0 } } ftrl { lr_power: -0.5 } }
}
feature_descriptor { name: "watched" table_id: 0 input_shape: 16 }
feature_descriptor { name: "uid" table_id: 1 input_shape: 16 }
feature_descriptor { table_id: 2 input_shape: 16 input_shape: 3 }
mode: TRAINING num_hosts: 2 num_tensor_cores: 4
"""


def valid_proto():
    return text_format.Parse(VALID, tec.TPUEmbeddingConfiguration())


def opt(p, t):
    return p.table_descriptor[t].optimization_parameters


def test_valid_base_config_loads():
    cfg = tec.load(valid_proto())
    assert [t.name for t in cfg.tables] == ["video", "user", "query"]
    assert cfg.num_learning_rate_tags == 1  # tables sharing a tag is fine
    assert cfg.learning_rate_tags == {0: ("video", "query")}


def _set(path, value):
    def mutate(p):
        *parents, leaf = path.split(".")
        msg = p
        for part in parents:
            msg = msg[int(part)] if part.isdigit() else getattr(msg, part)
        setattr(msg, leaf, value)

    return mutate


def _clip(t, field, lower=None, upper=None):
    def mutate(p):
        c = getattr(opt(p, t), field)
        if lower is not None:
            c.lower.value = lower
        if upper is not None:
            c.upper.value = upper

    return mutate


def _quantization(buckets, lower, upper):
    def mutate(p):
        q = opt(p, 1).simulated_quantization
        q.enabled = True
        q.num_buckets = buckets
        q.clipping_limits.lower.value = lower
        q.clipping_limits.upper.value = upper

    return mutate


def _clear_optimizer(p):
    opt(p, 1).ClearField("adagrad_momentum")


def _rms_prop(p):
    opt(p, 2).rms_prop.rho = 0.9


def _no_tables(p):
    p.ClearField("table_descriptor")


def _drop_feature_of_table_1(p):
    del p.feature_descriptor[1]


def _tag(t, tag):
    return lambda p: setattr(opt(p, t).learning_rate.dynamic, "tag", tag)


def _v1(batch, num_features):
    def mutate(p):
        p.ClearField("feature_descriptor")
        p.batch_size_per_tensor_core = batch
        for td in p.table_descriptor:
            td.num_features = num_features

    return mutate


INVALID = [
    # (id, mutation, [substrings of the message])
    ("no_optimizer", _clear_optimizer, ["table 'user' (table_id 1)", "no optimization algorithm specified"]),
    ("empty_name", _set("table_descriptor.1.name", ""), ["table '' (table_id 1)", "name is empty"]),
    (
        "duplicate_name",
        _set("table_descriptor.2.name", "video"),
        ["table 'video' (table_id 2)", "duplicates table_id 0"],
    ),
    (
        "zero_vocabulary",
        _set("table_descriptor.1.vocabulary_size", 0),
        ["table 'user' (table_id 1)", "vocabulary_size must be > 0, got 0"],
    ),
    ("negative_vocabulary", _set("table_descriptor.0.vocabulary_size", -5), ["table 'video'", "got -5"]),
    (
        "vocabulary_below_num_hosts",
        _set("table_descriptor.2.vocabulary_size", 1),
        ["table 'query' (table_id 2)", "vocabulary_size 1 is smaller than num_hosts 2"],
    ),
    ("zero_dimension", _set("table_descriptor.0.dimension", 0), ["table 'video'", "dimension must be > 0, got 0"]),
    ("negative_dimension", _set("table_descriptor.2.dimension", -1), ["table 'query'", "got -1"]),
    (
        "table_id_out_of_range",
        _set("feature_descriptor.1.table_id", 3),
        ["feature 'uid' (feature 1)", "table_id 3 is out of range [0, 3)"],
    ),
    (
        "table_id_negative_unnamed_feature",
        _set("feature_descriptor.2.table_id", -1),
        ["feature 2:", "table_id -1 is out of range"],
    ),
    (
        "table_without_feature",
        _drop_feature_of_table_1,
        ["table 'user' (table_id 1)", "no feature_descriptor uses this table"],
    ),
    ("tag_gap", _tag(2, 2), ["table 'query' (table_id 2)", "tag 2 leaves a gap", "tag 1 is unused", "[0, 2]"]),
    ("tag_not_from_zero", lambda p: (_tag(0, 1)(p), _tag(2, 1)(p)), ["tag 1", "tag 0 is unused"]),
    ("tag_negative", _tag(0, -1), ["table 'video'", "learning_rate.dynamic.tag must be >= 0, got -1"]),
    (
        "negative_learning_rate",
        _set("table_descriptor.1.optimization_parameters.learning_rate.constant", -0.5),
        ["table 'user'", "learning_rate.constant must be >= 0", "got -0.5"],
    ),
    (
        "nan_learning_rate",
        _set("table_descriptor.1.optimization_parameters.learning_rate.constant", float("nan")),
        ["table 'user'", "learning_rate.constant", "got nan"],
    ),
    (
        "batch_size_with_features",
        _set("batch_size_per_tensor_core", 8),
        ["batch_size_per_tensor_core is 8", "must be 0 (unset) when feature_descriptor is given"],
    ),
    (
        "num_features_with_features",
        _set("table_descriptor.1.num_features", 2),
        ["table 'user' (table_id 1)", "num_features is 2", "feature_descriptor is given"],
    ),
    (
        "zero_input_shape",
        lambda p: p.feature_descriptor[2].input_shape.__setitem__(1, 0),
        ["feature 2:", "input_shape[1] must be > 0, got 0", "[16, 0]"],
    ),
    (
        "negative_input_shape",
        lambda p: p.feature_descriptor[0].input_shape.__setitem__(0, -4),
        ["feature 'watched' (feature 0)", "input_shape[0] must be > 0, got -4"],
    ),
    (
        "v1_without_batch_size",
        _v1(0, 1),
        ["batch_size_per_tensor_core must be > 0 when no feature_descriptor", "got 0"],
    ),
    ("v1_without_num_features", _v1(8, 0), ["table 'video' (table_id 0)", "num_features must be > 0", "got 0"]),
    (
        "weight_clip_lower_above_upper",
        _clip(1, "clipping_limits", 2.0, 1.0),
        ["table 'user'", "clipping_limits.lower (2) must be <= clipping_limits.upper (1)"],
    ),
    (
        "gradient_clip_lower_above_upper",
        _clip(0, "gradient_clipping_limits", 0.5, -0.5),
        ["table 'video'", "gradient_clipping_limits.lower (0.5) must be <= gradient_clipping_limits.upper (-0.5)"],
    ),
    (
        "clip_nan",
        _clip(0, "clipping_limits", float("nan")),
        ["table 'video'", "clipping_limits bounds must not be NaN"],
    ),
    (
        "quantization_one_bucket",
        _quantization(1, -1.0, 1.0),
        ["table 'user'", "simulated_quantization.num_buckets must be >= 2, got 1"],
    ),
    (
        "quantization_lower_equals_upper",
        _quantization(8, 1.0, 1.0),
        ["table 'user'", "simulated_quantization.clipping_limits", "lower 1, upper 1"],
    ),
    (
        "gradient_clipping_without_accumulation",
        lambda p: (
            _clip(2, "gradient_clipping_limits", upper=1.0)(p),
            setattr(opt(p, 2), "gradient_accumulation_status", 2),
        ),
        ["table 'query' (table_id 2)", "gradient_clipping_limits is set but gradient_accumulation_status is DISABLED"],
    ),
    (
        "non_lazy_adam_without_accumulation",
        lambda p: (
            setattr(opt(p, 0).adam, "use_non_lazy_adam", True),
            setattr(opt(p, 0), "gradient_accumulation_status", 2),
        ),
        ["table 'video' (table_id 0)", "use_non_lazy_adam is true but gradient_accumulation_status is DISABLED"],
    ),
    (
        "adagrad_momentum_exponent",
        _set("table_descriptor.1.optimization_parameters.adagrad_momentum.exponent", 0.0),
        ["table 'user'", "adagrad_momentum.exponent must be > 0", "got 0"],
    ),
    (
        "adagrad_momentum_epsilon",
        _set("table_descriptor.1.optimization_parameters.adagrad_momentum.epsilon", -1.0),
        ["table 'user'", "adagrad_momentum.epsilon must be > 0", "got -1"],
    ),
    (
        "adam_epsilon",
        _set("table_descriptor.0.optimization_parameters.adam.epsilon", 0.0),
        ["table 'video'", "adam.epsilon must be > 0", "got 0"],
    ),
    (
        "adam_beta1_one",
        _set("table_descriptor.0.optimization_parameters.adam.beta1", 1.0),
        ["table 'video'", "adam.beta1 must be in [0, 1), got 1"],
    ),
    (
        "adam_beta2_negative",
        _set("table_descriptor.0.optimization_parameters.adam.beta2", -0.1),
        ["table 'video'", "adam.beta2 must be in [0, 1), got -0.1"],
    ),
    (
        "ftrl_l1_negative",
        _set("table_descriptor.2.optimization_parameters.ftrl.l1", -1.0),
        ["table 'query'", "ftrl.l1 must be >= 0", "got -1"],
    ),
    (
        "ftrl_lr_power_positive",
        _set("table_descriptor.2.optimization_parameters.ftrl.lr_power", 0.5),
        ["table 'query'", "ftrl.lr_power must be <= 0", "got 0.5"],
    ),
    (
        "negative_weight_decay",
        _set("table_descriptor.1.optimization_parameters.weight_decay_factor", -0.01),
        ["table 'user'", "weight_decay_factor must be >= 0", "got -0.01"],
    ),
    (
        "unknown_accumulation_status",
        _set("table_descriptor.1.optimization_parameters.gradient_accumulation_status", 7),
        ["table 'user'", "gradient_accumulation_status has unknown value 7"],
    ),
    ("unknown_mode", _set("mode", 9), ["config: mode has unknown value 9"]),
    ("unknown_sharding", _set("sharding_strategy", 4), ["config: sharding_strategy has unknown value 4"]),
    ("negative_num_hosts", _set("num_hosts", -1), ["config: num_hosts must be >= 0, got -1"]),
    ("no_tables", _no_tables, ["config: no table_descriptor"]),
]


@pytest.mark.parametrize("mutate, fragments", [pytest.param(m, f, id=i) for i, m, f in INVALID])
def test_each_rule_is_an_invalid_argument_naming_the_culprit(mutate, fragments):
    p = valid_proto()
    mutate(p)
    with pytest.raises(tec.InvalidConfigError) as info:
        tec.load(p)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    # One error, three ways to catch it: ConfigError, ValueError, and the TF error the kernels raise.
    assert isinstance(info.value, ValueError) and isinstance(info.value, tf.errors.InvalidArgumentError)
    assert info.value.message == message


@pytest.mark.parametrize("field", ["mdl_adagrad_light", "frequency_aware_adagrad", "user_defined_program"])
def test_optimizer_we_do_not_run_is_unimplemented_by_its_proto_name(field):
    p = valid_proto()
    getattr(opt(p, 2), field).SetInParent()
    with pytest.raises(tec.UnimplementedConfigError) as info:
        tec.load(p)
    assert f"table 'query' (table_id 2): optimizer '{field}' is not implemented" in str(info.value)
    assert ": " in str(info.value).split("is not implemented by tf_embed_ops", 1)[1]  # says why
    assert isinstance(info.value, tf.errors.UnimplementedError) and isinstance(info.value, tec.ConfigError)
    assert not isinstance(info.value, tf.errors.InvalidArgumentError)


def test_mode_unspecified_is_accepted_and_reported():
    p = valid_proto()
    p.ClearField("mode")
    assert tec.load(p).mode == "UNSPECIFIED"


def test_feature_without_input_shape_is_valid():
    p = valid_proto()
    p.feature_descriptor[0].ClearField("input_shape")
    assert tec.load(p).features[0].input_shape == ()


def test_v1_config_synthesizes_one_feature_per_table():
    p = valid_proto()
    _v1(8, 3)(p)
    cfg = tec.load(p)
    assert cfg.features_synthesized
    assert [(f.table_id, f.input_shape) for f in cfg.features] == [(0, (24,)), (1, (24,)), (2, (24,))]


def test_unset_learning_rate_reads_as_constant_zero_and_accumulation_unspecified_as_enabled():
    p = valid_proto()
    opt(p, 1).ClearField("learning_rate")
    table = tec.load(p).tables[1]
    assert table.learning_rate.constant == 0.0 and not table.learning_rate.is_dynamic
    assert table.gradient_accumulation and table.gradient_accumulation_status == "UNSPECIFIED"


# ---- bytes that are not a config ----


@pytest.mark.parametrize("data", [b"garbage", b"\xff" * 16, b"\x0a\xff\xff\xff\xff\x0f", b"\x08", b"\x0a\x05ab"])
def test_garbage_bytes(data):
    with pytest.raises(tec.InvalidConfigError, match="could not parse .* bytes as a serialized"):
        tec.load(data)


def test_empty_bytes_are_a_config_without_tables():
    with pytest.raises(tec.InvalidConfigError, match="no table_descriptor"):
        tec.load(b"")


def test_every_truncation_is_an_error_or_a_valid_prefix():
    data = valid_proto().SerializeToString()
    failures = 0
    for n in range(len(data)):
        try:
            tec.load(data[:n])
        except tec.ConfigError:
            failures += 1
    # Cutting inside a field is a parse error; cutting between fields leaves a smaller message that the rules
    # reject (missing tables, features or optimizers): no prefix of this config is itself valid.
    assert failures == len(data)


def test_truncated_inside_a_field_is_a_parse_error():
    data = valid_proto().SerializeToString()
    with pytest.raises(tec.InvalidConfigError, match=f"could not parse {len(data) - 1} bytes"):
        tec.load(data[:-1])


def test_random_bytes_never_crash():
    rng = random.Random(1234)
    outcomes = {"error": 0, "valid": 0}
    seed = valid_proto().SerializeToString()
    for i in range(200):
        if i % 2:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        else:  # flip bytes of a valid config: reaches deeper into the validator than pure noise
            buf = bytearray(seed)
            for _ in range(rng.randrange(1, 4)):
                buf[rng.randrange(len(buf))] = rng.randrange(256)
            data = bytes(buf)
        try:
            cfg = tec.load(data)
            outcomes["valid"] += 1
            assert tec.load(cfg.serialize()) == cfg
        except tec.ConfigError as e:
            outcomes["error"] += 1
            assert str(e)
    assert outcomes["error"] > 0


# ---- text format ----


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('table_descriptor { name: "a" vocabulary_size: "ten" }', "vocabulary_size"),
        ('table_descriptor { name: "a" dimension: 1.5 }', "dimension"),
        ("table_descriptor { name: 7 }", "name"),
        ("mode: SOMETIMES", "SOMETIMES"),
        ("no_such_field: 1", "no_such_field"),
        ('table_descriptor { name: "a" ', 'Expected "}"'),
    ],
)
def test_text_format_errors(tmp_path, text, fragment):
    path = tmp_path / "bad.pbtxt"
    path.write_text(text)
    with pytest.raises(tec.InvalidConfigError) as info:
        tec.load(path)
    assert str(path) in str(info.value) and fragment in str(info.value)


def test_text_file_that_parses_is_still_validated(tmp_path):
    path = tmp_path / "c.pbtxt"
    path.write_text(VALID.replace("dimension: 4", "dimension: -4"))
    with pytest.raises(tec.InvalidConfigError, match="table 'user' .*dimension must be > 0, got -4"):
        tec.load(path)
