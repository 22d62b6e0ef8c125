"""te.optimizers.RowWiseAdagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD) in every front end, against the numpy reference
transcribed from FBGEMM's formula (tests/numpy_reference.py, "rowwise_adagrad"; FBGEMM's source:
fbgemm_gpu/codegen/genscript/optimizers.py, rowwise_adagrad(), split_weight_update_cpu).  FBGEMM itself is the
reference of tests/test_rowwise_adagrad_fbgemm.py.  Also: the [vocabulary_size, 1] slot everywhere, the extension
field that carries it in a config, and the errors (export for a TPU, bad payloads, wrong slot shapes)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2

import tf_embed_ops
import tf_embed_ops.config as tec
import tf_embed_ops.optimizers as teo
from tests import numpy_reference
from tests import rowwise_adagrad_support as support
from tests.numpy_reference import RefTable
from tf_embed_ops import _optimizer_schema, embedding_ops
from tf_embed_ops import keras as te_keras

E = tf.tpu.experimental.embedding
LR = 0.1
RTOL, ATOL = 2e-6, 2e-6


def _reference(steps: support.Steps, optimizer, lrs, initial_accumulator=0.0):
    spec = numpy_reference.spec_from_optimizer(optimizer)
    w, slots = steps.w0, [np.full((steps.rows, 1), initial_accumulator, np.float32)]
    for step, lr in zip(steps.batches, lrs, strict=True):
        w, slots = numpy_reference.apply_step(spec, lr, w, slots, support.row_gradients(step))
    return w, slots[0]


CASES = {
    "plain": dict(),
    "l2": dict(weight_decay=0.05),
    "decoupled": dict(weight_decay=0.05, decoupled_weight_decay=True),
    "epsilon_and_initial_accumulator": dict(epsilon=0.3, initial_accumulator_value=0.5),
    # The pipeline every optimizer gets: gradient and weight clipping, TPU-style decoupled weight decay.
    "pipeline": dict(
        weight_decay=0.02,
        clipvalue=0.8,
        clip_weight_min=-1.5,
        clip_weight_max=1.5,
        weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True,
    ),
}


@pytest.mark.parametrize("kwargs", list(CASES.values()), ids=list(CASES))
@pytest.mark.parametrize("num_features", [1, 2])
def test_matches_fbgemm_formula(kwargs, num_features):
    steps = support.make_steps(num_features=num_features, seed=3)
    optimizer = teo.RowWiseAdagrad(learning_rate=LR, **kwargs)
    init = kwargs.get("initial_accumulator_value", 0.0)
    w, acc = support.run_ours(steps, optimizer, initial_accumulator=init)
    ref_w, ref_acc = _reference(steps, optimizer, [LR] * len(steps.batches), init)
    np.testing.assert_allclose(acc, ref_acc, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(w, ref_w, rtol=RTOL, atol=ATOL)
    touched = {r for step in steps.batches for r in support.row_gradients(step)}
    untouched = [r for r in range(steps.rows) if r not in touched]
    np.testing.assert_array_equal(w[untouched], steps.w0[untouched])
    np.testing.assert_array_equal(acc[untouched], np.full((len(untouched), 1), init, np.float32))


def test_dynamic_learning_rate():
    steps = support.make_steps(num_features=1, seed=4)
    rates = [0.2, 0.05, 0.1]
    optimizer = teo.RowWiseAdagrad(learning_rate=lambda: 0.0, weight_decay=0.05, decoupled_weight_decay=True)
    w, acc = support.run_ours_per_step_rates(steps, optimizer, rates)
    ref_w, ref_acc = _reference(steps, optimizer, rates)
    np.testing.assert_allclose(acc, ref_acc, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(w, ref_w, rtol=RTOL, atol=ATOL)


def test_the_accumulator_grows_by_the_mean_of_the_squared_gradient():
    # One row, one step, hand-computed: g = [3, 4] -> a = 0 + (9 + 16) / 2 = 12.5; w -= lr * g / (sqrt(12.5) + eps).
    table = E.TableConfig(4, 2, name="t", optimizer=teo.RowWiseAdagrad(0.5, epsilon=0.25), combiner="sum")
    config = tec.from_feature_config((E.FeatureConfig(table=table, name="f"),))
    w, a = tf.Variable(tf.ones([4, 2])), tf.Variable(tf.zeros([4, 1]))
    feature = embedding_ops.normalize_feature(tf.constant([2], tf.int64))
    embedding_ops.send_tpu_embedding_gradients([tf.constant([[3.0, 4.0]])], [], [feature], [w], [[a]], config)
    np.testing.assert_allclose(a.numpy()[:, 0], [0, 0, 12.5, 0])
    step = 0.5 / (np.sqrt(np.float32(12.5)) + 0.25)
    np.testing.assert_allclose(w.numpy()[2], [1 - 3 * step, 1 - 4 * step], rtol=1e-6)
    np.testing.assert_array_equal(w.numpy()[[0, 1, 3]], np.ones([3, 2]))


# ---- front ends ----


def _features(vocab=13, dim=3):
    opt = teo.RowWiseAdagrad(learning_rate=0.2, weight_decay=0.01, initial_accumulator_value=0.1)
    table = E.TableConfig(vocab, dim, name="t", combiner="sum", optimizer=opt)
    return {"a": E.FeatureConfig(table=table, name="a"), "b": E.FeatureConfig(table=table, name="b")}


def test_mid_level_api_trains_and_checkpoints_a_per_row_slot(tmp_path):
    fc = _features()
    emb = tf_embed_ops.TPUEmbedding(fc, None)
    emb.build(4)
    (table,) = emb.embedding_tables
    slot = emb.slot_variables[table]["row_accumulators"]
    assert slot.shape == (13, 1) and emb.embedding_tables[table].shape == (13, 3)
    ref = RefTable(emb.embedding_tables[table].numpy(), table.optimizer)
    rng = np.random.default_rng(5)
    for _ in range(2):
        ids = {k: [list(rng.integers(12, size=int(rng.integers(0, 3)))) for _ in range(4)] for k in fc}
        emb.enqueue({k: tf.ragged.constant(v, dtype=tf.int64, ragged_rank=1) for k, v in ids.items()})
        emb.dequeue()
        grads = {k: rng.normal(size=(4, 3)).astype(np.float32) for k in fc}
        emb.apply_gradients({k: tf.constant(v) for k, v in grads.items()})
        rows: dict = {}
        for k in fc:
            for b, bag in enumerate(ids[k]):
                for i in bag:
                    rows[int(i)] = rows.get(int(i), np.zeros(3)) + grads[k][b]
        ref.apply(rows, 0.2)
    np.testing.assert_allclose(emb.embedding_tables[table].numpy(), ref.params, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(slot.numpy(), ref.slots["row_accumulators"], rtol=2e-5, atol=2e-6)

    path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path / "ckpt"))
    restored = tf_embed_ops.TPUEmbedding(_features(), None)
    status = tf.train.Checkpoint(embedding=restored).restore(path)
    restored.build(4)  # the variables restore at creation
    status.assert_consumed()
    (table2,) = restored.embedding_tables
    np.testing.assert_array_equal(restored.slot_variables[table2]["row_accumulators"].numpy(), slot.numpy())


def test_keras_layer_fit_creates_and_updates_only_touched_rows_of_the_per_row_slot(tmp_path):
    fc = _features(vocab=20, dim=4)
    layer = te_keras.TPUEmbedding(fc, None, name="embedding")
    inputs = {k: keras.Input(shape=(None,), dtype="int64", ragged=True, name=k) for k in fc}
    acts = layer(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Concatenate()([acts["a"], acts["b"]])))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    rng = np.random.default_rng(6)
    x = {k: tf.ragged.constant([list(rng.integers(18, size=2)) for _ in range(16)], dtype=tf.int64) for k in fc}
    y = tf.constant(rng.normal(size=(16, 1)), tf.float32)
    (table,) = layer.embedding_tables
    slot = layer.slot_variables[table]["row_accumulators"]
    assert tuple(slot.shape) == (20, 1)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    acc = slot.numpy()[:, 0]
    assert np.all(acc[:18] >= 0.1) and np.any(acc[:18] > 0.1)
    np.testing.assert_array_equal(acc[18:], np.full(2, 0.1, np.float32))  # rows 18 and 19 are never looked up

    # model.save / load_model: the optimizer and its [vocab, 1] slot come back.
    path = str(tmp_path / "model.keras")
    model.save(path)
    new_layer = keras.models.load_model(path).get_layer("embedding")
    (new_table,) = new_layer.embedding_tables
    assert isinstance(new_table.optimizer, teo.RowWiseAdagrad)
    assert new_table.optimizer.weight_decay == pytest.approx(0.01)
    np.testing.assert_array_equal(new_layer.slot_variables[new_table]["row_accumulators"].numpy(), slot.numpy())


# ---- the config: an extension field, never exported for a TPU ----


def _proto(optimizer=None):
    table = E.TableConfig(8, 4, name="video", optimizer=optimizer or teo.RowWiseAdagrad(0.1, epsilon=1e-3))
    return tec.from_feature_config((E.FeatureConfig(table=table, name="f"),))


def test_config_carries_it_in_the_extension_field_and_round_trips():
    opt = teo.RowWiseAdagrad(0.05, epsilon=1e-4, weight_decay=0.3, decoupled_weight_decay=True, clipvalue=2.0)
    proto = _proto(opt)
    params = proto.table_descriptor[0].optimization_parameters
    assert params.WhichOneof("parameters") is None and _optimizer_schema.kind_of(params) == "rowwise_adagrad"
    # Serialisation keeps the unknown field (the ops' config attr is the serialized proto).
    cfg = tec.load(proto.SerializeToString())
    table = cfg.tables[0]
    assert table.optimizer.kind == "rowwise_adagrad" and not table.optimizer.in_tpu_proto
    assert table.optimizer.hyperparameters == {"epsilon": 1e-4, "weight_decay": 0.3, "decoupled_weight_decay": True}
    assert table.optimizer.slots[0].per_row and table.optimizer.slots[0].shape(8, 4) == (8, 1)
    features, optimizer = tec.to_feature_config(cfg)
    assert isinstance(optimizer, teo.RowWiseAdagrad) and optimizer.weight_decay == pytest.approx(0.3)
    assert tec.from_feature_config(features, optimizer) == proto


def test_exporting_for_a_tpu_names_the_table_and_the_optimizer():
    cfg = tec.load(_proto())
    with pytest.raises(ValueError, match=r"table 'video' uses optimizer RowWiseAdagrad \(rowwise_adagrad\)"):
        cfg.to_tpu_proto()
    with pytest.raises(ValueError, match=r"text format: table 'video' uses optimizer RowWiseAdagrad"):
        cfg.to_text()
    # TensorFlow's own TPUEmbedding builds its TPU config through _set_optimization_parameters.
    with pytest.raises(ValueError, match="RowWiseAdagrad is not a TPU optimizer"):
        teo.RowWiseAdagrad(0.1)._set_optimization_parameters(optimization_parameters_pb2.OptimizationParameters())
    with pytest.raises(NotImplementedError, match="no TPU Load op for RowWiseAdagrad"):
        teo.RowWiseAdagrad(0.1)._load()
    # A config of TPU optimizers exports as before.
    assert (
        tec.load(_proto(E.Adagrad(0.1))).to_tpu_proto().table_descriptor[0].optimization_parameters.HasField("adagrad")
    )


def _with_extension(payload: bytes, also_adagrad=False):
    proto = _proto(E.SGD(0.1))
    params = proto.table_descriptor[0].optimization_parameters
    params.ClearField("stochastic_gradient_descent")
    if also_adagrad:
        params.adagrad.SetInParent()
    schema = _optimizer_schema.schema_for_kind("rowwise_adagrad")
    assert schema.extension_field == 100001
    params.MergeFromString(bytes([0x8A, 0xEA, 0x30, len(payload)]) + payload)  # field 100001, wire type 2
    return proto


@pytest.mark.parametrize(
    "payload, also_adagrad, message",
    [
        (b"\x0d\x00\x00\x00\x00", False, r"rowwise_adagrad.epsilon must be > 0 and finite, got 0"),
        (b"\x0d\x00\x00\xc0\x7f", False, r"rowwise_adagrad.epsilon must be > 0 and finite, got nan"),
        (b"\x15\x00\x00\x80\xbf\x0d\x00\x00\x80\x3f", False, r"rowwise_adagrad.weight_decay must be >= 0"),
        (b"\x20\x01", False, r"unknown field number 4 \(it has fields 1 to 3\)"),
        (b"\x08\x01", False, r"field 1 \(epsilon\) must be a float"),
        (b"\x0d\x00\x00", False, r"field 1 \(epsilon\) must be a float"),
        (b"\x0d\x00\x00\x80\x3f", True, r"sets rowwise_adagrad \(field 100001\) and another optimization algorithm"),
    ],
    ids=["zero_epsilon", "nan_epsilon", "negative_decay", "unknown_field", "wrong_wire_type", "truncated", "both"],
)
def test_bad_extension_payload_is_refused_naming_the_table(payload, also_adagrad, message):
    with pytest.raises(tec.InvalidConfigError, match=message) as e:
        tec.load(_with_extension(payload, also_adagrad))
    assert "table 'video'" in str(e.value)


def test_defaults_follow_fbgemm_and_ranges_are_checked():
    opt = teo.RowWiseAdagrad()
    assert (opt.learning_rate, opt.epsilon, opt.weight_decay, opt.decoupled_weight_decay) == (0.01, 1e-8, 0.0, False)
    assert opt.initial_accumulator_value == 0.0
    with pytest.raises(ValueError, match=r"`epsilon` must be > 0 and finite. Received: 0"):
        teo.RowWiseAdagrad(epsilon=0)
    with pytest.raises(ValueError, match=r"`weight_decay` must be >= 0 and finite"):
        teo.RowWiseAdagrad(weight_decay=-0.1)
    with pytest.raises(ValueError, match=r"`initial_accumulator_value` must be >= 0 and finite"):
        teo.RowWiseAdagrad(initial_accumulator_value=-1.0)


def test_a_table_shaped_slot_is_refused_and_nothing_changes():
    steps = support.make_steps(rows=10, dim=4, steps=1)
    table = E.TableConfig(10, 4, name="t", optimizer=teo.RowWiseAdagrad(0.1), combiner="sum")
    config = tec.from_feature_config((E.FeatureConfig(table=table, name="f"),))
    w, wrong = tf.Variable(steps.w0), tf.Variable(tf.zeros([10, 4]))
    ids, offsets, grad = steps.batches[0][0]
    feature = embedding_ops.normalize_feature(tf.RaggedTensor.from_row_splits(ids, offsets))
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"slot 'row_accumulators' of table 't'.*\[10,4\].*"
        r"one value per row: \[10,1\]",
    ):
        embedding_ops.send_tpu_embedding_gradients([grad], [], [feature], [w], [[wrong]], config)
    np.testing.assert_array_equal(w.numpy(), steps.w0)
    np.testing.assert_array_equal(wrong.numpy(), np.zeros([10, 4]))
