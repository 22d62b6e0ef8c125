"""The table index that keys stochastic rounding (`rounding_table_ids`, docs/low_precision.md "The random bits").

A 16-bit table's rounding bits are a function of (seed, step, table index, buffer, row, column). An embedding
splits its static tables over two update ops (in-memory tables: the fused send op; tiered tables: the tiered op);
both ops take `rounding_table_ids`, and the front ends pass every table its index among the embedding's static
tables. So an embedding mixing tiered and in-memory 16-bit tables, in any order, trains bit for bit like the same
embedding with every table in memory: that embedding (whose in-memory path is checked against numpy in
tests/test_low_precision_ops.py) is the reference here, for both tables' rows and slots. At the op level, the
reference for the default (no attr) is the op's numbering before the attr existed: the table's position in the
config, which a one-table op given that index must reproduce.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from tiered_support import cache_bytes_for

import tf_embed_ops as te
from tests.embedding_test_util import make_config
from tf_embed_ops import embedding_ops as eo
from tf_embed_ops.tiered import engine as tiered_engine

_emb = tf.tpu.experimental.embedding
VT, VU, DIM, SAMPLES, CACHE_ROWS = 40, 24, 4, 8, 12  # a step needs at most 8 distinct rows of "t" (of 40)

OPTIMIZERS = {
    "sgd": lambda: te.optimizers.SGD(0.05),
    "adagrad": lambda: te.optimizers.Adagrad(0.1, initial_accumulator_value=0.2),
    "adam": lambda: te.optimizers.Adam(0.01),
}


def _f32(v) -> np.ndarray:
    return tf.cast(v, tf.float32).numpy()


# --- the op --------------------------------------------------------------------------------------------------


def _two_table_config():
    return make_config(
        [
            {"name": "a", "vocab": 16, "dim": 8, "opt": {"name": "sgd"}, "lr": 1.0},
            {"name": "b", "vocab": 16, "dim": 8, "opt": {"name": "sgd"}, "lr": 1.0},
        ],
        [("fa", 0, [16]), ("fb", 1, [16])],
    )


def _one_table_config():
    return make_config([{"name": "b", "vocab": 16, "dim": 8, "opt": {"name": "sgd"}, "lr": 1.0}], [("fb", 0, [16])])


# Updates below half a bfloat16 step of 1.0: stochastic rounding keeps some (which ones: the bits), nearest none.
_GRAD = np.full((16, 8), -0.3 * 2.0**-7, np.float32)


def _feats(n: int) -> list:
    return [eo.normalize_feature(tf.constant(np.arange(16), tf.int64)) for _ in range(n)]


def _run_two(**kwargs) -> tuple[np.ndarray, np.ndarray]:
    a, b = tf.Variable(tf.ones([16, 8], tf.bfloat16)), tf.Variable(tf.ones([16, 8], tf.bfloat16))
    eo.send_tpu_embedding_gradients(
        [_GRAD, _GRAD], [], _feats(2), [a, b], [[], []], _two_table_config(), rounding_step=3, **kwargs
    )
    return _f32(a), _f32(b)


def _run_one(**kwargs) -> np.ndarray:
    b = tf.Variable(tf.ones([16, 8], tf.bfloat16))
    eo.send_tpu_embedding_gradients([_GRAD], [], _feats(1), [b], [[]], _one_table_config(), rounding_step=3, **kwargs)
    return _f32(b)


def test_the_default_keys_rounding_by_position_in_the_config():
    a, b = _run_two()
    # The updates were rounded stochastically (some kept, some dropped), so the bits are visible.
    assert 0 < np.count_nonzero(b != 1.0) < b.size
    # No attr: table "b" at position 1 draws what a table given index 1 draws, and not what index 0 draws.
    np.testing.assert_array_equal(_run_one(rounding_table_ids=[1]), b)
    assert not np.array_equal(_run_one(), b)
    np.testing.assert_array_equal(_run_one(rounding_table_ids=[0]), _run_one())
    # Explicit positions are the default; other ids move each table's bits with them.
    explicit = _run_two(rounding_table_ids=[0, 1])
    np.testing.assert_array_equal(explicit[0], a)
    np.testing.assert_array_equal(explicit[1], b)
    swapped = _run_two(rounding_table_ids=[1, 0])
    np.testing.assert_array_equal(swapped[0], b)
    np.testing.assert_array_equal(swapped[1], a)
    # Graphs written without the attr get the default: an empty list.
    graph = tf.Graph()
    with graph.as_default():
        table = tf.Variable(tf.ones([16, 8], tf.bfloat16))
        op = eo.send_tpu_embedding_gradients(
            [_GRAD], [], _feats(1), [table], [[]], _one_table_config(), rounding_step=0
        )
    assert op.get_attr("rounding_table_ids") == []
    assert op.type == "TfEmbed>SendTPUEmbeddingGradientsV2"


@pytest.mark.parametrize(
    ("ids", "pattern"),
    [
        ([0], r"rounding_table_ids has 1 entries; give none .* or one per table \(2\)"),
        ([0, 1, 2], r"rounding_table_ids has 3 entries"),
        ([0, -1], r"rounding_table_ids\[1\] is -1; must be >= 0"),
        ([4, 4], r"rounding_table_ids\[1\] is 4, as rounding_table_ids\[0\]"),
    ],
    ids=["short", "long", "negative", "duplicate"],
)
@pytest.mark.parametrize("op_name", ["v1", "v2"])
def test_bad_rounding_table_ids_are_rejected_by_the_op_and_change_nothing(ids, pattern, op_name):
    a, b = tf.Variable(tf.ones([16, 8], tf.bfloat16)), tf.Variable(tf.ones([16, 8], tf.bfloat16))
    feats = _feats(2)
    args = dict(
        inputs=[_GRAD, _GRAD],
        learning_rates=[],
        sample_indices_or_row_splits=[f.sample_indices_or_row_splits for f in feats],
        embedding_indices=[f.ids for f in feats],
        aggregation_weights=[f.weights for f in feats],
        sample_shapes=[f.sample_shape for f in feats],
        tables=[a.handle, b.handle],
        slots=[],
        config=eo.serialized_config(_two_table_config()),
        rounding=["nearest", "nearest"],  # V1 needs no step then: the check is the attr's, not the step's
        rounding_table_ids=ids,
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        if op_name == "v1":
            eo._ops().tf_embed_send_tpu_embedding_gradients(**args)
        else:
            eo._ops().tf_embed_send_tpu_embedding_gradients_v2(**args, rounding_step=tf.constant(0, tf.int64))
    np.testing.assert_array_equal(_f32(a), np.ones([16, 8]))
    np.testing.assert_array_equal(_f32(b), np.ones([16, 8]))


@pytest.mark.parametrize(
    ("ids", "pattern"),
    [([0], r"rounding_table_ids: expected one per table \(2\), got 1"), ([0, -2], r"rounding_table_ids: must be in")],
)
def test_the_wrapper_rejects_bad_ids_before_the_op(ids, pattern):
    a, b = tf.Variable(tf.ones([16, 8], tf.bfloat16)), tf.Variable(tf.ones([16, 8], tf.bfloat16))
    with pytest.raises(ValueError, match=pattern):
        eo.send_tpu_embedding_gradients(
            [_GRAD, _GRAD],
            [],
            _feats(2),
            [a, b],
            [[], []],
            _two_table_config(),
            rounding_step=0,
            rounding_table_ids=ids,
        )
    np.testing.assert_array_equal(_f32(a), np.ones([16, 8]))
    np.testing.assert_array_equal(_f32(b), np.ones([16, 8]))


def test_the_numbering_counts_static_tables_only():
    tables = [
        te.TableConfig(8, 2, name="t0"),
        te.DynamicTableConfig("d", 2),
        te.TableConfig(8, 2, name="t1"),
        te.TableConfig(8, 2, name="t2"),
    ]
    assert tiered_engine.rounding_table_ids(tables, [tables[3], tables[0]]) == [2, 0]
    with pytest.raises(ValueError, match=r"\['d'\] are not static tables"):
        tiered_engine.rounding_table_ids(tables, [tables[1]])


# --- te.TPUEmbedding / Keras / TPUEmbeddingV2: a tiered table before an in-memory 16-bit table -------------------


def _tables(tmp_path, optimizer, tiered: bool, dtype, dynamic: bool = False) -> list:
    """Tables "t" (tiered or in memory) then "u" (in memory), both 16-bit; with `dynamic` a 16-bit dynamic table
    "d" between them. Same initial rows either way."""
    rng = np.random.default_rng(0)
    storage = None
    if tiered:
        storage = te.Tiered(cache_bytes=cache_bytes_for(CACHE_ROWS, optimizer, DIM, dtype), directory=str(tmp_path))
    options = dict(optimizer=optimizer, storage_dtype=dtype, rounding="stochastic")
    t = te.TableConfig(
        VT, DIM, name="t", initializer=tf.constant_initializer(rng.normal(size=(VT, DIM))), storage=storage, **options
    )
    u = te.TableConfig(VU, DIM, name="u", initializer=tf.constant_initializer(rng.normal(size=(VU, DIM))), **options)
    if not dynamic:
        return [t, u]
    d = te.DynamicTableConfig("d", DIM, initializer=tf.constant_initializer(0.5), **options)
    return [t, d, u]


def _features(tables, output_shape=None) -> dict:
    # Feature order = table order: "t" first, so "u" comes after a tiered table.
    return {f"f{i}": _emb.FeatureConfig(t, name=f"f{i}", output_shape=output_shape) for i, t in enumerate(tables)}


def _batches(n: int, num_features: int) -> list:
    rng = np.random.default_rng(5)
    vocabs = [VT, 1000, VU] if num_features == 3 else [VT, VU]
    return [
        {f"f{i}": tf.constant(rng.integers(0, vocabs[i], SAMPLES), tf.int64) for i in range(num_features)}
        for _ in range(n)
    ]


def _step(emb: te.TPUEmbedding, features: dict) -> dict:
    emb.enqueue(features)
    with tf.GradientTape() as tape:
        acts = emb.dequeue()
        tape.watch(acts)
        loss = sum(tf.reduce_sum((a - 1.0) ** 2 * tf.range(1.0, DIM + 1.0)) for a in tf.nest.flatten(acts))
    emb.apply_gradients(tape.gradient(loss, acts))
    return acts


def _state(emb, name: str) -> dict:
    """`{"parameters" and each slot: float32 array}` of static table `name`, tiered or in memory."""
    for config, table in emb.tiered_tables.items():
        if config.name == name:
            values, slots = table.read_all()
            return {"parameters": values, **slots}
    [config] = [c for c in emb.embedding_tables if c.name == name]
    return {"parameters": _f32(emb.embedding_tables[config])} | {
        k: _f32(v) for k, v in emb.slot_variables[config].items()
    }


def _assert_same(a: dict, b: dict, table: str) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=f"{table}/{key}")


def _train_mixed_and_memory(tmp_path, optimizer: str, dtype, steps: int, dynamic: bool = False):
    embs = []
    for tiered in (True, False):
        emb = te.TPUEmbedding(_features(_tables(tmp_path, OPTIMIZERS[optimizer](), tiered, dtype, dynamic)))
        emb.build()
        embs.append(emb)
    mixed, memory = embs
    assert [c.name for c in mixed.tiered_tables] == ["t"]
    for features in _batches(steps, 3 if dynamic else 2):
        acts_mixed, acts_memory = _step(mixed, features), _step(memory, features)
        for key in acts_memory:
            np.testing.assert_array_equal(acts_mixed[key].numpy(), acts_memory[key].numpy(), err_msg=key)
    return mixed, memory


@pytest.mark.parametrize(
    ("optimizer", "dtype"),
    [
        ("sgd", tf.bfloat16),
        ("adagrad", tf.bfloat16),
        ("adam", tf.bfloat16),
        ("sgd", tf.float16),
        ("adagrad", tf.float16),
        ("adam", tf.float16),
    ],
    ids=lambda v: v if isinstance(v, str) else v.name,
)
def test_an_in_memory_16_bit_table_after_a_tiered_one_trains_bitwise_as_all_in_memory(tmp_path, optimizer, dtype):
    mixed, memory = _train_mixed_and_memory(tmp_path, optimizer, dtype, steps=3)
    for name in ("t", "u"):
        _assert_same(_state(mixed, name), _state(memory, name), name)
    # The in-memory op keys "u" by its index among the embedding's static tables (1), not its position in its op.
    assert mixed.rounding_arguments()["rounding_table_ids"] == [1]
    assert memory.rounding_arguments()["rounding_table_ids"] == [0, 1]


def test_a_dynamic_table_between_them_shifts_no_index(tmp_path):
    """Tiered "t", dynamic "d", in-memory "u", all bfloat16: the dynamic table is numbered among the dynamic
    tables (its own op, in both embeddings), so "u" keeps index 1 and every table trains bitwise as all in memory
    (the activations compare "d"'s rows)."""
    mixed, memory = _train_mixed_and_memory(tmp_path, "adagrad", tf.bfloat16, steps=4, dynamic=True)
    for name in ("t", "u"):
        _assert_same(_state(mixed, name), _state(memory, name), name)
    assert mixed.rounding_arguments()["rounding_table_ids"] == [1]


def _keras_model(tables):
    features = _features(tables)
    inputs = {k: keras.Input(shape=(), dtype="int64", name=k) for k in features}
    layer = te.keras.TPUEmbedding(features, name="embedding")
    acts = layer(inputs)
    head = keras.layers.Dense(1, kernel_initializer=keras.initializers.RandomNormal(seed=7), name="head")
    model = keras.Model(inputs, head(keras.layers.Concatenate()(list(acts.values()))))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model, layer


def test_keras_layer_trains_a_mixed_embedding_bitwise_as_all_in_memory(tmp_path):
    rng = np.random.default_rng(1)
    x = {"f0": rng.integers(0, VT, 32).astype(np.int64), "f1": rng.integers(0, VU, 32).astype(np.int64)}
    y = rng.normal(size=(32, 1)).astype(np.float32)
    layers = []
    for tiered in (True, False):
        model, layer = _keras_model(_tables(tmp_path, OPTIMIZERS["adam"](), tiered, tf.bfloat16))
        model.fit(x, y, batch_size=SAMPLES, epochs=1, shuffle=False, verbose=0)
        layers.append(layer)
    mixed, memory = layers
    for name in ("t", "u"):
        _assert_same(_state(mixed, name), _state(memory, name), name)


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16], ids=["bf16", "fp16"])
def test_tpu_embedding_v2_trains_a_mixed_embedding_bitwise_as_all_in_memory(tmp_path, dtype):
    embs = []
    for tiered in (True, False):
        emb = te.TPUEmbeddingV2(
            _features(_tables(tmp_path, OPTIMIZERS["adagrad"](), tiered, dtype), output_shape=[SAMPLES]),
            sparse_core_embedding_config=_emb.SparseCoreEmbeddingConfig(),
        )
        emb.build()
        embs.append(emb)
    mixed, memory = embs
    for features in _batches(3, 2):
        acts = []
        for emb in embs:
            with tf.GradientTape() as tape:
                out, batch = emb(features)
                tape.watch(out)
                loss = sum(tf.reduce_sum((a - 1.0) ** 2 * tf.range(1.0, DIM + 1.0)) for a in tf.nest.flatten(out))
            emb.apply_gradients(tape.gradient(loss, out), batch)
            acts.append(out)
        for key in acts[1]:
            np.testing.assert_array_equal(acts[0][key].numpy(), acts[1][key].numpy(), err_msg=key)
    tiered = {c.name: t for c, t in mixed.tiered_tables.items()}
    values, slots = tiered["t"].read_all()
    _assert_same({"parameters": values, **slots}, {k: _f32(v) for k, v in memory.variables["t"].items()}, "t")
    _assert_same(
        {k: _f32(v) for k, v in mixed.variables["u"].items()},
        {k: _f32(v) for k, v in memory.variables["u"].items()},
        "u",
    )
