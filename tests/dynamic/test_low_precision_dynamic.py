"""16-bit dynamic tables (docs/low_precision.md): the static tables' 16-bit path through the dynamic ops.

A `te.DynamicTableConfig(storage_dtype=..., slot_storage_dtype=..., rounding=...)` stores its rows and slots in
bfloat16 or float16; the optimizer runs in float32 on the widened row, which is rounded back.  The references are
independent of the C++: float32 numpy arithmetic then numpy's / ml_dtypes' round-to-nearest-even cast for nearest
rounding, and for stochastic rounding what it must satisfy (one of the two neighbours, an unbiased mean).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from dynamic_ops_test_util import (
    DIGEST_SCRIPT_START,
    digest_in_subprocess,
    int_feature,
    make_config,
    new_table,
    schema,
    slot_defaults,
)

import tf_embed_ops as te
from tf_embed_ops.dynamic import config as dyn_config
from tf_embed_ops.dynamic import ops as dyn

NP_DTYPES = {tf.bfloat16: ml_dtypes.bfloat16, tf.float16: np.float16}


def _round_nearest(x, dtype) -> np.ndarray:
    return np.asarray(x, np.float32).astype(NP_DTYPES[dtype]).astype(np.float32)


def _neighbours(x: float, dtype) -> tuple[float, float]:
    n = NP_DTYPES[dtype]
    near = n(np.float32(x))
    up = np.nextafter(near, n(np.inf)) if float(near) < x else near
    down = np.nextafter(near, n(-np.inf)) if float(near) > x else near
    return float(down), float(up)


def _sgd_config(dim, lr=1.0):
    return make_config(
        [{"name": "t", "vocab": 1 << 20, "dim": dim, "schema": schema("stochastic_gradient_descent"), "lr": lr}],
        [("f", 0)],
    )


# ------------------------------------------------------------------------------------------------ configuration


def test_config_takes_the_table_config_storage_options_with_their_defaults():
    t = te.DynamicTableConfig("u", 4, storage_dtype=tf.bfloat16)
    assert (t.storage_dtype, t.slot_storage_dtype, t.rounding) == (tf.bfloat16, tf.bfloat16, "stochastic")
    plain = te.DynamicTableConfig("p", 4)
    assert (plain.storage_dtype, plain.slot_storage_dtype, plain.rounding) == (tf.float32, tf.float32, "stochastic")
    named = te.DynamicTableConfig("n", 4, storage_dtype="float16", slot_storage_dtype="float32", rounding="nearest")
    assert (named.storage_dtype, named.slot_storage_dtype, named.rounding) == (tf.float16, tf.float32, "nearest")
    # The same options as te.TableConfig's, declared once: same defaults.
    static = te.TableConfig(10, 4, name="s", storage_dtype=tf.bfloat16)
    assert (static.storage_dtype, static.slot_storage_dtype, static.rounding) == (
        t.storage_dtype,
        t.slot_storage_dtype,
        t.rounding,
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"storage_dtype": tf.float64},
            r"DynamicTableConfig 'u': storage_dtype=tf.float64 is not supported; "
            r"expected tf.float32, tf.bfloat16 or tf.float16",
        ),
        ({"slot_storage_dtype": "int8"}, r"DynamicTableConfig 'u': slot_storage_dtype='int8' is not supported"),
        (
            {"rounding": "up"},
            r"DynamicTableConfig 'u': rounding='up' is not supported; expected one of "
            r"\('stochastic', 'nearest'\)",
        ),
    ],
)
def test_bad_storage_options_are_refused_as_table_config_refuses_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        te.DynamicTableConfig("u", 4, **kwargs)
    # te.TableConfig gives the same message, naming its own kind of table.
    with pytest.raises(ValueError, match=message.replace("DynamicTableConfig 'u'", "TableConfig 'u'")):
        te.TableConfig(10, 4, name="u", **kwargs)


def test_config_dict_round_trip_keeps_the_storage_options():
    t = te.DynamicTableConfig("u", 4, storage_dtype=tf.float16, slot_storage_dtype=tf.bfloat16, rounding="nearest")
    fields = dyn_config.to_config_dict(t)
    back = dyn_config.from_config_dict(fields, name="u", dim=4, optimizer=None, combiner="mean", initializer=None)
    assert (back.storage_dtype, back.slot_storage_dtype, back.rounding) == (tf.float16, tf.bfloat16, "nearest")
    # A dict saved before the options existed restores a float32 table.
    for k in ("storage_dtype", "slot_storage_dtype", "rounding"):
        fields.pop(k)
    old = dyn_config.from_config_dict(fields, name="u", dim=4, optimizer=None, combiner="mean", initializer=None)
    assert (old.storage_dtype, old.slot_storage_dtype, old.rounding) == (tf.float32, tf.float32, "stochastic")


def test_handle_attrs_carry_the_storage_only_for_16_bit_tables():
    assert "storage_dtype" not in dyn_config.handle_attrs(te.DynamicTableConfig("p", 4))
    attrs = dyn_config.handle_attrs(te.DynamicTableConfig("u", 4, storage_dtype=tf.bfloat16, rounding="nearest"))
    assert (attrs["storage_dtype"], attrs["slot_storage_dtype"], attrs["rounding"]) == (
        "bfloat16",
        "bfloat16",
        "nearest",
    )


# ------------------------------------------------------------------------------------------------ the ops


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_sgd_nearest_equals_float32_numpy_then_round_to_nearest_even(dtype):
    rng = np.random.default_rng(3)
    dim, n = 24, 40
    config = _sgd_config(dim, lr=0.37)
    h = new_table(
        dim,
        max_rows=1000,
        initializer="normal",
        initializer_params=[0.0, 1.0],
        seed=5,
        storage_dtype=dtype.name,
        slot_storage_dtype=dtype.name,
        rounding="nearest",
    )
    keys = rng.integers(0, 50, n) * 1009
    feat = int_feature("dense", [[int(k)] for k in keys])
    dyn.dynamic_embedding_activations([feat], [h], 0, config, ["sum"], training=True)
    c = dyn.dynamic_table_export(h)
    start = dict(zip(c.keys.numpy().tolist(), c.weights.numpy(), strict=True))
    # The new rows are the float32 initializer rounded to nearest: the same values as a float32 table's, rounded.
    f32 = new_table(dim, max_rows=1000, initializer="normal", initializer_params=[0.0, 1.0], seed=5)
    dyn.dynamic_embedding_activations([feat], [f32], 0, config, ["sum"], training=True)
    c32 = dyn.dynamic_table_export(f32)
    np.testing.assert_array_equal(c.weights.numpy(), _round_nearest(c32.weights.numpy(), dtype))
    grads = rng.normal(size=(n, dim)).astype(np.float32)
    dyn.dynamic_send_tpu_embedding_gradients([grads], [], [feat], [h], 0, config, ["sum"])
    after = dyn.dynamic_table_export(h)
    for key, row in zip(after.keys.numpy().tolist(), after.weights.numpy(), strict=True):
        g = np.zeros(dim, np.float32)
        for i in np.flatnonzero(keys == key):
            g = g + grads[i]  # the kernel's order: input order, float32
        np.testing.assert_array_equal(row, _round_nearest(start[key] - np.float32(0.37) * g, dtype), err_msg=key)


@pytest.mark.parametrize("dtype, start, delta", [(tf.bfloat16, 1.0, 0.3 * 2.0**-7), (tf.float16, 1.0, 0.61 * 2.0**-10)])
def test_stochastic_rounding_is_unbiased(dtype, start, delta):
    """vocab x dim copies of one value get one update: the mean of their roundings is the float32 result within
    5 standard deviations of a Bernoulli mean, and every value is one of its two neighbours."""
    vocab, dim = 4096, 64
    config = _sgd_config(dim)
    target = np.float32(start) + np.float32(delta)
    down, up = _neighbours(float(target), dtype)
    assert down < target < up
    p = (float(target) - down) / (up - down)
    sigma = (up - down) * np.sqrt(p * (1 - p) / (vocab * dim))
    means = []
    for step in range(3):
        h = new_table(
            dim,
            max_rows=vocab,
            initial_capacity=vocab,
            initializer="constant",
            initializer_params=[start],
            storage_dtype=dtype.name,
            slot_storage_dtype=dtype.name,
        )
        feat = int_feature("dense", [[k] for k in range(vocab)])
        dyn.dynamic_embedding_activations([feat], [h], step, config, ["sum"], training=True)
        dyn.dynamic_send_tpu_embedding_gradients(
            [np.full((vocab, dim), -delta, np.float32)], [], [feat], [h], step, config, ["sum"]
        )
        value = dyn.dynamic_table_export(h).weights.numpy()
        assert set(np.unique(value)) <= {down, up}
        means.append(value.mean(dtype=np.float64))
        assert abs(means[-1] - float(target)) < 5 * sigma, (means[-1], float(target), sigma)
    assert len(set(means)) == 3  # each step draws other bits


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_activations_and_serving_lookup_are_float32_of_the_stored_rows(dtype):
    dim = 8
    config = _sgd_config(dim)
    h = new_table(dim, initializer="normal", initializer_params=[0.0, 1.0], storage_dtype=dtype.name)
    feat = int_feature("ragged", [[1, 2], [3], []])
    acts = dyn.dynamic_embedding_activations([feat], [h], 0, config, ["sum"], training=True)[0].numpy()
    c = dyn.dynamic_table_export(h)
    rows = dict(zip(c.keys.numpy().tolist(), c.weights.numpy(), strict=True))
    assert acts.dtype == np.float32
    np.testing.assert_array_equal(acts[0], rows[1] + rows[2])
    np.testing.assert_array_equal(acts[1], rows[3])
    np.testing.assert_array_equal(acts[2], np.zeros(dim, np.float32))
    served = dyn.dynamic_table_lookup(h, tf.constant([3, 99], tf.int64)).numpy()
    np.testing.assert_array_equal(served, np.stack([rows[3], np.zeros(dim, np.float32)]))
    # The stored rows are 16-bit values.
    np.testing.assert_array_equal(c.weights.numpy(), _round_nearest(c.weights.numpy(), dtype))


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_export_import_round_trip_is_exact_and_training_continues_identically(kind):
    """Export widens exactly and import rounds to nearest, so a 16-bit table restored from its export holds the
    same bits; stochastic rounding is keyed by the key (not the row index), so both then train identically even
    though the restored table assigned its rows in another order."""
    s = schema(kind)
    dim = 8
    config = make_config([{"name": "t", "vocab": 1 << 20, "dim": dim, "schema": s, "lr": 0.1}], [("f", 0)])
    rng = np.random.default_rng(7)
    kwargs = dict(
        initializer="normal", initializer_params=[0.0, 0.5], storage_dtype="bfloat16", slot_storage_dtype="float16"
    )
    a = new_table(dim, slot_defaults(s), **kwargs)
    feat = int_feature("dense", [[int(k)] for k in rng.integers(0, 30, 64)])
    for step in range(2):
        acts = dyn.dynamic_embedding_activations([feat], [a], step, config, ["sum"], training=True)
        dyn.dynamic_send_tpu_embedding_gradients(
            [rng.normal(size=acts[0].shape).astype(np.float32)], [], [feat], [a], step, config, ["sum"]
        )
    c = dyn.dynamic_table_export(a, len(s.slots))
    b = new_table(dim, slot_defaults(s), **kwargs)
    # Import in reversed key order: b's row indices differ from a's.
    order = np.argsort(-c.keys.numpy())
    dyn.dynamic_table_import(
        b,
        (
            c.keys.numpy()[order],
            c.weights.numpy()[order],
            [x.numpy()[order] for x in c.slots],
            c.counts.numpy()[order],
            c.last_steps.numpy()[order],
            *[t.numpy() for t in c[5:]],
        ),
    )
    cb = dyn.dynamic_table_export(b, len(s.slots))
    for x, y in zip((c.weights, *c.slots), (cb.weights, *cb.slots), strict=True):
        np.testing.assert_array_equal(x.numpy().view(np.uint32), y.numpy().view(np.uint32))
    grads = rng.normal(size=(64, dim)).astype(np.float32)
    for h in (a, b):
        dyn.dynamic_embedding_activations([feat], [h], 2, config, ["sum"], training=True)
        dyn.dynamic_send_tpu_embedding_gradients([grads], [], [feat], [h], 2, config, ["sum"])
    ca, cb = dyn.dynamic_table_export(a, len(s.slots)), dyn.dynamic_table_export(b, len(s.slots))
    for x, y in zip((ca.weights, *ca.slots), (cb.weights, *cb.slots), strict=True):
        np.testing.assert_array_equal(x.numpy().view(np.uint32), y.numpy().view(np.uint32))


def test_memory_per_row_is_halved():
    dim, rows = 64, 4096
    s = schema("adagrad")
    mem = {}
    for dtype in ("float32", "bfloat16"):
        h = new_table(
            dim, slot_defaults(s), max_rows=rows, initial_capacity=rows, storage_dtype=dtype, slot_storage_dtype=dtype
        )
        mem[dtype] = int(dyn.dynamic_table_stats(h).memory_bytes)
    # Same metadata and index; the weights and the accumulator take 2 bytes a value instead of 4.
    assert mem["float32"] - mem["bfloat16"] == rows * dim * 2 * 2


def test_checkpoint_round_trip_of_a_16_bit_table(tmp_path):
    table = te.DynamicTableConfig(
        "u",
        8,
        optimizer=te.optimizers.Adagrad(0.1),
        storage_dtype=tf.float16,
        initializer=tf.random_normal_initializer(0.0, 0.5),
    )
    feature = tf.tpu.experimental.embedding.FeatureConfig(table=table, name="f")
    emb = te.TPUEmbedding({"f": feature})
    ids = tf.constant([3, 5, 3, 11], tf.int64)
    emb.enqueue({"f": ids}, training=True)
    acts = emb.dequeue()
    emb.apply_gradients({"f": tf.ones_like(acts["f"]) * 0.37})
    saved = emb.dynamic_tables[table].export()
    path = tf.train.Checkpoint(emb=emb).write(str(tmp_path / "ckpt"))
    other = te.TPUEmbedding({"f": tf.tpu.experimental.embedding.FeatureConfig(table=table, name="f")})
    other.build()
    tf.train.Checkpoint(emb=other).read(path).assert_consumed()
    restored = other.dynamic_tables[table].export()
    for k in ("keys", "weights", "slots"):
        np.testing.assert_array_equal(restored[k].numpy(), saved[k].numpy(), err_msg=k)
    np.testing.assert_array_equal(saved["weights"].numpy(), _round_nearest(saved["weights"].numpy(), tf.float16))


_THREADS_SCRIPT = (
    DIGEST_SCRIPT_START
    + r"""
