"""Every table option survives the Keras layer's `get_config`/`from_config` and `model.save`/`load_model`.

The options are the constructor arguments of each table class (read from its signature, so a new option with no
test value here fails `test_every_option_has_test_values` and its parametrised cases); each is set to a
non-default value and compared, after the round trip, with the attribute the constructor stored, by a
comparison written here (not by the serialiser's own encoding).
"""

from __future__ import annotations

import inspect
import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.tpu.kernels import sparse_core_layout_pb2

import tf_embed_ops as te
from tf_embed_ops import keras as te_keras
from tf_embed_ops.dynamic import config as dynamic_config

emb = tf.tpu.experimental.embedding
CLASSES = {"te.TableConfig": te.TableConfig, "te.DynamicTableConfig": te.DynamicTableConfig}


def _options(cls: type) -> list[str]:
    """The options of a table class: its constructor arguments."""
    return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]


def _values() -> dict:
    """Non-default test values per option name (a list: each is one case); classes sharing a name share them."""
    return {
        "vocabulary_size": [17],
        "dim": [3],
        "name": ["renamed"],
        "combiner": ["sqrtn", "sum"],
        "initializer": [
            tf.constant_initializer(0.25),
            tf.random_uniform_initializer(-0.2, 0.3, seed=7),
            tf.random_normal_initializer(0.1, 0.2, seed=5),
            tf.zeros_initializer(),
            "zeros",
            keras.initializers.RandomNormal(0.1, 0.2, seed=3),
            keras.initializers.Constant(-0.5),
        ],
        "optimizer": [
            emb.Adagrad(0.3, initial_accumulator_value=0.2, clipvalue=(-1.0, 2.0)),
            emb.FTRL(0.2, learning_rate_power=-0.25, l1_regularization_strength=0.01, beta=0.5),
            emb.Adam(0.01, beta_1=0.8, lazy_adam=False),
            te.optimizers.RowWiseAdagrad(0.2, epsilon=1e-3),
            te.optimizers.Momentum(0.2, momentum=0.5, use_nesterov=True),
        ],
        "quantization_config": [emb.QuantizationConfig(8, -1.0, 1.0)],
        "layout": [sparse_core_layout_pb2.SparseCoreTableLayout(table_name="t", num_sparse_cores=2)],
        "dtype": [tf.int32],
        "storage_dtype": [tf.bfloat16, tf.float16],
        "slot_storage_dtype": [tf.bfloat16],
        "rounding": ["nearest", "stochastic"],
        "key_dtype": [tf.string],
        "initial_capacity": [7],
        "max_rows": [100],
        "admission": [
            te.dynamic.FrequencyAdmission(3, max_pending_keys=50, pending_ttl_steps=4),
            te.dynamic.BloomAdmission(min_count=3, num_counters=1 << 10, num_hashes=2, counter_bits=4),
        ],
        "eviction": [
            te.dynamic.LRU(50),
            te.dynamic.LFU(60),
            te.dynamic.TTL(9),
            te.dynamic.L2Norm(0.5),
            te.dynamic.DecayedLFU(40, 0.9),
            te.dynamic.CountAndAge(2, 10),
            te.dynamic.Score("log1p(count) - 0.1 * (step - last_step)", max_rows=40),
        ],
        "seed": [123],
        "eviction_log_capacity": [17],
        "storage": [te.Tiered(cache_bytes=1 << 16, directory="/nonexistent/tf_embed_ops_tiered")],
    }


# Options whose value a class refuses, with the reason (the refusal is tested instead).
NOT_APPLICABLE = {
    ("te.TableConfig", "initializer", "zeros"): "TensorFlow's TableConfig takes a callable initializer",
    # A tiered table's row file needs a directory per test: its round trip through get_config, model.save and
    # load_model is tested in test_tiered_keras.py (and the saved config's in test_tiered_training.py).
    ("te.TableConfig", "storage", None): "tested with a directory per test in test_tiered_keras.py",
    # Tiered dynamic tables train in te.TPUEmbedding only (the Keras layer refuses them); the saved config's round
    # trip of `storage` is tested in test_tiered_dynamic.py.
    ("te.DynamicTableConfig", "storage", None): "the Keras layer refuses tiered dynamic tables",
}


# The save/load cases run in the fast tier (about 2 s each); the others are marked slow.
FAST_SAVE_CASES = {
    ("te.TableConfig", "storage_dtype", 0),  # bfloat16 with stochastic rounding: the step counter
    ("te.TableConfig", "rounding", 0),  # nearest
    ("te.TableConfig", "optimizer", 3),
    ("te.DynamicTableConfig", "initializer", 0),  # tf.constant_initializer
    ("te.DynamicTableConfig", "initializer", 1),  # tf.random_uniform_initializer
    ("te.DynamicTableConfig", "admission", 0),
}


def _cases(slow_unless_in: set | None = None) -> list:
    cases = []
    values = _values()
    for class_name, cls in CLASSES.items():
        for option in _options(cls):
            for i, value in enumerate(values.get(option, [None])):
                if (class_name, option, value if isinstance(value, str) else None) in NOT_APPLICABLE:
                    continue
                slow = slow_unless_in is not None and (class_name, option, i) not in slow_unless_in
                marks = [pytest.mark.slow] if slow else []
                cases.append(pytest.param(class_name, option, i, id=f"{class_name}-{option}-{i}", marks=marks))
    return cases


