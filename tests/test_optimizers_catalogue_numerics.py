"""The rest of the TPU catalogue through the fused backward op, step by step.

References, never the kernel's own output:
- TensorFlow's dense CPU kernels of the same rule (ResourceApplyMomentum, ResourceApplyRMSProp,
  ResourceApplyCenteredRMSProp, ResourceApplyAdadelta, ResourceApplyProximalAdagrad), run on the touched rows
  with the row's summed gradient (gradient accumulation);
- tests/numpy_reference.py (written from docs/optimizers.md) for the rules TensorFlow has no kernel of.
Untouched rows must not change.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops.config as tec
import tf_embed_ops.optimizers as teo
from tests import numpy_reference
from tf_embed_ops import embedding_ops

E = tf.tpu.experimental.embedding
VOCAB, DIM = 12, 4
STEPS = [np.array([3, 5, 3, 7]), np.array([5, 0, 11, 5, 5])]  # duplicates within a step, rows shared across steps


def _setup(optimizer, seed=0):
    table = E.TableConfig(vocabulary_size=VOCAB, dim=DIM, name="t", optimizer=optimizer, combiner="sum")
    feature_config = (E.FeatureConfig(table=table, name="f"),)
    config = tec.from_feature_config(feature_config)
    rng = np.random.default_rng(seed)
    w0 = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
    shapes = tec.slot_shapes(optimizer, VOCAB, DIM)  # [VOCAB, 1] for a per-row slot (row-wise Adagrad)
    slot_values = [
        np.full(shapes[name], init.value if hasattr(init, "value") else 0.0, np.float32)
        for name, init in zip(optimizer._slot_names(), optimizer._slot_initializers(), strict=True)
    ]
    weights = tf.Variable(w0)
    slots = [tf.Variable(v) for v in slot_values]
    return config, weights, slots, rng


def _run_steps(optimizer, learning_rates=(), seed=0):
    """Runs STEPS through the fused op; returns (initial w, initial slots, per-step summed grads, final vars)."""
    config, weights, slots, rng = _setup(optimizer, seed)
    w_init = weights.numpy().copy()
    slots_init = [s.numpy().copy() for s in slots]
    summed = []
    for ids in STEPS:
        feature = embedding_ops.normalize_feature(tf.constant(ids, tf.int64))
        grad = rng.normal(size=(len(ids), DIM)).astype(np.float32)
        embedding_ops.send_tpu_embedding_gradients([grad], list(learning_rates), [feature], [weights], [slots], config)
        g = {}
        for i, r in enumerate(ids):
            g[int(r)] = g.get(int(r), np.zeros(DIM, np.float32)) + grad[i]
        summed.append(g)
    return w_init, slots_init, summed, weights.numpy(), [s.numpy() for s in slots]


def _touched(summed):
    return sorted({r for g in summed for r in g})


def _assert_untouched_unchanged(w_init, slots_init, w, slots, summed):
    untouched = [r for r in range(VOCAB) if r not in _touched(summed)]
    np.testing.assert_array_equal(w[untouched], w_init[untouched])
    for s0, s in zip(slots_init, slots, strict=True):
        np.testing.assert_array_equal(s[untouched], s0[untouched])


# ---- against TensorFlow's dense kernels on the touched rows ----


def _tf_kernel_reference(apply, w_init, slots_init, summed):
    """Runs `apply(var, slot_vars, grad)` once per step on the rows each step touched, with the summed grads."""
    w = w_init.copy()
    slots = [s.copy() for s in slots_init]
    for g in summed:
        rows = sorted(g)
        var = tf.Variable(w[rows])
        slot_vars = [tf.Variable(s[rows]) for s in slots]
        apply(var, slot_vars, tf.constant(np.stack([g[r] for r in rows])))
        w[rows] = var.numpy()
        for s, v in zip(slots, slot_vars, strict=True):
            s[rows] = v.numpy()
    return w, slots


LR = 0.1
TF_KERNEL_CASES = [
    (
        "momentum",
        teo.Momentum(learning_rate=LR, momentum=0.9),
        lambda v, s, g: tf.raw_ops.ResourceApplyMomentum(var=v.handle, accum=s[0].handle, lr=LR, grad=g, momentum=0.9),
    ),
    (
        "momentum_nesterov",
        teo.Momentum(learning_rate=LR, momentum=0.7, use_nesterov=True),
        lambda v, s, g: tf.raw_ops.ResourceApplyMomentum(
            var=v.handle, accum=s[0].handle, lr=LR, grad=g, momentum=0.7, use_nesterov=True
        ),
    ),
    (
        "rms_prop",
        teo.RMSProp(learning_rate=LR, rho=0.8, momentum=0.5, epsilon=1e-3),
        lambda v, s, g: tf.raw_ops.ResourceApplyRMSProp(
            var=v.handle, ms=s[0].handle, mom=s[1].handle, lr=LR, rho=0.8, momentum=0.5, epsilon=1e-3, grad=g
        ),
    ),
    (
        "centered_rms_prop",
        teo.CenteredRMSProp(learning_rate=LR, rho=0.8, momentum=0.5, epsilon=1e-3),
        lambda v, s, g: tf.raw_ops.ResourceApplyCenteredRMSProp(
            var=v.handle,
            mg=s[2].handle,
            ms=s[0].handle,
            mom=s[1].handle,
            lr=LR,
            rho=0.8,
            momentum=0.5,
            epsilon=1e-3,
            grad=g,
        ),
    ),
    (
        "adadelta",
        teo.Adadelta(learning_rate=1.0, rho=0.9, epsilon=1e-3),
        lambda v, s, g: tf.raw_ops.ResourceApplyAdadelta(
            var=v.handle, accum=s[0].handle, accum_update=s[1].handle, lr=1.0, rho=0.9, epsilon=1e-3, grad=g
        ),
    ),
    (
        "proximal_adagrad",
        teo.ProximalAdagrad(learning_rate=LR, l1_regularization_strength=0.05, l2_regularization_strength=0.2),
        lambda v, s, g: tf.raw_ops.ResourceApplyProximalAdagrad(
            var=v.handle, accum=s[0].handle, lr=LR, l1=0.05, l2=0.2, grad=g
        ),
    ),
    (
        "proximal_adagrad_l2_only",
        teo.ProximalAdagrad(learning_rate=LR, l2_regularization_strength=0.3),
        lambda v, s, g: tf.raw_ops.ResourceApplyProximalAdagrad(
            var=v.handle, accum=s[0].handle, lr=LR, l1=0.0, l2=0.3, grad=g
        ),
    ),
]


@pytest.mark.parametrize(
    "optimizer, apply", [(o, a) for _, o, a in TF_KERNEL_CASES], ids=[n for n, _, _ in TF_KERNEL_CASES]
)
def test_matches_tensorflow_dense_kernel_on_touched_rows(optimizer, apply):
    w_init, slots_init, summed, w, slots = _run_steps(optimizer)
    ref_w, ref_slots = _tf_kernel_reference(apply, w_init, slots_init, summed)
    np.testing.assert_allclose(w, ref_w, rtol=2e-6, atol=2e-6)
    for s, r in zip(slots, ref_slots, strict=True):
        np.testing.assert_allclose(s, r, rtol=2e-6, atol=2e-6)
    _assert_untouched_unchanged(w_init, slots_init, w, slots, summed)


# ---- against the numpy reference (tests/numpy_reference.py, written from docs/optimizers.md) ----

NUMPY_CASES = [
    ("lion", teo.Lion(learning_rate=LR, beta_1=0.8, beta_2=0.95)),
    ("bounded_adagrad_old_acc", teo.BoundedAdagrad(learning_rate=LR, max_var_update=0.02)),
    (
        "bounded_adagrad_new_acc",
        teo.BoundedAdagrad(learning_rate=LR, update_accumulator_first=True, max_accumulator=1.5),
    ),
    (
        "proximal_yogi",
        teo.ProximalYogi(
            learning_rate=LR,
            l1_regularization_strength=0.01,
            l2_regularization_strength=0.1,
            beta_1=0.5,
            beta_2=0.9,
            epsilon=1e-2,
        ),
    ),
    (
        "online_yogi",
        teo.OnlineYogi(learning_rate=LR, l1_regularization_strength=0.05, l2_regularization_strength=0.1, beta_2=0.9),
    ),
    ("assign", teo.Assign()),
    ("rowwise_adagrad", teo.RowWiseAdagrad(learning_rate=LR, epsilon=1e-3, initial_accumulator_value=0.05)),
    ("rowwise_adagrad_l2", teo.RowWiseAdagrad(learning_rate=LR, weight_decay=0.2)),
    ("rowwise_adagrad_decoupled", teo.RowWiseAdagrad(learning_rate=LR, weight_decay=0.2, decoupled_weight_decay=True)),
    (
        "lion_clipped_decayed",
        teo.Lion(
            learning_rate=LR,
            clipvalue=0.3,
            clip_weight_min=-0.5,
            clip_weight_max=0.5,
            weight_decay_factor=0.1,
            multiply_weight_decay_factor_by_learning_rate=True,
        ),
    ),
]


@pytest.mark.parametrize("optimizer", [o for _, o in NUMPY_CASES], ids=[n for n, _ in NUMPY_CASES])
def test_matches_numpy_reference_on_touched_rows(optimizer):
    w_init, slots_init, summed, w, slots = _run_steps(optimizer)
    spec = numpy_reference.spec_from_optimizer(optimizer)
    ref_w, ref_slots = w_init, slots_init
    for g in summed:
        ref_w, ref_slots = numpy_reference.apply_step(spec, LR, ref_w, ref_slots, g)
    np.testing.assert_allclose(w, ref_w, rtol=2e-6, atol=2e-6)
    for s, r in zip(slots, ref_slots, strict=True):
        np.testing.assert_allclose(s, r, rtol=2e-6, atol=2e-6)
    _assert_untouched_unchanged(w_init, slots_init, w, slots, summed)


def test_non_lazy_lion_updates_every_row():
    optimizer = teo.Lion(learning_rate=LR, beta_1=0.8, beta_2=0.95, lazy_lion=False)
    config, weights, slots, _ = _setup(optimizer)
    slots[0].assign(np.full((VOCAB, DIM), 0.5, np.float32))  # non-zero momentum moves untouched rows too
    w0 = weights.numpy().copy()
    feature = embedding_ops.normalize_feature(tf.constant([2], tf.int64))
    embedding_ops.send_tpu_embedding_gradients(
        [np.ones((1, DIM), np.float32)], [], [feature], [weights], [slots], config
    )
    untouched = [r for r in range(VOCAB) if r != 2]
    np.testing.assert_allclose(weights.numpy()[untouched], w0[untouched] - LR, rtol=1e-6)
    np.testing.assert_allclose(slots[0].numpy()[untouched], 0.95 * 0.5, rtol=1e-6)


def test_frequency_estimator_tracks_steps_between_hits():
    step = tf.Variable(0.0)
    optimizer = teo.FrequencyEstimator(lambda: step, tau=0.5, max_delta=100.0, outlier_threshold=10.0)
    table = E.TableConfig(vocabulary_size=4, dim=1, name="freq", optimizer=optimizer)
    config = tec.from_feature_config((E.FeatureConfig(table=table, name="f"),))
    d = tf.Variable(np.full((4, 1), 100.0, np.float32))  # D starts at max_delta
    last_hit = tf.Variable(np.zeros((4, 1), np.float32))
    ref_d, ref_last = np.full(4, 100.0), np.zeros(4)
    for s, ids in [(1, [0, 1]), (3, [1]), (4, [0, 1]), (104, [2])]:
        step.assign(float(s))
        feature = embedding_ops.normalize_feature(tf.constant(ids, tf.int64))
        zero_grad = np.zeros((len(ids), 1), np.float32)
        embedding_ops.send_tpu_embedding_gradients([zero_grad], [step], [feature], [d], [[last_hit]], config)
        for r in set(ids):
            delta = s - ref_last[r]
            clipped = min(delta, 100.0)
            outlier = delta >= 10.0 * ref_d[r]
            ref_d[r] = clipped if outlier else ref_d[r] * 0.5 + clipped * 0.5
            ref_last[r] = s
    np.testing.assert_allclose(d.numpy()[:, 0], ref_d, rtol=1e-6)
    np.testing.assert_allclose(last_hit.numpy()[:, 0], ref_last)