for kind, overrides, dtype in (("adagrad", {}, "bfloat16"), ("adam", {"lazy_adam": False}, "float16")):
    s = schema(kind)
    config = make_config([{"name": "t", "vocab": 1 << 20, "dim": dim, "schema": s, "overrides": overrides,
                           "lr": 0.05}], [("a", 0)])
    h = new_table(dim, slot_defaults(s), max_rows=1 << 20, initial_capacity=1024, initializer="normal",
                  initializer_params=[0.0, 0.5], storage_dtype=dtype, slot_storage_dtype=dtype)
    for step in range(2):
        a = int_feature("dense", [[int(k)] for k in rng.zipf(1.1, n) * 7919])
        acts = dyn.dynamic_embedding_activations([a], [h], step, config, ["sum"], training=True)
        out += [x.numpy().tobytes() for x in acts]
        grads = [rng.normal(size=x.shape).astype(np.float32) for x in acts]
        dyn.dynamic_send_tpu_embedding_gradients(grads, [], [a], [h], step, config, ["sum"])
    c = dyn.dynamic_table_export(h, len(s.slots))
    out += [t.numpy().tobytes() for t in (*c[:2], *c.slots, *c[3:])]
print(hashlib.sha256(b"".join(out)).hexdigest())
"""
)


@pytest.mark.slow
def test_one_and_two_threads_give_bitwise_identical_16_bit_tables():
    assert digest_in_subprocess(_THREADS_SCRIPT, 1) == digest_in_subprocess(_THREADS_SCRIPT, 2)
