"""tf_embed_ops.TPUEmbedding trains like the TPU engine: checked against the numpy model in numpy_reference.

Several steps per optimizer x input kind x combiner, shared tables, sequence features, dynamic learning rates,
eager and tf.function.
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops
from tests.numpy_reference import RefFeature, RefTable
from tests.numpy_reference import ref_activations as activations
from tests.numpy_reference import ref_row_gradients as row_gradients

emb_api = tf.tpu.experimental.embedding

OPTIMIZERS = {
    "sgd": lambda lr: emb_api.SGD(lr),
    "adagrad": lambda lr: emb_api.Adagrad(lr, initial_accumulator_value=0.2),
    "adagrad_momentum": lambda lr: emb_api.AdagradMomentum(
        lr, momentum=0.7, use_nesterov=True, exponent=3.0, beta2=0.9, epsilon=1e-3
    ),
    "adam": lambda lr: emb_api.Adam(lr, beta_1=0.8, beta_2=0.95, epsilon=1e-3, sum_inside_sqrt=False),
    "adam_non_lazy": lambda lr: emb_api.Adam(lr, beta_1=0.8, beta_2=0.95, epsilon=1e-3, lazy_adam=False),
    "ftrl": lambda lr: emb_api.FTRL(
        lr, l1_regularization_strength=0.01, l2_regularization_strength=0.02, beta=0.1, initial_accumulator_value=0.3
    ),
    "ftrl_multiply_linear": lambda lr: emb_api.FTRL(
        lr, l1_regularization_strength=0.01, beta=0.05, multiply_linear_by_learning_rate=True
    ),
}
VOCAB, DIM, BATCH = 13, 3, 5
RTOL, ATOL = 2e-5, 2e-6


def _rows(rng, kind: str, batch: int = BATCH, vocab: int = VOCAB) -> tuple:
    """Random rows of ids (+ weights); dense rows hold exactly one id. Includes duplicates and empty rows."""
    if kind == "dense":
        return [[int(rng.integers(vocab))] for _ in range(batch)], None
    rows = [list(rng.integers(vocab, size=int(rng.integers(0, 4)))) for _ in range(batch)]
    rows[0] = [1, 1, 4]  # a duplicate inside one sample
    rows[-1] = []  # an empty sample
    weights = [list(rng.uniform(0.5, 2.0, size=len(r))) for r in rows]
    return [[int(i) for i in r] for r in rows], weights


def _to_tf(kind: str, rows: list, weights: list | None):
    if kind == "dense":
        return tf.constant([r[0] for r in rows], tf.int64), None
    ragged = tf.ragged.constant(rows, dtype=tf.int64, ragged_rank=1)
    w = None if weights is None else tf.ragged.constant(weights, dtype=tf.float32, ragged_rank=1)
    if kind == "ragged":
        return ragged, w
    return ragged.to_sparse(), (None if w is None else w.to_sparse())


def _run_steps(emb, ref_tables, feature_config, steps, use_function, targets_fn, lr_values=None):
    """Runs `steps` (list of {name: (RefFeature, tf_input, tf_weight)}) on emb and on the reference."""

    def tf_step(features, weights, targets):
        emb.enqueue(features, weights=weights, training=True)
        with tf.GradientTape() as tape:
            acts = emb.dequeue()
            tape.watch(acts)
            loss = tf.add_n([0.5 * tf.reduce_sum((acts[k] - targets[k]) ** 2) for k in acts])
        dacts = tape.gradient(loss, acts)
        emb.apply_gradients(dacts)
        return acts, dacts

    step_fn = tf.function(tf_step) if use_function else tf_step
    for n, batch in enumerate(steps):
        if lr_values is not None:
            lr_values(n)
        features = {k: v[1] for k, v in batch.items()}
        weights = {k: v[2] for k, v in batch.items()}
        if all(w is None for w in weights.values()):
            weights = None
        # Reference forward; its backward runs on the activation gradients the op received (an input of the
        # op, computed by TensorFlow's autodiff from the float32 activations checked here).
        grads: dict = {name: {} for name in ref_tables}
        ref_acts, targets = {}, {}
        for k, (ref, _, _) in batch.items():
            fc = feature_config[k]
            ref_acts[k] = activations(ref, ref_tables[fc.table.name].params, fc.table.combiner)
            targets[k] = targets_fn(k, ref_acts[k].shape)
        acts, dacts = step_fn(features, weights, {k: tf.constant(v, tf.float32) for k, v in targets.items()})
        for k, (ref, _, _) in batch.items():
            np.testing.assert_allclose(acts[k].numpy(), ref_acts[k], rtol=RTOL, atol=ATOL, err_msg=f"step {n} {k}")
            fc = feature_config[k]
            row_gradients(ref, dacts[k].numpy(), fc.table.combiner, grads[fc.table.name])
        for name, table in ref_tables.items():
            lr = table.opt.learning_rate
            table.apply(grads[name], float(lr()) if callable(lr) else lr)


def _check_state(emb, ref_tables):
    for table_config, var in emb.embedding_tables.items():
        ref = ref_tables[table_config.name]
        np.testing.assert_allclose(var.numpy(), ref.params, rtol=RTOL, atol=ATOL, err_msg=table_config.name)
        for slot, slot_var in emb.slot_variables[table_config].items():
            np.testing.assert_allclose(
                slot_var.numpy(), ref.slots[slot], rtol=RTOL, atol=ATOL, err_msg=f"{table_config.name}/{slot}"
            )


def _setup(optimizer_name: str, combiner: str, seed: int = 0, lr=0.1):
    shared = emb_api.TableConfig(VOCAB, DIM, combiner=combiner, name="shared")
    feature_config = {
        "a": emb_api.FeatureConfig(table=shared, name="a"),
        "b": emb_api.FeatureConfig(table=shared, name="b"),  # two features on one table: gradients accumulate
    }
    emb = tf_embed_ops.TPUEmbedding(feature_config, OPTIMIZERS[optimizer_name](lr))
    emb.build()
    ref_tables = {"shared": RefTable(emb.embedding_tables[shared].numpy(), shared.optimizer)}
    return emb, feature_config, ref_tables


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("kind", ["dense", "sparse", "ragged"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_matches_reference_over_several_steps(optimizer_name, kind, combiner):
    if kind == "dense" and combiner != "mean":
        pytest.skip("dense inputs hold one id per sample: every combiner is the identity")
    emb, feature_config, ref_tables = _setup(optimizer_name, combiner)
    rng = np.random.default_rng(7)
    steps = []
    for _ in range(3):
        batch = {}
        for k in ("a", "b"):
            rows, weights = _rows(rng, kind)
            x, w = _to_tf(kind, rows, weights)
            batch[k] = (RefFeature("shared", rows, weights), x, w)
        steps.append(batch)
    target_rng = np.random.default_rng(3)
    targets_fn = lambda k, shape: target_rng.normal(size=shape)
    _run_steps(emb, ref_tables, feature_config, steps, use_function=False, targets_fn=targets_fn)
    _check_state(emb, ref_tables)


@pytest.mark.parametrize("optimizer_name", ["adagrad", "adam", "ftrl"])
def test_tf_function_with_enqueue_dequeue_apply_in_one_function(optimizer_name):
    emb, feature_config, ref_tables = _setup(optimizer_name, "sqrtn")
    rng = np.random.default_rng(11)
    steps = []
    for _ in range(3):
        batch = {}
        for k in ("a", "b"):
            rows, weights = _rows(rng, "ragged")
            x, w = _to_tf("ragged", rows, weights)
            batch[k] = (RefFeature("shared", rows, weights), x, w)
        steps.append(batch)
    target_rng = np.random.default_rng(5)
    _run_steps(emb, ref_tables, feature_config, steps, True, lambda k, shape: target_rng.normal(size=shape))
    _check_state(emb, ref_tables)


@pytest.mark.parametrize("kind", ["sparse", "ragged"])
@pytest.mark.parametrize("use_function", [False, True])
def test_sequence_feature_is_truncated_and_trained(kind, use_function):
    table = emb_api.TableConfig(VOCAB, DIM, combiner="sum", name="seq")
    feature_config = {"s": emb_api.FeatureConfig(table=table, max_sequence_length=3, name="s")}
    emb = tf_embed_ops.TPUEmbedding(feature_config, emb_api.Adagrad(0.2))
    emb.build()
    ref_tables = {"seq": RefTable(emb.embedding_tables[table].numpy(), table.optimizer)}
    rows = [[1, 2, 3, 4, 5], [2], [], [7, 7]]  # row 0 is longer than L = 3: ids 4 and 5 are dropped
    x, _ = _to_tf(kind, rows, None)
    steps = [{"s": (RefFeature("seq", rows, None, max_sequence_length=3), x, None)}] * 2
    target_rng = np.random.default_rng(1)
    _run_steps(emb, ref_tables, feature_config, steps, use_function, lambda k, s: target_rng.normal(size=s))
    _check_state(emb, ref_tables)
    acts = emb({"s": x})["s"]
    assert acts.shape == (4, 3, DIM)


def test_tables_with_their_own_optimizers_and_dynamic_learning_rates_in_tag_order():
    lr_a = tf.Variable(0.1)
    lr_b = tf.Variable(0.3)
    fn_a = lambda: lr_a
    fn_b = lambda: lr_b
    t_c = emb_api.TableConfig(VOCAB, DIM, combiner="sum", name="c", optimizer=emb_api.Adagrad(fn_a))
    t_a = emb_api.TableConfig(VOCAB, DIM, combiner="mean", name="a", optimizer=emb_api.SGD(fn_b))
    t_b = emb_api.TableConfig(VOCAB, DIM, combiner="sum", name="b", optimizer=emb_api.FTRL(0.5))
    t_d = emb_api.TableConfig(VOCAB, DIM, combiner="sum", name="d")  # takes the global optimizer, same callable
    feature_config = {
        "f0": emb_api.FeatureConfig(table=t_c),
        "f1": emb_api.FeatureConfig(table=t_a),
        "f2": emb_api.FeatureConfig(table=t_b),
        "f3": emb_api.FeatureConfig(table=t_d),
    }
    emb = tf_embed_ops.TPUEmbedding(feature_config, emb_api.Adam(fn_b, beta_1=0.5, beta_2=0.9))
    emb.build()
    assert type(t_d.optimizer).__name__ == "Adam" and type(t_c.optimizer).__name__ == "Adagrad"
    tags = {t.name: t.optimization_parameters.learning_rate for t in emb.config_proto.table_descriptor}
    assert tags["c"].dynamic.tag == 0 and tags["a"].dynamic.tag == 1 and tags["d"].dynamic.tag == 1
    assert tags["b"].constant == pytest.approx(0.5)

    ref_tables = {t.name: RefTable(emb.embedding_tables[t].numpy(), t.optimizer) for t in (t_c, t_a, t_b, t_d)}
    rng = np.random.default_rng(2)
    steps = []
    for _ in range(3):
        batch = {}
        for k, t in zip(("f0", "f1", "f2", "f3"), ("c", "a", "b", "d"), strict=False):
            rows, weights = _rows(rng, "ragged")
            x, w = _to_tf("ragged", rows, weights)
            batch[k] = (RefFeature(t, rows, weights), x, w)
        steps.append(batch)

    def set_lr(step):  # the learning rates change between steps; apply_gradients must read the new values
        lr_a.assign([0.1, 0.02, 0.3][step])
        lr_b.assign([0.3, 0.05, 0.01][step])

    target_rng = np.random.default_rng(9)
    _run_steps(emb, ref_tables, feature_config, steps, True, lambda k, s: target_rng.normal(size=s), set_lr)
    _check_state(emb, ref_tables)


def test_clipping_and_weight_decay_are_passed_through():
    table = emb_api.TableConfig(VOCAB, DIM, combiner="sum", name="t")
    optimizer = emb_api.Adagrad(
        0.5,
        clipvalue=0.3,
        clip_weight_min=-0.4,
        clip_weight_max=0.4,
        weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True,
    )
    feature_config = {"x": emb_api.FeatureConfig(table=table)}
    emb = tf_embed_ops.TPUEmbedding(feature_config, optimizer)
    emb.build()
    ref_tables = {"t": RefTable(emb.embedding_tables[table].numpy(), optimizer)}
    rng = np.random.default_rng(4)
    steps = []
    for _ in range(2):
        rows, weights = _rows(rng, "sparse")
        x, w = _to_tf("sparse", rows, weights)
        steps.append({"x": (RefFeature("t", rows, weights), x, w)})
    _run_steps(emb, ref_tables, feature_config, steps, False, lambda k, s: np.full(s, 3.0))
    _check_state(emb, ref_tables)


@pytest.mark.parametrize("name, lazy", [("adam", True), ("adam_non_lazy", False), ("adagrad", True)])
def test_untouched_rows_stay_unchanged_for_lazy_optimizers_and_change_for_non_lazy_adam(name, lazy):
    emb, _, _ = _setup(name, "sum")
    table = next(iter(emb.embedding_tables))

    def step(a, b):
        emb.enqueue({"a": tf.constant(a, tf.int64), "b": tf.constant(b, tf.int64)})
        acts = emb.dequeue()
        emb.apply_gradients({k: tf.ones_like(v) for k, v in acts.items()})

    step([2, 3], [3, 3])  # rows 2 and 3 get momentum
    before = emb.embedding_tables[table].numpy().copy()
    step([4], [4])  # only row 4 is touched now
    after = emb.embedding_tables[table].numpy()
    assert not np.allclose(after[4], before[4])
    never = [r for r in range(VOCAB) if r not in (2, 3, 4)]
    np.testing.assert_array_equal(after[never], before[never])  # no momentum, no gradient: no change at all
    # Rows with momentum but no gradient this step move only when every row is updated (non-lazy Adam).
    assert np.array_equal(after[[2, 3]], before[[2, 3]]) == lazy


@contextlib.contextmanager
def _absl_warnings_captured(caplog):
    """caplog sees absl's WARNING records whatever earlier tests in the process did to the `absl` logger (its level,
    its propagation to the root logger, where caplog listens) or to `logging.disable`: under xdist a test's
    neighbours vary, and one of them (in TensorFlow 2.16's run only) left absl's warnings out of caplog."""
    absl_logger = logging.getLogger("absl")
    saved = (absl_logger.level, logging.root.manager.disable)
    absl_logger.addHandler(caplog.handler)
    absl_logger.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    try:
        yield
    finally:
        absl_logger.removeHandler(caplog.handler)
        absl_logger.setLevel(saved[0])
        logging.disable(saved[1])


def test_none_gradient_sends_zero_with_a_warning(caplog):
    emb, _, _ = _setup("adagrad", "sum")
    table = next(iter(emb.embedding_tables))
    before = emb.embedding_tables[table].numpy().copy()
    emb.enqueue({"a": tf.constant([2], tf.int64), "b": tf.constant([5], tf.int64)})
    acts = emb.dequeue()
    with _absl_warnings_captured(caplog):
        emb.apply_gradients({"a": tf.ones_like(acts["a"]), "b": None})
    after = emb.embedding_tables[table].numpy()
    assert not np.allclose(after[2], before[2])
    np.testing.assert_array_equal(after[5], before[5])  # Adagrad with a zero gradient is a no-op
    assert "No gradient passed for feature b" in caplog.text


def test_dense_inputs_of_shape_b1_and_lookup_only_call():
    table = emb_api.TableConfig(VOCAB, DIM, name="t")
    emb = tf_embed_ops.TPUEmbedding({"x": emb_api.FeatureConfig(table=table)}, emb_api.SGD(0.1))
    ids = tf.constant([[3], [0], [12]], tf.int64)
    out = emb({"x": ids})["x"]
    assert out.shape == (3, DIM)  # TPU dequeue shape (docs/semantics.md): the trailing 1 is reduced
    np.testing.assert_array_equal(out.numpy(), emb.embedding_tables[table].numpy()[[3, 0, 12]])


@pytest.mark.parametrize("use_function", [False, True])
def test_an_empty_first_batch_does_not_fix_the_input_shape(use_function):
    """A first batch of zero samples gives [0, dim] activations (as `tf.nn.embedding_lookup` does) and trains
    nothing; it does not write a zero `input_shape` into the configuration, which would refuse every later batch."""
    table = emb_api.TableConfig(VOCAB, DIM, name="t", initializer=tf.ones_initializer())
    emb = tf_embed_ops.TPUEmbedding({"x": emb_api.FeatureConfig(table=table)}, emb_api.SGD(0.5))

    def step(ids):
        emb.enqueue({"x": ids})
        with tf.GradientTape() as tape:
            acts = emb.dequeue()
            tape.watch(acts)
            loss = tf.reduce_sum(acts["x"])
        emb.apply_gradients(tape.gradient(loss, acts))
        return acts["x"]

    run = tf.function(step) if use_function else step
    empty = run(tf.constant([], tf.int64))
    assert empty.shape == (0, DIM)
    assert list(emb.config_proto.feature_descriptor[0].input_shape) == []  # still unknown
    np.testing.assert_array_equal(emb.embedding_tables[table].numpy(), np.ones((VOCAB, DIM), np.float32))
    out = run(tf.constant([3, 0, 3], tf.int64))
    assert out.shape == (3, DIM)
    assert list(emb.config_proto.feature_descriptor[0].input_shape) == [3]
    expected = np.ones((VOCAB, DIM), np.float32)
    expected[3] -= 2 * 0.5  # id 3 twice: gradient 2, SGD lr 0.5
    expected[0] -= 0.5
    np.testing.assert_allclose(emb.embedding_tables[table].numpy(), expected)
    assert run(tf.constant([], tf.int64)).shape == (0, DIM)  # an empty batch later is fine too


def test_table_initializer_and_slot_variable_creation_fn_are_honoured():
    created = []

    def slot_fn(table_var, slot_names, initializers):
        created.append(list(slot_names))
        return {
            n: tf.Variable(init(table_var.shape, dtype=tf.float32) + 0.5, name=f"custom_{n}")
            for n, init in zip(slot_names, initializers, strict=False)
        }

    table = emb_api.TableConfig(4, 2, name="t", initializer=tf.initializers.Constant(0.25))
    emb = tf_embed_ops.TPUEmbedding(
        {"x": emb_api.FeatureConfig(table=table)},
        emb_api.FTRL(0.1, initial_accumulator_value=0.2, slot_variable_creation_fn=slot_fn),
    )
    emb.build()
    assert created == [["accumulators", "linears"]]
    np.testing.assert_array_equal(emb.embedding_tables[table].numpy(), np.full((4, 2), 0.25, np.float32))
    slots = emb.slot_variables[table]
    assert list(slots) == ["accumulators", "linears"]
    np.testing.assert_allclose(slots["accumulators"].numpy(), 0.7)
    np.testing.assert_allclose(slots["linears"].numpy(), 0.5)
