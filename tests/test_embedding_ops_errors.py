"""Bad inputs to the fused embedding ops: each is rejected with an error naming what is wrong, and a rejected
SendTPUEmbeddingGradients call leaves every table and slot bitwise unchanged.  Also shape functions and the
static checks of the Python wrappers."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import tensorflow as tf
from embedding_test_util import make_config

from tf_embed_ops import embedding_ops as eo

OPT = {"name": "adam"}
VOCAB, DIM = 10, 3


def _setup(lr=0.1):
    config = make_config(
        [{"name": "video", "vocab": VOCAB, "dim": DIM, "opt": OPT, "lr": lr}],
        [("watched", 0, [3]), ("liked", 0, [2])],
    )
    rng = np.random.default_rng(0)
    table = tf.Variable(rng.normal(size=(VOCAB, DIM)).astype(np.float32))
    slots = [tf.Variable(rng.normal(size=(VOCAB, DIM)).astype(np.float32)) for _ in range(2)]
    feats = [
        eo.normalize_feature(tf.ragged.constant([[1, 2], [], [9]], dtype=tf.int64)),
        eo.normalize_feature(tf.constant([0, 9], tf.int64)),
    ]
    grads = [tf.ones([3, DIM]), tf.ones([2, DIM])]
    return config, table, slots, feats, grads


def _snapshot(table, slots):
    return [v.numpy().copy() for v in [table, *slots]]


def _assert_unchanged(before, table, slots):
    for old, var in zip(before, [table, *slots], strict=False):
        np.testing.assert_array_equal(var.numpy(), old)


@contextlib.contextmanager
def _refused_changing_nothing(table, slots, match, error=tf.errors.InvalidArgumentError):
    """The block raises `error` matching `match`, and the table and its slots keep every value."""
    before = _snapshot(table, slots)
    with pytest.raises(error, match=match):
        yield
    _assert_unchanged(before, table, slots)


def _send(config, table, slots, feats, grads, lrs=(), combiners=None):
    eo.send_tpu_embedding_gradients(grads, list(lrs), feats, [table], [slots], config, combiners)


@pytest.mark.parametrize(
    "bad_ids, message",
    [
        ([0, 10], r"feature 1 \('liked'\): ids\[1\] = 10 is not in \[0, 10\)"),
        ([-1, 3], r"feature 1 \('liked'\): ids\[0\] = -1 is not in \[0, 10\)"),
    ],
)
def test_out_of_range_id_changes_nothing(bad_ids, message):
    config, table, slots, feats, grads = _setup()
    feats[1] = eo.normalize_feature(tf.constant(bad_ids, tf.int64))
    with _refused_changing_nothing(table, slots, message):
        _send(config, table, slots, feats, grads)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        eo.embedding_activations(feats, [table], config)


def test_first_and_last_valid_ids_are_accepted():
    """Ids 0 and VOCAB - 1 are looked up and updated like any other row (no off-by-one at either end)."""
    config, table, slots, feats, grads = _setup()
    feats[1] = eo.normalize_feature(tf.constant([0, VOCAB - 1], tf.int64))
    for slot in slots:  # Adam's momenta and velocities start at 0
        slot.assign(tf.zeros([VOCAB, DIM]))
    w = table.numpy().copy()

    acts = eo.embedding_activations(feats, [table], config)
    np.testing.assert_array_equal(acts[1].numpy(), w[[0, VOCAB - 1]])  # 'liked': one id per sample
    np.testing.assert_array_equal(acts[0].numpy()[2], w[VOCAB - 1])  # 'watched' row 2 = [9]

    _send(config, table, slots, feats, grads)
    # All-ones upstream gradients, sum combiner: 'watched' touches rows 1, 2 and 9, 'liked' rows 0 and 9, so
    # the summed gradient is 1 for rows 0, 1, 2 and 2 for row 9.  Adam (beta1 0.9, beta2 0.999, epsilon 1e-7,
    # epsilon inside the square root, no bias correction) from zero slots, lr 0.1.
    g = np.zeros((VOCAB, DIM), np.float32)
    g[[0, 1, 2]] = 1.0
    g[VOCAB - 1] = 2.0
    one = np.float32(1)
    m = (one - np.float32(0.9)) * g  # 1 - beta in float32, as the kernel computes it
    v = (one - np.float32(0.999)) * g * g
    expected = w - np.float32(0.1) * m / np.sqrt(v + np.float32(1e-7) ** 2)
    touched = [0, 1, 2, VOCAB - 1]
    np.testing.assert_allclose(table.numpy()[touched], expected[touched], rtol=1e-6)
    np.testing.assert_allclose(slots[0].numpy()[touched], m[touched], rtol=1e-6)
    np.testing.assert_allclose(slots[1].numpy()[touched], v[touched], rtol=1e-6)
    untouched = [3, 4, 5, 6, 7, 8]
    np.testing.assert_array_equal(table.numpy()[untouched], w[untouched])
    np.testing.assert_array_equal(slots[1].numpy()[untouched], 0.0)


def test_wrong_gradient_shape_changes_nothing():
    config, table, slots, feats, grads = _setup()
    grads[0] = tf.ones([3, DIM + 1])
    with _refused_changing_nothing(table, slots, r"watched|shape", (tf.errors.InvalidArgumentError, ValueError)):
        _send(config, table, slots, feats, grads)


def test_wrong_gradient_shape_inside_function_changes_nothing():
    config, table, slots, feats, grads = _setup()
    before = _snapshot(table, slots)

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def step(g0):
        _send(config, table, slots, feats, [g0, grads[1]])

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature 0 \('watched'\): the gradient .* \[3,3\]"):
        step(tf.ones([4, DIM]))
    _assert_unchanged(before, table, slots)


def test_wrong_learning_rate_count_changes_nothing():
    config, table, slots, feats, grads = _setup(lr=("dynamic", 0))
    before = _snapshot(table, slots)
    with pytest.raises(tf.errors.InvalidArgumentError, match="learning_rates has 0 entries .* 1 dynamic"):
        _send(config, table, slots, feats, grads, lrs=())
    with pytest.raises(tf.errors.InvalidArgumentError, match="learning_rates has 2 entries"):
        _send(config, table, slots, feats, grads, lrs=(0.1, 0.2))
    _assert_unchanged(before, table, slots)
    _send(config, table, slots, feats, grads, lrs=(0.1,))  # the right count works


def test_wrong_number_of_slot_handles_changes_nothing():
    config, table, slots, feats, grads = _setup()
    with _refused_changing_nothing(table, slots, "slots has 1 handles .* 2 slots"):
        _send(config, table, slots[:1], feats, grads)


def test_wrong_number_of_tables_changes_nothing():
    config, table, slots, feats, grads = _setup()
    other = tf.Variable(np.zeros((VOCAB, DIM), np.float32))
    with _refused_changing_nothing(table, slots, "2 table handles but config has 1"):
        eo.send_tpu_embedding_gradients(grads, [], feats, [table, other], [slots, []], config)


@pytest.mark.parametrize("which", ["table", "slot"])
def test_wrong_variable_shape_changes_nothing(which):
    config, table, slots, feats, grads = _setup()
    if which == "table":
        table = tf.Variable(np.zeros((VOCAB + 1, DIM), np.float32))
        pattern = r"table 'video': the variable has shape \[11,3\]"
    else:
        slots[1] = tf.Variable(np.zeros((VOCAB, DIM + 1), np.float32))
        pattern = r"slot 'velocities' of table 'video' .* has shape \[10,4\]"
    with _refused_changing_nothing(table, slots, pattern):
        _send(config, table, slots, feats, grads)


def test_wrong_variable_dtype_changes_nothing():
    config, table, slots, feats, grads = _setup()
    slots[0] = tf.Variable(np.zeros((VOCAB, DIM), np.float64))
    with _refused_changing_nothing(
        table, slots, r"slot 'momenta' .* must be float32, bfloat16 or float16 \(half\), got double"
    ):
        _send(config, table, slots, feats, grads)


def test_same_variable_twice_changes_nothing():
    config, table, slots, feats, grads = _setup()
    with _refused_changing_nothing(table, slots, "the same variable is passed twice"):
        _send(config, table, [slots[0], slots[0]], feats, grads)


@pytest.mark.parametrize(
    "feature, message",
    [
        (eo.FeatureInput([0, 2, 1, 3], [1, 2, 3], [], [3]), "row_splits must be non-decreasing"),
        (eo.FeatureInput([0, 1, 2, 4], [1, 2, 3], [], [3]), r"row_splits\[3\] = 4 must equal the number of ids, 3"),
        (eo.FeatureInput([0, 1, 3], [1, 2, 3], [], [3]), "B \\+ 1 row_splits"),
        (eo.FeatureInput([[0, 0], [3, 0]], [1, 2], [], [3]), r"indices\[1, 0\] = 3 is not in \[0, 3\)"),
        (eo.FeatureInput([[0, 0], [1, 0]], [1, 2], [1.0], [3]), "has 1 weights for 2 ids"),
        (eo.FeatureInput(np.zeros([0], np.int64), [1, 2], [], [3]), "has 2 ids but sample_shape \\[3\\] has 3"),
    ],
)
def test_malformed_feature_changes_nothing(feature, message):
    config, table, slots, feats, grads = _setup()
    feats[0] = feature
    with _refused_changing_nothing(table, slots, message):
        _send(config, table, slots, feats, grads)


def test_bad_combiner_and_feature_count():
    config, table, slots, feats, grads = _setup()
    with pytest.raises(ValueError, match="combiners\\[0\\]"):
        eo.embedding_activations(feats, [table], config, ["max"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="combiners has 3 entries"):
        eo.embedding_activations(feats, [table], config, ["sum"] * 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="the op has 1 features but config has 2"):
        eo.embedding_activations(feats[:1], [table], config)


def test_unimplemented_optimizer_is_named():
    config, table, slots, feats, grads = _setup()
    config.table_descriptor[0].optimization_parameters.mdl_adagrad_light.l2 = 0.1
    with pytest.raises(tf.errors.UnimplementedError, match="video.*mdl_adagrad_light"):
        eo.embedding_activations(feats, [table], config)


def test_static_misuse_is_value_error():
    config, table, slots, feats, grads = _setup()
    with pytest.raises(ValueError, match="gradients"):
        eo.send_tpu_embedding_gradients(grads[:1], [], feats, [table], [slots], config)
    with pytest.raises(ValueError, match="slots"):
        eo.send_tpu_embedding_gradients(grads, [], feats, [table], [], config)
    with pytest.raises(ValueError, match="tables\\[0\\]"):
        eo.embedding_activations(feats, [table.numpy()], config)
    with pytest.raises(ValueError, match="features\\[0\\]"):
        eo.embedding_activations([tf.constant([1])], [table], config)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: eo.normalize_feature(tf.constant([[1, 2]])), "last dimension of 1"),
        (lambda: eo.normalize_feature(tf.constant(3)), "rank >= 1"),
        (lambda: eo.normalize_feature(tf.constant([1]), weights=tf.constant([1.0])), "dense input takes no weights"),
        (lambda: eo.normalize_feature(tf.ragged.constant([[[1]]])), "rank 2"),
        (lambda: eo.normalize_feature(tf.SparseTensor([[0]], tf.constant([1], tf.int64), [2])), "rank >= 2"),
        (
            lambda: eo.normalize_feature(tf.ragged.constant([[1]]), weights=tf.constant([1.0])),
            "weights: must be a RaggedTensor",
        ),
        (lambda: eo.normalize_feature(tf.constant([1.0])), "integers"),
    ],
)
def test_normalize_feature_rejects(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_sequence_truncation_in_normalize():
    f = eo.normalize_feature(tf.ragged.constant([[1, 2, 3], [4]], dtype=tf.int64), max_sequence_length=2)
    np.testing.assert_array_equal(f.ids, [1, 2, 4])
    np.testing.assert_array_equal(f.sample_indices_or_row_splits, [[0, 0, 0], [0, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(f.sample_shape, [2, 2])


def test_activation_shape_function_with_unknown_batch():
    config, table, _, _, _ = _setup()
    shapes = {}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.RaggedTensorSpec([None, None], tf.int64)])
    def lookup(dense_ids, ragged_ids):
        acts = eo.embedding_activations(
            [eo.normalize_feature(ragged_ids), eo.normalize_feature(dense_ids)], [table], config
        )
        shapes["ragged"], shapes["dense"] = acts[0].shape, acts[1].shape
        return acts

    lookup.get_concrete_function()
    assert shapes["ragged"].as_list() == [None, DIM]
    assert shapes["dense"].as_list() == [None, DIM]


def test_activation_shape_function_with_static_shape_and_sequence():
    config = make_config([{"name": "t", "vocab": 10, "dim": 4}], [("f", 0, [2, 5])])
    table = tf.Variable(np.zeros((10, 4), np.float32))
    shapes = {}

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int64)])
    def lookup(ids):
        (act,) = eo.embedding_activations([eo.normalize_feature(ids, max_sequence_length=5)], [table], config)
        shapes["seq"] = act.shape
        (dense,) = eo.embedding_activations([eo.normalize_feature(tf.zeros([2, 5, 1], tf.int64))], [table], config)
        shapes["dense"] = dense.shape
        return act

    lookup.get_concrete_function()
    assert shapes["seq"].as_list() == [None, 5, 4]
    assert shapes["dense"].as_list() == [2, 5, 4]


def test_send_shape_function_rejects_static_mismatch():
    config, table, slots, feats, grads = _setup()

    @tf.function
    def step():
        _send(
            config,
            table,
            slots,
            [feats[0], eo.normalize_feature(tf.constant([0, 9], tf.int64))],
            [grads[0], tf.ones([2, DIM + 1])],
        )

    with pytest.raises(ValueError, match="Dimension"):
        step.get_concrete_function()
