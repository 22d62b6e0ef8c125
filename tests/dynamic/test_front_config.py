"""DynamicTableConfig and the policies: validation errors name the table and the value; the op mapping."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops.dynamic import config as dynamic_config

_emb = tf.tpu.experimental.embedding


def test_is_a_table_config_accepted_by_feature_config():
    table = te.DynamicTableConfig("users", 8, max_rows=5000)
    assert isinstance(table, _emb.TableConfig)
    assert table.vocabulary_size == 5000
    feature = _emb.FeatureConfig(table=table)
    assert feature.table is table
    assert table.initial_capacity == 1024 and table.key_dtype == tf.int64 and table.combiner == "mean"
    assert te.dynamic.DynamicTableConfig is te.DynamicTableConfig


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"key_dtype": tf.int32}, "`key_dtype` must be tf.int64 or tf.string; got tf.int32"),
        ({"key_dtype": tf.float32}, "got tf.float32"),
        ({"key_dtype": "not a dtype"}, "got 'not a dtype'"),
        ({"dim": 0}, "`dim` must be an int >= 1"),
        ({"dim": 2.0}, "`dim` must be an int >= 1 and <= 1048576; got 2.0"),
        ({"max_rows": 0}, "`max_rows` must be an int >= 1 and <= 2147483647; got 0"),
        ({"max_rows": -5}, "got -5"),
        ({"max_rows": 2**31}, "got 2147483648"),
        ({"initial_capacity": 0}, "`initial_capacity` must be an int >= 1; got 0"),
        ({"initial_capacity": -1}, "got -1"),
        ({"initial_capacity": 11, "max_rows": 10}, "`initial_capacity` (11) must be <= max_rows (10)"),
        ({"combiner": "max"}, "`combiner` must be one of 'mean', 'sum', 'sqrtn'; got 'max'"),
        ({"admission": 3}, "`admission` must be None, te.dynamic.FrequencyAdmission or te.dynamic.BloomAdmission"),
        ({"eviction": "lru"}, "`eviction` must be None, te.dynamic.LRU"),
        ({"eviction": te.dynamic.LRU(11), "max_rows": 10}, "keeps up to 11 rows, more than max_rows (10)"),
        ({"optimizer": "adam"}, "`optimizer` must be a tf_embed_ops.optimizers"),
        ({"initializer": keras.initializers.GlorotUniform()}, "(GlorotUniform) is not supported by dynamic"),
        ({"initializer": lambda shape, dtype=None: tf.zeros(shape)}, "is not supported by dynamic tables"),
        ({"initializer": "glorot_uniform"}, "initializer 'glorot_uniform' is not supported"),
        ({"initializer": keras.initializers.Constant([1.0, 2.0])}, "needs a scalar value"),
        ({"initializer": keras.initializers.RandomUniform(1.0, -1.0)}, "needs minval <= maxval"),
        ({"initializer": keras.initializers.RandomNormal(0.0, float("nan"))}, "must be finite"),
        ({"seed": 1.5}, "`seed` must be an int64; got 1.5"),
        ({"seed": 2**63}, "`seed` must be an int64"),
    ],
)
def test_bad_values_name_the_table_and_the_value(kwargs, fragment):
    with pytest.raises(ValueError) as info:
        te.DynamicTableConfig("clicks", **{"dim": 4, **kwargs})
    assert "'clicks'" in str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize("name", [None, "", 3])
def test_name_is_required(name):
    with pytest.raises(ValueError, match="`name` must be a non-empty string"):
        te.DynamicTableConfig(name, 4)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: te.dynamic.FrequencyAdmission(0), "FrequencyAdmission: `min_count` must be an int >= 1"),
        (lambda: te.dynamic.FrequencyAdmission(2, max_pending_keys=0), "`max_pending_keys` must be an int >= 1"),
        (lambda: te.dynamic.FrequencyAdmission(2, pending_ttl_steps=-1), "`pending_ttl_steps` must be an int >= 0"),
        (lambda: te.dynamic.FrequencyAdmission(True), "`min_count` must be an int >= 1 and <= 4294967295; got True"),
        (lambda: te.dynamic.LRU(0), "LRU: `max_rows` must be an int >= 1"),
        (lambda: te.dynamic.LFU(2**31), "LFU: `max_rows` must be an int >= 1 and <= 2147483647; got 2147483648"),
        (lambda: te.dynamic.TTL(0), "TTL: `steps` must be an int >= 1; got 0"),
    ],
)
def test_policy_validation(make, fragment):
    with pytest.raises(ValueError) as info:
        make()
    assert fragment in str(info.value)


class _NonConstantSlotAdagrad(te.optimizers.Adagrad):
    def _slot_initializers(self):
        return [keras.initializers.RandomUniform()]


def test_slot_initializers_must_be_constant():
    with pytest.raises(ValueError, match="'t': slot 'accumulators' of _NonConstantSlotAdagrad.*constant slot"):
        te.DynamicTableConfig("t", 4, optimizer=_NonConstantSlotAdagrad(0.1))


@pytest.mark.parametrize(
    ("initializer", "kind", "params", "seed"),
    [
        (None, "truncated_normal", [0.0, 0.5], 0),  # TableConfig's default: stddev 1/sqrt(dim)
        ("zeros", "zeros", [], 0),
        ("ones", "constant", [1.0], 0),
        (tf.zeros_initializer(), "zeros", [], 0),
        (keras.initializers.Zeros(), "zeros", [], 0),
        (keras.initializers.Ones(), "constant", [1.0], 0),
        (keras.initializers.Constant(0.25), "constant", [0.25], 0),
        (tf.constant_initializer(-2.0), "constant", [-2.0], 0),
        (keras.initializers.RandomUniform(-0.5, 0.5, seed=9), "uniform", [-0.5, 0.5], 9),
        (tf.random_uniform_initializer(0.0, 2.0, seed=4), "uniform", [0.0, 2.0], 4),
        (keras.initializers.RandomNormal(1.0, 0.5), "normal", [1.0, 0.5], 0),
        (tf.random_normal_initializer(0.0, 3.0, seed=2), "normal", [0.0, 3.0], 2),
        (keras.initializers.TruncatedNormal(0.0, 0.1, seed=5), "truncated_normal", [0.0, 0.1], 5),
        (tf.keras.initializers.TruncatedNormal(0.0, 0.1), "truncated_normal", [0.0, 0.1], 0),
    ],
)
def test_initializers_map_to_the_core_kinds(initializer, kind, params, seed):
    table = te.DynamicTableConfig("t", 4, initializer=initializer)
    attrs = dynamic_config.handle_attrs(table)
    assert attrs["initializer"] == kind
    np.testing.assert_allclose(attrs["initializer_params"], params, rtol=1e-7)
    assert attrs["seed"] == seed
    assert callable(table.initializer)  # still a valid TableConfig


def test_explicit_seed_wins_over_the_initializer_seed():
    table = te.DynamicTableConfig("t", 4, initializer=keras.initializers.RandomUniform(seed=9), seed=123)
    assert dynamic_config.handle_attrs(table)["seed"] == 123


def test_row_wise_adagrad_tables_keep_one_accumulator_value_per_row():
    """The slot widths come from the optimizer schema: RowWiseAdagrad's accumulator is 1 value per row."""
    table = te.DynamicTableConfig("rw", 8, optimizer=te.optimizers.RowWiseAdagrad(0.1))
    attrs = dynamic_config.handle_attrs(table)
    assert attrs["slot_widths"] == [1]
    assert len(attrs["slot_initial_values"]) == 1


