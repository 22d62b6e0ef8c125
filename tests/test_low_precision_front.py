"""te.TableConfig and 16-bit storage in the front ends: validation, the mid-level API, checkpoints (stored dtype,
conversion on restore), the Keras layer and its serving lookup (docs/low_precision.md)."""

from __future__ import annotations

import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops as te
from tests.embedding_test_util import script_digest
from tests.keras_test_util import _data, _dataset, _model
from tf_embed_ops import config as te_config
from tf_embed_ops.keras import serving

emb_api = tf.tpu.experimental.embedding


# ----------------------------------------------------------------------------------------------- TableConfig


def test_table_config_defaults_and_is_a_tensorflow_table_config():
    t = te.TableConfig(10, 4, name="a", storage_dtype=tf.bfloat16)
    assert isinstance(t, emb_api.TableConfig)
    assert (t.storage_dtype, t.slot_storage_dtype, t.rounding) == (tf.bfloat16, tf.bfloat16, "stochastic")
    plain = te.TableConfig(10, 4, name="b")
    assert (plain.storage_dtype, plain.slot_storage_dtype) == (tf.float32, tf.float32)
    named = te.TableConfig(10, 4, storage_dtype="float16", slot_storage_dtype="float32", rounding="nearest")
    assert (named.storage_dtype, named.slot_storage_dtype, named.rounding) == (tf.float16, tf.float32, "nearest")
    assert "storage_dtype='float16'" in repr(named)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"storage_dtype": tf.int32}, r"TableConfig 'video': storage_dtype=tf.int32 is not supported"),
        ({"storage_dtype": "float64"}, r"TableConfig 'video': storage_dtype='float64' is not supported"),
        ({"storage_dtype": "no_such_type"}, r"TableConfig 'video': storage_dtype='no_such_type'"),
        ({"slot_storage_dtype": tf.float64}, r"TableConfig 'video': slot_storage_dtype=tf.float64"),
        ({"storage_dtype": tf.bfloat16, "rounding": "up"}, r"TableConfig 'video': rounding='up' is not supported"),
        ({"storage_dtype": tf.bfloat16, "dtype": tf.int32}, r"TableConfig 'video': storage_dtype=bfloat16 needs"),
    ],
)
def test_bad_storage_settings_are_rejected_naming_the_table_and_value(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        te.TableConfig(10, 4, name="video", **kwargs)


def test_an_unnamed_table_is_named_by_its_shape():
    with pytest.raises(ValueError, match=r"unnamed, vocabulary_size=10, dim=4.*storage_dtype=tf.int8"):
        te.TableConfig(10, 4, storage_dtype=tf.int8)


def test_the_serialized_config_has_no_storage_dtype():
    def proto(storage):
        t = te.TableConfig(100, 8, name="t", optimizer=emb_api.Adagrad(0.1), storage_dtype=storage)
        return te_config.from_feature_config({"f": emb_api.FeatureConfig(t)}).SerializeToString()

    assert proto(tf.bfloat16) == proto(tf.float32)


# ----------------------------------------------------------------------------------------------- mid-level


def _mid_level(storage, slot=None, rounding=None, optimizer=None, seed=1):
    table = te.TableConfig(
        50,
        8,
        name="t",
        combiner="sum",
        optimizer=optimizer or emb_api.Adagrad(0.1),
        initializer=tf.keras.initializers.RandomUniform(-1, 1, seed=seed),
        storage_dtype=storage,
        slot_storage_dtype=slot,
        rounding=rounding,
    )
    e = te.TPUEmbedding({"f": emb_api.FeatureConfig(table, name="f")})
    return e


def _train(e, steps=3, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        e.enqueue({"f": tf.constant(rng.integers(0, 50, 16), tf.int64)})
        acts = e.dequeue()
        e.apply_gradients({"f": tf.constant(rng.normal(size=(16, 8)), tf.float32)})
    return acts


def test_mid_level_creates_16_bit_variables_and_trains_them():
    e = _mid_level(tf.bfloat16, slot=tf.float32)
    e.build(16)
    assert e.variables["t"]["parameters"].dtype == tf.bfloat16
    assert e.variables["t"]["accumulators"].dtype == tf.float32
    # The initial table is the fp32 initializer's values rounded to nearest.
    fp32 = _mid_level(tf.float32)
    fp32.build(16)
    want = fp32.variables["t"]["parameters"].numpy().astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(e.variables["t"]["parameters"].numpy(), want)
    before = e.variables["t"]["parameters"].numpy().copy()
    acts = _train(e)
    assert acts["f"].dtype == tf.float32
    assert not np.array_equal(e.variables["t"]["parameters"].numpy(), before)
    assert int(e._rounding_step.numpy()) == 3


def test_mid_level_training_is_reproducible_and_nearest_needs_no_counter():
    runs = []
    for _ in range(2):
        e = _mid_level(tf.bfloat16)
        _train(e)
        runs.append(e.variables["t"]["parameters"].numpy())
    np.testing.assert_array_equal(runs[0], runs[1])
    nearest = _mid_level(tf.float16, rounding="nearest")
    _train(nearest)
    assert getattr(nearest, "_rounding_step", None) is None


def test_a_rejected_step_changes_neither_the_tables_nor_the_rounding_counter():
    table = te.TableConfig(50, 8, name="t", combiner="sum", optimizer=emb_api.Adagrad(0.1), storage_dtype=tf.bfloat16)
    e = te.TPUEmbedding({"f": emb_api.FeatureConfig(table, name="f")}, check_numerics=True)
    _train(e, steps=1)
    before = {k: v.numpy().copy() for k, v in e.variables["t"].items()}
    e.enqueue({"f": tf.constant([1, 2, 3, 4], tf.int64)})
    e.dequeue()
    with pytest.raises(tf.errors.InvalidArgumentError, match="check_numerics"):
        e.apply_gradients({"f": tf.fill([4, 8], float("nan"))})
    assert int(e._rounding_step.numpy()) == 1
    for k, v in e.variables["t"].items():
        np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)


# ----------------------------------------------------------------------------------------------- checkpoints


def test_checkpoint_stores_the_stored_dtype_and_restores_into_other_dtypes(tmp_path):
    e = _mid_level(tf.bfloat16)
    _train(e)
    path = tf.train.Checkpoint(emb=e).save(str(tmp_path / "bf16"))
    dtypes = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
    assert dtypes["emb/t/.ATTRIBUTES/VARIABLE_VALUE"] == tf.bfloat16
    assert dtypes["emb/t.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE"] == tf.bfloat16
    saved = tf.cast(e.variables["t"]["parameters"], tf.float32).numpy()
    saved_acc = tf.cast(e.variables["t"]["accumulators"], tf.float32).numpy()

    # 16-bit -> float32: exact.
    f32 = _mid_level(tf.float32, seed=9)
    tf.train.Checkpoint(emb=f32).restore(path)
    f32.build(16)
    np.testing.assert_array_equal(f32.variables["t"]["parameters"].numpy(), saved)
    np.testing.assert_array_equal(f32.variables["t"]["accumulators"].numpy(), saved_acc)

    # float32 -> float16 (and bfloat16): rounded to nearest; the rounding counter resumes.
    f32_path = tf.train.Checkpoint(emb=f32).save(str(tmp_path / "f32"))
    for storage, np_dtype in ((tf.float16, np.float16), (tf.bfloat16, ml_dtypes.bfloat16)):
        low = _mid_level(storage, seed=9)
        tf.train.Checkpoint(emb=low).restore(f32_path)
        low.build(16)
        assert low.variables["t"]["parameters"].dtype == storage
        np.testing.assert_array_equal(
            low.variables["t"]["parameters"].numpy(), f32.variables["t"]["parameters"].numpy().astype(np_dtype)
        )
    resumed = _mid_level(tf.bfloat16, seed=9)
    tf.train.Checkpoint(emb=resumed).restore(path)
    resumed.build(16)
    assert int(resumed._rounding_step.numpy()) == 3


# ----------------------------------------------------------------------------------------------- Keras


def _keras_feature_config():
    user = te.TableConfig(20, 4, name="user", combiner="sum", optimizer=emb_api.Adagrad(0.5), storage_dtype="bfloat16")
    item = te.TableConfig(
        20,
        4,
        name="item",
        combiner="mean",
        optimizer=emb_api.FTRL(0.3),
        storage_dtype="float16",
        slot_storage_dtype="float32",
    )
    return {
        "user": emb_api.FeatureConfig(table=user),
        "items": emb_api.FeatureConfig(table=item),
        "history": emb_api.FeatureConfig(table=item, max_sequence_length=3),
    }


def test_keras_layer_trains_16_bit_tables_and_serves_float32():
    model, layer = _model(_keras_feature_config())
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    tables = {t.name: v for t, v in layer.embedding_tables.items()}
    assert tables["user"].dtype == "bfloat16" and tables["item"].dtype == "float16"
    slots = {t.name: s for t, s in layer.slot_variables.items()}
    assert slots["item"]["accumulators"].dtype == "float32"
    before = {k: np.asarray(v.numpy(), np.float32) for k, v in tables.items()}
    xs, ys, _ = _data(32)
    model.fit(_dataset(xs, ys, 16), epochs=1, verbose=0)
    for name, v in tables.items():
        assert not np.array_equal(np.asarray(v.numpy(), np.float32), before[name]), name
    out = layer(xs)
    assert all(a.dtype == tf.float32 for a in tf.nest.flatten(out))
    # The serving composite (plain TF ops) gives the kernel's activations from the same 16-bit tables.
    with serving.serving_mode():
        served = layer(xs)
    for a, b in zip(tf.nest.flatten(out), tf.nest.flatten(served), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------------------------- threads

_THREADS_SCRIPT = r"""
import sys, hashlib
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
sys.path.insert(0, sys.argv[2])
from embedding_test_util import make_config
from tf_embed_ops import embedding_ops as eo
rng = np.random.default_rng(7)
vocab, dim, n = 20000, 32, 30000
out = []
for name, slot_dtype in (("adagrad", tf.bfloat16), ("adam", tf.float16), ("sgd", None)):
    config = make_config([{"name": "t", "vocab": vocab, "dim": dim, "opt": {"name": name}, "lr": 0.05}],
                         [("a", 0, [n])])
    table = tf.Variable(tf.cast(rng.normal(size=(vocab, dim)), tf.bfloat16))
    slots = [tf.Variable(tf.cast(rng.uniform(0.1, 1, (vocab, dim)), slot_dtype))
             for _ in range({"sgd": 0, "adagrad": 1}.get(name, 2))]
    for step in range(2):
        a = eo.normalize_feature(tf.constant(np.minimum(rng.zipf(1.1, n) - 1, vocab - 1), tf.int64))
        acts = eo.embedding_activations([a], [table], config)
        out.append(acts[0].numpy().tobytes())
        eo.send_tpu_embedding_gradients([rng.normal(size=(n, dim)).astype(np.float32)], [], [a], [table], [slots],
                                        config, rounding_step=step)
    out += [v.numpy().tobytes() for v in [table, *slots]]
print(hashlib.sha256(b"".join(out)).hexdigest())
"""


def _digest(threads: int, isa: str | None = None) -> str:
    return script_digest(_THREADS_SCRIPT, threads, isa)


@pytest.mark.slow
def test_stochastic_rounding_is_bitwise_the_same_for_one_and_two_threads_and_both_isas():
    one = _digest(1)
    assert one == _digest(2)
    assert one == _digest(2, isa="baseline")


# ----------------------------------------------------------------------------------------------- te.distribute


def _distribute_feature_config(rounding):
    video = te.TableConfig(
        11,
        3,
        name="video",
        combiner="sum",
        optimizer=emb_api.Adagrad(0.1),
        storage_dtype="bfloat16",
        rounding=rounding,
        initializer=tf.keras.initializers.Constant(0.5),
    )
    user = te.TableConfig(
        2,
        2,
        name="user",
        combiner="sum",
        optimizer=emb_api.SGD(0.2),
        storage_dtype="float16",
        rounding=rounding,
        initializer=tf.keras.initializers.Constant(0.25),
    )
    return {"watched": emb_api.FeatureConfig(video), "user": emb_api.FeatureConfig(user)}


def _distribute_batches(seed=3, n=3):
    rng = np.random.default_rng(seed)
    return [
        {
            "watched": tf.ragged.constant([[int(i) for i in rng.integers(11, size=3)] for _ in range(4)], tf.int64),
            "user": tf.constant(rng.integers(2, size=4), tf.int64),
        }
        for _ in range(n)
    ]


def _distribute_train(emb, batches):
    for features in batches:
        emb.enqueue(features)
        acts = emb.dequeue()
        emb.apply_gradients({k: 0.3 * v for k, v in acts.items()})


def _full_tables(emb):
    return {t.name: np.asarray(tf.cast(tf.convert_to_tensor(v), tf.float32)) for t, v in emb.embedding_tables.items()}


def test_sharded_16_bit_tables_round_to_nearest_as_the_single_process_class():
    from tf_embed_ops.distribute import ShardedTPUEmbedding

    sharded = ShardedTPUEmbedding(_distribute_feature_config("nearest"), num_shards=3)
    single = te.TPUEmbedding(_distribute_feature_config("nearest"))
    for emb in (sharded, single):
        emb.build(per_replica_batch_size=4)
        _distribute_train(emb, _distribute_batches())
    video = [t for t in sharded.embedding_tables if t.name == "video"][0]
    assert all(v.dtype == tf.bfloat16 for v in sharded.embedding_tables[video].variables)
    assert all(v.dtype == tf.bfloat16 for v in sharded.slot_variables[video]["accumulators"].variables)
    # Rows are independent and each row's math and rounding are the same: the tables agree bit for bit.
    for name, value in _full_tables(sharded).items():
        np.testing.assert_array_equal(value, _full_tables(single)[name], err_msg=name)
        assert not np.all(value == value.flat[0]), name  # trained away from the constant start


def test_sharded_and_synchronous_16_bit_tables_round_stochastically():
    from tf_embed_ops.distribute import ShardedTPUEmbedding, SyncSparseAggregator

    emb = ShardedTPUEmbedding(_distribute_feature_config("stochastic"), num_shards=3)
    emb.build(per_replica_batch_size=4)
    _distribute_train(emb, _distribute_batches(n=2))
    assert int(emb._rounding_step.numpy()) == 2
    after_async = _full_tables(emb)
    aggregator = SyncSparseAggregator(emb, replicas_to_aggregate=1)
    _distribute_train(emb, _distribute_batches(seed=4, n=1))
    assert int(aggregator.take_and_apply(timeout=30)) == 1
    assert int(emb._rounding_step.numpy()) == 3
    assert any(not np.array_equal(v, after_async[k]) for k, v in _full_tables(emb).items())


def test_rowwise_adagrad_per_row_slot_in_16_bits_is_the_float32_step_rounded():
    # Row-wise Adagrad's accumulator is one value per row ([vocabulary_size, 1]): the 16-bit path widens and
    # rounds rows of that width too.
    from tf_embed_ops import optimizers as teo

    def make(storage):
        table = te.TableConfig(
            20,
            8,
            name="t",
            combiner="sum",
            optimizer=teo.RowWiseAdagrad(0.5),
            storage_dtype=storage,
            rounding="nearest",
            initializer=tf.keras.initializers.Constant(0.5),
        )
        return te.TPUEmbedding({"f": emb_api.FeatureConfig(table, name="f")})

    low, f32 = make(tf.bfloat16), make(tf.float32)
    for e in (low, f32):
        e.enqueue({"f": tf.constant([1, 2, 2, 7], tf.int64)})
        e.dequeue()
        e.apply_gradients({"f": tf.constant(np.linspace(-1, 1, 32).reshape(4, 8), tf.float32)})
    assert low.variables["t"]["row_accumulators"].shape == (20, 1)
    assert low.variables["t"]["row_accumulators"].dtype == tf.bfloat16
    for name in ("parameters", "row_accumulators"):
        want = f32.variables["t"][name].numpy().astype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(low.variables["t"][name].numpy(), want, err_msg=name)