def test_every_option_has_test_values():
    values = _values()
    for cls in CLASSES.values():
        missing = [o for o in _options(cls) if o not in values]
        assert not missing, f"{cls.__name__} options without a round-trip test value: {missing}"


def _table(class_name: str, option: str, value) -> object:
    kwargs = {option: value}
    if class_name == "te.DynamicTableConfig":
        kwargs.setdefault("name", "t")
        kwargs.setdefault("dim", 4)
        if option == "initial_capacity":
            kwargs["max_rows"] = 100
        return te.DynamicTableConfig(**kwargs)
    kwargs.setdefault("vocabulary_size", 10)
    kwargs.setdefault("dim", 4)
    kwargs.setdefault("name", "t")
    return te.TableConfig(**kwargs)


def _plain(value):
    """An independent canonical form of an option value, for equality."""
    if isinstance(value, tf.DType):
        return ("dtype", value.name)
    if isinstance(value, emb.QuantizationConfig):
        return ("quantization", value.num_buckets, value.lower, value.upper)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "SerializeToString"):
        return ("proto", type(value).__name__, value.SerializeToString(deterministic=True))
    if hasattr(value, "_slot_names"):  # an optimizer: its class and every plain attribute
        attrs = {k: v for k, v in vars(value).items() if isinstance(v, (bool, int, float, str, type(None)))}
        return ("optimizer", type(value).__name__, sorted(attrs.items()))
    if callable(value) and callable(getattr(value, "get_config", None)):  # an initializer
        config = value.get_config()
        # The values, where they are reproducible (a seeded or non-random initializer).
        values = np.asarray(value((3, 2), dtype=tf.float32)).tolist() if config.get("seed", 0) is not None else None
        return ("initializer", type(value).__module__, type(value).__name__, sorted(config.items()), values)
    return ("repr", repr(value))  # admission / eviction policies: their repr names every field


def _option_value(table, option):
    if option == "initializer" and dynamic_config.is_dynamic(table):
        return (table.initializer_kind, table.initializer_params, table.seed, _plain(table.initializer))
    return _plain(getattr(table, option))


def _layer(table):
    return te_keras.TPUEmbedding({"f": emb.FeatureConfig(table)}, emb.SGD(0.1), name="embedding")


@pytest.mark.parametrize("class_name,option,index", _cases())
def test_option_survives_get_config_from_config(class_name, option, index):
    values = _values()
    assert option in values, f"no round-trip test value for option {option!r}: add one (and its serialisation)"
    value = values[option][index]
    table = _table(class_name, option, value)
    try:
        layer = _layer(table)
    except ValueError as e:  # refused by the layer: the error names the table
        assert "'t'" in str(e) or "t" in str(e), e
        pytest.skip(f"the layer refuses {option}={value!r}: {e}")
    config = json.loads(json.dumps(layer.get_config()))
    rebuilt = te_keras.TPUEmbedding.from_config(config)
    t2 = rebuilt.feature_config["f"].table
    assert type(t2) is type(table)
    assert _option_value(t2, option) == _option_value(table, option)
    for other in _options(type(table)):  # and nothing else changed
        assert _option_value(t2, other) == _option_value(table, other), other


def _model(table):
    layer = _layer(table)
    dtype = "string" if getattr(table, "key_dtype", tf.int64) == tf.string else "int64"
    x = keras.Input(shape=(), dtype=dtype, name="f")
    acts = layer({"f": x})
    model = keras.Model({"f": x}, keras.layers.Dense(1, name="head")(acts["f"]))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model, layer


def _ids(table, ids):
    if getattr(table, "key_dtype", tf.int64) == tf.string:
        return tf.constant([str(i).encode() for i in ids])
    return tf.constant(ids, tf.int64)


def _fit(model, table, ids, seed=0):
    y = np.random.default_rng(seed).normal(size=(len(ids), 1)).astype(np.float32)
    model.fit({"f": _ids(table, ids)}, y, batch_size=len(ids), epochs=1, verbose=0, shuffle=False)


def _state(layer) -> dict:
    """Every table, slot and counter of the layer as numpy arrays (dynamic tables: their sorted export)."""
    out = {f"var/{v.path}": np.asarray(v.numpy()) for v in layer.weights}
    for config, table in layer.dynamic_tables.items():
        for name, value in table.export().items():
            out[f"dynamic/{config.name}/{name}"] = np.asarray(value.numpy())
    return out


def _assert_same_state(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("class_name,option,index", _cases(FAST_SAVE_CASES))
def test_option_survives_model_save_and_load_model(tmp_path, class_name, option, index):
    value = _values()[option][index]
    table = _table(class_name, option, value)
    model, layer = _model(table)
    trainable = table.dtype == tf.float32
    if trainable:  # a trained table: rows, slots, counters and dynamic keys differ from a fresh one
        _fit(model, table, [1, 2, 2, 5])
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    layer2 = loaded.get_layer("embedding")
    t2 = layer2.feature_config["f"].table
    assert type(t2) is type(table)
    for other in _options(type(table)):
        assert _option_value(t2, other) == _option_value(table, other), other
    _assert_same_state(_state(layer), _state(layer2))
    if trainable:  # and the next step (new keys, rounding bits, optimizer) is the one the original takes
        _fit(model, table, [2, 6, 8, 3], seed=1)
        _fit(loaded, t2, [2, 6, 8, 3], seed=1)
        _assert_same_state(_state(layer), _state(layer2))