def test_handle_attrs_carry_every_option():
    table = te.DynamicTableConfig(
        "items",
        16,
        optimizer=te.optimizers.Adam(0.01),
        combiner="sqrtn",
        key_dtype=tf.string,
        initial_capacity=64,
        max_rows=1000,
        admission=te.dynamic.FrequencyAdmission(3, max_pending_keys=500, pending_ttl_steps=7),
        eviction=te.dynamic.TTL(20),
        seed=11,
    )
    attrs = dynamic_config.handle_attrs(table, shared_name="s")
    assert attrs == {
        "shared_name": "s",
        "table_name": "items",
        "dim": 16,
        "key_dtype": tf.string,
        "slot_initial_values": [0.0, 0.0],
        "slot_widths": [16, 16],
        "initial_capacity": 64,
        "max_rows": 1000,
        "initializer": "truncated_normal",
        "initializer_params": [0.0, 0.25],
        "seed": 11,
        "admission_min_count": 3,
        "max_pending_keys": 500,
        "pending_ttl_steps": 7,
        "eviction": "ttl",
        "eviction_max_rows": 0,
        "eviction_ttl_steps": 20,
        "eviction_min_norm": 0.0,
        "eviction_decay": 1.0,
        "eviction_min_count": 0,
        "bloom_num_counters": 0,
        "bloom_num_hashes": 0,
        "bloom_counter_bits": 8,
        "log_refused": False,
        "eviction_log_capacity": 1 << 20,
    }


@pytest.mark.parametrize(
    ("eviction", "expected"),
    [
        (None, ("none", 0, 0)),
        (te.dynamic.LRU(50), ("lru", 50, 0)),
        (te.dynamic.LFU(60), ("lfu", 60, 0)),
        (te.dynamic.TTL(3), ("ttl", 0, 3)),
    ],
)
def test_eviction_attrs(eviction, expected):
    attrs = dynamic_config.handle_attrs(te.DynamicTableConfig("t", 2, max_rows=100, eviction=eviction))
    assert (attrs["eviction"], attrs["eviction_max_rows"], attrs["eviction_ttl_steps"]) == expected
    # min_count 1 (the default): no admission counters at all.
    assert (attrs["admission_min_count"], attrs["max_pending_keys"], attrs["pending_ttl_steps"]) == (1, 0, 0)


def test_global_optimizer_gives_the_slots():
    table = te.DynamicTableConfig("t", 2)
    assert dynamic_config.handle_attrs(table)["slot_initial_values"] == []
    attrs = dynamic_config.handle_attrs(table, optimizer=te.optimizers.Adagrad(0.1, initial_accumulator_value=0.3))
    np.testing.assert_allclose(attrs["slot_initial_values"], [0.3], rtol=1e-7)


def test_config_proto_entry_uses_max_rows_and_the_optimizer():
    table = te.DynamicTableConfig("users", 8, optimizer=te.optimizers.FTRL(0.2), max_rows=777)
    features = [_emb.FeatureConfig(table=table), _emb.FeatureConfig(table=table, name="second")]
    proto = dynamic_config.dynamic_config_proto(features)
    assert len(proto.table_descriptor) == 1
    descriptor = proto.table_descriptor[0]
    assert (descriptor.name, descriptor.vocabulary_size, descriptor.dimension) == ("users", 777, 8)
    assert descriptor.optimization_parameters.HasField("ftrl")
    assert descriptor.optimization_parameters.learning_rate.constant == pytest.approx(0.2)
    assert [f.table_id for f in proto.feature_descriptor] == [0, 0]


def test_config_proto_refuses_static_tables():
    static = _emb.TableConfig(10, 2, name="static")
    with pytest.raises(ValueError, match="table 'static' is not a DynamicTableConfig"):
        dynamic_config.dynamic_config_proto([_emb.FeatureConfig(table=static)])
