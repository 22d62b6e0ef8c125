"""Hostile inputs to the fused embedding ops, through the raw wrappers and through `te.TPUEmbedding`: malformed
row splits (the heap overflow of middle entries past the number of ids), absurd sample shapes, bad learning
rates and non-finite gradients.  Each is rejected with an error naming the feature (or tag) and the value, and
leaves every table and slot bitwise unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from embedding_test_util import assert_embedding_unchanged, embedding_state, make_config

import tf_embed_ops as te
from tf_embed_ops import embedding_ops as eo

VOCAB, DIM = 10, 3
emb_api = tf.tpu.experimental.embedding

# Middle entries beyond the number of ids (4): they used to make both kernels write past a heap buffer.
BAD_SPLITS = [
    ([0, 2**62, 2**62, 4], r"row_splits\[1\] = 4611686018427387904 is not in \[0, 4\]"),
    ([0, 6, 6, 4], r"row_splits\[1\] = 6 is not in \[0, 4\]"),
    ([0, -1, 2, 4], r"row_splits\[1\] = -1 is not in \[0, 4\]"),
    ([0, 3, 2, 4], r"row_splits must be non-decreasing: row_splits\[2\] = 2 < row_splits\[1\] = 3"),
    ([1, 2, 3, 4], r"row_splits\[0\] = 1, must be 0"),
    ([0, 1, 2, 5], r"row_splits\[3\] = 5 must equal the number of ids, 4"),
]


def _setup(opt=None, lr=0.1, tables=1):
    opt = opt or {"name": "adam"}
    num_slots = {"adam": 2, "sgd": 0}[opt["name"]]
    specs = [
        {"name": "video", "vocab": VOCAB, "dim": DIM, "opt": opt, "lr": lr},
        {"name": "user", "vocab": VOCAB, "dim": DIM, "opt": opt, "lr": lr},
    ][:tables]
    config = make_config(specs, [("watched", 0, [3]), ("liked", tables - 1, [2])])
    rng = np.random.default_rng(0)
    variables = []
    for _ in range(tables):
        table = tf.Variable(rng.normal(size=(VOCAB, DIM)).astype(np.float32))
        slots = [tf.Variable(rng.uniform(0.1, 1.0, size=(VOCAB, DIM)).astype(np.float32)) for _ in range(num_slots)]
        variables.append((table, slots))
    feats = [
        eo.normalize_feature(tf.ragged.constant([[1, 2], [], [9]], dtype=tf.int64)),
        eo.normalize_feature(tf.constant([0, 9], tf.int64)),
    ]
    grads = [tf.ones([3, DIM]), tf.ones([2, DIM])]
    return config, variables, feats, grads


def _flat(variables):
    return [v for table, slots in variables for v in [table, *slots]]


def _snapshot(variables):
    return [v.numpy().copy() for v in _flat(variables)]


def _assert_unchanged(before, variables):
    for old, var in zip(before, _flat(variables), strict=True):
        # Bitwise: NaN-safe and sign-of-zero-safe.
        np.testing.assert_array_equal(var.numpy().view(np.uint32), old.view(np.uint32))


def _send(config, variables, feats, grads, lrs=(), check_numerics=False):
    tables = [t for t, _ in variables]
    slots = [s for _, s in variables]
    eo.send_tpu_embedding_gradients(grads, list(lrs), feats, tables, slots, config, check_numerics=check_numerics)


def _ragged(splits):
    return eo.FeatureInput(
        tf.constant(splits, tf.int64), tf.constant([1, 2, 3, 4], tf.int64), tf.zeros([0]), tf.constant([3], tf.int64)
    )


@pytest.mark.parametrize("splits, message", BAD_SPLITS)
def test_bad_row_splits_rejected_by_both_ops(splits, message):
    config, variables, feats, grads = _setup()
    feats[0] = _ragged(splits)
    before = _snapshot(variables)
    pattern = r"feature 0 \('watched'\): " + message
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        eo.embedding_activations(feats, [variables[0][0]], config)
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        _send(config, variables, feats, grads)
    _assert_unchanged(before, variables)


@pytest.mark.parametrize("splits", [s for s, _ in BAD_SPLITS[:2]])
def test_bad_row_splits_inside_tf_function(splits):
    config, variables, feats, grads = _setup()
    before = _snapshot(variables)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def step(s):
        f = [
            eo.FeatureInput(s, tf.constant([1, 2, 3, 4], tf.int64), tf.zeros([0]), tf.constant([3], tf.int64)),
            feats[1],
        ]
        _send(config, variables, f, grads)

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature 0 \('watched'\): row_splits\[1\]"):
        step(tf.constant(splits, tf.int64))
    _assert_unchanged(before, variables)


def _mid_level(max_sequence_length=0, check_numerics=False, lr=0.1):
    table = emb_api.TableConfig(VOCAB, DIM, name="video", combiner="sum")
    fc = {
        "watched": emb_api.FeatureConfig(table=table, max_sequence_length=max_sequence_length, name="watched"),
        "liked": emb_api.FeatureConfig(table=table, name="liked"),
    }
    emb = te.TPUEmbedding(fc, emb_api.Adagrad(lr), check_numerics=check_numerics)
    emb.build()
    return emb


@pytest.mark.parametrize("max_sequence_length", [0, 3])
@pytest.mark.parametrize("splits", [s for s, _ in BAD_SPLITS[:2]])
def test_unvalidated_ragged_tensor_through_tpu_embedding(splits, max_sequence_length):
    emb = _mid_level(max_sequence_length)
    before = embedding_state(emb)
    ragged = tf.RaggedTensor.from_row_splits(
        tf.constant([1, 2, 3, 4], tf.int64), tf.constant(splits, tf.int64), validate=False
    )
    features = {"watched": ragged, "liked": tf.constant([0, 9], tf.int64)}
    if max_sequence_length:
        pattern = r"feature 'watched': row_splits must start at 0, be non-decreasing"
    else:
        pattern = r"feature \d \('watched'\): row_splits\[1\] = " + str(splits[1]) + r" is not in \[0, 4\]"
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        emb.enqueue(features)
        emb.dequeue()
    if not max_sequence_length:
        # The send op sees the same splits (the enqueue above queued them) and refuses them too.
        gradients = {"watched": tf.ones([3, DIM]), "liked": tf.ones([2, DIM])}
        with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
            emb.apply_gradients(gradients)
    assert_embedding_unchanged(emb, before)
    # The object still works afterwards.
    emb.enqueue({"watched": tf.ragged.constant([[1, 2], [3]], dtype=tf.int64), "liked": tf.constant([0, 9], tf.int64)})
    emb.dequeue()


def _sparse(indices, sample_shape, num_ids=None):
    indices = np.asarray(indices, np.int64).reshape([-1, len(sample_shape) + 1])
    n = len(indices) if num_ids is None else num_ids
    return eo.FeatureInput(
        tf.constant(indices),
        tf.constant(np.arange(n) % VOCAB, tf.int64),
        tf.zeros([0]),
        tf.constant(sample_shape, tf.int64),
    )


@pytest.mark.parametrize(
    "sample_shape, message",
    [
        ([2**40], r"sample_shape \[1099511627776\] has more than 2147483647 samples"),
        ([2**62, 2**62], r"sample_shape \[4611686018427387904, 4611686018427387904\] has more than 2147483647"),
        (
            [65536, 65536],
            r"sample_shape \[65536, 65536\] has more than 2147483647 samples \(sample_shape\[1\] = 65536\)",
        ),
        ([3, -1], r"sample_shape\[1\] = -1 is negative"),
    ],
)
def test_huge_or_negative_sample_shape_is_invalid_argument_before_allocation(sample_shape, message):
    config, variables, feats, grads = _setup()
    feats[0] = _sparse(np.zeros([0, len(sample_shape) + 1]), sample_shape)
    before = _snapshot(variables)
    pattern = r"feature 0 \('watched'\): " + message
    # InvalidArgument, not ResourceExhausted: nothing was allocated from the absurd shape.
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        eo.embedding_activations(feats, [variables[0][0]], config)
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        _send(config, variables, feats, [tf.ones([0, DIM]), grads[1]])
    _assert_unchanged(before, variables)


def test_zero_dimension_after_a_huge_one_is_an_empty_batch():
    config, variables, feats, grads = _setup()
    feats[0] = _sparse(np.zeros([0, 3]), [2**40, 0])
    acts = eo.embedding_activations(feats, [variables[0][0]], config)
    assert acts[0].shape == (2**40, 0, DIM)


def test_sparse_indices_in_any_order_match_the_reference():
    """The kernels sort ids by sample themselves (stable), so unordered sparse indices are valid input."""
    config, variables, feats, _ = _setup()
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 3, size=12)
    ids = rng.integers(0, VOCAB, size=12)
    weights = rng.uniform(0.5, 2.0, size=12).astype(np.float32)
    indices = np.stack([rows, np.zeros(12, np.int64)], axis=1)
    feats[0] = eo.FeatureInput(tf.constant(indices), tf.constant(ids), tf.constant(weights), tf.constant([3], tf.int64))
    (act, _) = eo.embedding_activations(feats, [variables[0][0]], config, combiners=["mean"])
    table = variables[0][0].numpy().astype(np.float64)
    expected = np.zeros([3, DIM])
    for s in range(3):
        member = rows == s
        if member.any():
            expected[s] = (weights[member, None] * table[ids[member]]).sum(0) / weights[member].sum()
    np.testing.assert_allclose(act.numpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), float("-inf")])
def test_bad_dynamic_learning_rate_names_tag_and_tables(bad):
    config, variables, feats, grads = _setup(lr=("dynamic", 0), tables=2)
    before = _snapshot(variables)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"learning_rates\[0\] \(dynamic learning-rate tag 0, used by tables 'video', 'user'\) = "
        r"(-0\.5|nan|inf|-inf): a learning rate must be finite and >= 0",
    ):
        _send(config, variables, feats, grads, lrs=(bad,))
    _assert_unchanged(before, variables)
    _send(config, variables, feats, grads, lrs=(0.0,))  # zero is a valid rate


def test_bad_dynamic_learning_rate_through_tpu_embedding():
    rate = tf.Variable(0.1)
    emb = _mid_level(lr=lambda: rate)
    before = embedding_state(emb)
    rate.assign(float("nan"))
    emb.enqueue({"watched": tf.ragged.constant([[1, 2], [3]], dtype=tf.int64), "liked": tf.constant([0, 9], tf.int64)})
    emb.dequeue()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tag 0, used by table 'video'\) = nan"):
        emb.apply_gradients({"watched": tf.ones([2, DIM]), "liked": tf.ones([2, DIM])})
    assert_embedding_unchanged(emb, before)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_gradients_are_applied_by_default_and_rejected_on_request(bad):
    config, variables, feats, grads = _setup(opt={"name": "sgd"})
    grads[1] = tf.constant([[1.0, 1.0, 1.0], [1.0, bad, 1.0]])
    before = _snapshot(variables)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"feature 1 \('liked'\): the gradient \(inputs\[1\]\) holds (nan|inf) at \[1, 1\]; check_numerics "
        r"rejects the step \(table 'video'",
    ):
        _send(config, variables, feats, grads, check_numerics=True)
    _assert_unchanged(before, variables)
    # Default: applied as the TPU applies it (SGD: row 9 column 1 becomes non-finite, other rows stay finite).
    _send(config, variables, feats, grads)
    table = variables[0][0].numpy()
    assert not np.isfinite(table[9, 1])
    assert np.isfinite(np.delete(table, 9, axis=0)).all()


def test_check_numerics_on_tpu_embedding():
    emb = _mid_level(check_numerics=True)
    before = embedding_state(emb)
    emb.enqueue({"watched": tf.ragged.constant([[1, 2], [3]], dtype=tf.int64), "liked": tf.constant([0, 9], tf.int64)})
    emb.dequeue()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\('watched'\): the gradient .* holds nan .* 'video'"):
        emb.apply_gradients({"watched": tf.fill([2, DIM], float("nan")), "liked": tf.ones([2, DIM])})
    assert_embedding_unchanged(emb, before)


def test_check_numerics_on_keras_layer():
    table = emb_api.TableConfig(VOCAB, DIM, name="video", combiner="sum")
    layer = te.keras.TPUEmbedding(
        {"watched": emb_api.FeatureConfig(table=table, name="watched")}, emb_api.SGD(0.1), check_numerics=True
    )
    assert layer.get_config()["check_numerics"] is True
    before = layer.embedding_tables[table].numpy().copy()
    ids = tf.constant([1, 2], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\('watched'\): the gradient .* holds inf .* 'video'"):
        with tf.GradientTape() as tape:
            acts = layer({"watched": ids}, training=True)
            loss = tf.reduce_sum(acts["watched"] * float("inf"))
        tape.gradient(loss, layer.trainable_variables)
    np.testing.assert_array_equal(layer.embedding_tables[table].numpy(), before)
    restored = te.keras.TPUEmbedding.from_config(layer.get_config())
    assert restored.get_config()["check_numerics"] is True


def test_restore_before_build_with_wrong_shape_names_the_table(tmp_path):
    saved = te.TPUEmbedding({"a": emb_api.FeatureConfig(emb_api.TableConfig(6, 2, name="video"))}, emb_api.SGD(0.1))
    saved.build()
    path = tf.train.Checkpoint(e=saved).save(str(tmp_path / "ckpt"))
    table = emb_api.TableConfig(7, 2, name="video")
    other = te.TPUEmbedding({"a": emb_api.FeatureConfig(table)}, emb_api.SGD(0.1))
    # The restore is validated whole, against the configured shapes, before anything is written: the error
    # names the table and both shapes, and the object still builds with its own tables.
    with pytest.raises(
        ValueError, match=r"checkpoint's 'video' has shape \[6, 2\], this object's is \[7, 2\]; no table was changed"
    ):
        tf.train.Checkpoint(e=other).restore(path).expect_partial()
    other.build()
    assert other.embedding_tables[table].shape == (7, 2)


def test_static_gradient_shape_error_names_the_feature():
    config, variables, feats, grads = _setup()

    @tf.function
    def step():
        _send(config, variables, feats, [grads[0], tf.ones([2, DIM + 1])])

    with pytest.raises(
        ValueError, match=r"feature 1 \('liked'\): the gradient \(inputs\[1\]\) has shape \[2,4\], expected \[\?,3\]"
    ):
        step.get_concrete_function()
