"""Independent numpy reference of the TPU embedding training step, written from docs/semantics.md.

It deliberately shares nothing with the C++ (no normalised FeatureInput, no dedup plan): features are plain
lists of ``(sample_position, id, weight)`` entries, gradients are summed per row with float64 dictionaries, and
each optimizer is written from the equations of its "Optimizers" section.  Tables are float32 arrays updated out
of place.

Optimizer settings are plain dicts: ``{"name": "adagrad", ...hyper-parameters...}`` plus the common options
``gradient_clip`` (lo, hi), ``weight_clip`` (lo, hi), ``weight_decay``, ``multiply_weight_decay_by_lr``.

Precision: the arithmetic is float64, but every number the engine holds as float32 enters as float32 — tables,
slots, weights, activation gradients, the learning rate and every hyper-parameter (the configuration proto
stores them as float), and ``1 - beta`` is formed in float32 as the engine forms it.  A float64 hyper-parameter
is a different optimizer: ``1 - f32(0.9)`` is ``0.10000002``, a relative change of 2.4e-7 that the update
carries into every row.  What remains between the kernels and this reference is float32 rounding of the
arithmetic itself.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


def f32(x: float) -> float:
    """x as the engine holds it: rounded to float32 (returned as a Python float for float64 arithmetic)."""
    return float(np.float32(x))


def _power_f32(x, p: float) -> np.ndarray:
    """x ** p of float32 x and p, correctly rounded to float32 (as C's powf), returned as float64."""
    x32 = np.asarray(x, np.float32).astype(np.float64)
    return np.power(x32, np.float64(np.float32(p))).astype(np.float32).astype(np.float64)


def one_minus(b: float) -> float:
    """1 - b formed in float32, as the kernels (and TensorFlow's and the TPU's) compute it from a float32 b."""
    return float(np.float32(1.0) - np.float32(b))


def _float32_settings(opt: dict) -> dict:
    """Every float hyper-parameter (and clip limit) of a settings dict rounded to float32, as the proto holds it."""
    out = {}
    for key, value in opt.items():
        if isinstance(value, float):
            value = f32(value)
        elif isinstance(value, tuple):
            value = tuple(f32(v) if isinstance(v, float) else v for v in value)
        out[key] = value
    return out


def entries_from_rows(rows, weights=None, max_sequence_length=0):
    """Ragged rows of ids -> (entries, sample_shape), as the ragged input form defines them.

    Non-sequence: sample = row b.  Sequence (L > 0): id k of row b at (b, k), k >= L dropped (truncation).
    """
    entries = []
    for b, row in enumerate(rows):
        for k, i in enumerate(row):
            w = 1.0 if weights is None else f32(weights[b][k])  # the op's weights input is float32
            if max_sequence_length:
                if k >= max_sequence_length:
                    continue
                entries.append(((b, k), int(i), w))
            else:
                entries.append(((b,), int(i), w))
    shape = (len(rows), max_sequence_length) if max_sequence_length else (len(rows),)
    return entries, shape


def quantize(v, lower, upper, num_buckets):
    """Simulated quantization, float32 like the table storage."""
    v = np.asarray(v, np.float32)
    x = np.clip(v, np.float32(lower), np.float32(upper))
    q = np.float32((np.float32(upper) - np.float32(lower)) / np.float32(num_buckets - 1))
    return (np.floor((x - np.float32(lower)) / q + np.float32(0.5)) * q + np.float32(lower)).astype(np.float32)


def _norms(entries, combiner):
    sums, sums2 = {}, {}
    for pos, _, w in entries:
        sums[pos] = sums.get(pos, 0.0) + w
        sums2[pos] = sums2.get(pos, 0.0) + w * w
    if combiner == "sum":
        return {p: 1.0 for p in sums}
    if combiner == "mean":
        return sums
    return {p: math.sqrt(s) for p, s in sums2.items()}


def forward(table, entries, sample_shape, combiner, quantization=None):
    """act[s] = sum_i w_i * Q(E[id_i]) / norm_s; zero for empty samples and zero norms."""
    table = np.asarray(table, np.float32)
    dim = table.shape[1]
    out = np.zeros(tuple(sample_shape) + (dim,), np.float64)
    norms = _norms(entries, combiner)
    for pos, i, w in entries:
        row = table[i] if quantization is None else quantize(table[i], *quantization)
        if norms[pos] != 0:
            out[pos] += w / norms[pos] * row.astype(np.float64)
    return out


def row_gradients(features, vocabulary_size):
    """Gradient accumulation: grad[r] += w_i / norm_s * dL/dact[s], summed over features.

    features: list of (entries, combiner, gradient array of shape sample_shape + [dim]).
    Returns {row: float64 gradient} for every touched row (even if the sum is zero).
    """
    grads = {}
    for entries, combiner, gradient in features:
        norms = _norms(entries, combiner)
        gradient = np.asarray(gradient, np.float32).astype(np.float64)  # the op's gradient input is float32
        for pos, i, w in entries:
            assert 0 <= i < vocabulary_size
            contribution = (w / norms[pos] if norms[pos] != 0 else 0.0) * gradient[pos]
            grads[i] = grads.get(i, 0.0) + contribution
    return grads


SLOTS = {
    "sgd": [],
    "adagrad": ["accumulators"],
    "adagrad_momentum": ["accumulators", "momenta"],
    "adam": ["momenta", "velocities"],
    "ftrl": ["accumulators", "linears"],
    # The rest of the catalogue (docs/optimizers.md); names are the proto's oneof fields.
    "lion": ["momenta"],
    "bounded_adagrad": ["accumulators"],
    "online_yogi": ["vs", "linears"],
    "proximal_yogi": ["v", "m"],
    "assign": [],
    "rowwise_adagrad": ["row_accumulators"],
}

# Slots holding one value per row ([vocabulary_size, 1]): row-wise Adagrad's accumulator (FBGEMM's momentum1).
PER_ROW_SLOTS = {"row_accumulators"}

_TF_OPTIMIZER_NAMES = {
    "SGD": "sgd",
    "Adagrad": "adagrad",
    "AdagradMomentum": "adagrad_momentum",
    "Adam": "adam",
    "FTRL": "ftrl",
}


def spec_from_optimizer(optimizer) -> dict:
    """A `tf.tpu.experimental.embedding` or `tf_embed_ops.optimizers` object -> this module's settings dict.

    Reads only the objects' public constructor attributes, so the reference stays independent of the config
    loader and the kernels.
    """
    kind = type(optimizer).__name__
    o = optimizer
    if kind == "AdagradMomentum":
        spec = dict(
            momentum=o.momentum, use_nesterov=o.use_nesterov, exponent=o.exponent, beta2=o.beta2, epsilon=o.epsilon
        )
    elif kind == "Adam":
        spec = dict(
            beta1=o.beta_1,
            beta2=o.beta_2,
            epsilon=o.epsilon,
            use_non_lazy_adam=not o.lazy_adam,
            use_sum_inside_sqrt=o.sum_inside_sqrt,
        )
    elif kind == "FTRL":
        spec = dict(
            lr_power=o.learning_rate_power,
            l1=o.l1_regularization_strength,
            l2=o.l2_regularization_strength,
            beta=o.beta,
            multiply_linear_by_lr=o.multiply_linear_by_learning_rate,
        )
    elif kind == "Lion":
        spec = dict(beta1=o.beta_1, beta2=o.beta_2, use_non_lazy_lion=not o.lazy_lion)
    elif kind == "BoundedAdagrad":
        spec = dict(
            update_accumulator_first=o.update_accumulator_first,
            max_var_update=o.max_var_update,
            max_accumulator=o.max_accumulator,
        )
    elif kind in ("OnlineYogi", "ProximalYogi"):
        spec = dict(l1=o.l1_regularization_strength, l2=o.l2_regularization_strength, beta2=o.beta_2)
        if kind == "ProximalYogi":
            spec.update(beta1=o.beta_1, epsilon=o.epsilon)
    elif kind == "RowWiseAdagrad":
        # FBGEMM's own weight decay, apart from the pipeline's TPU-style `weight_decay` below.
        spec = dict(
            epsilon=o.epsilon, rowwise_weight_decay=o.weight_decay, decoupled_weight_decay=o.decoupled_weight_decay
        )
    elif kind in ("SGD", "Adagrad", "Assign"):
        spec = {}
    else:
        raise ValueError(f"no numpy reference for optimizer {kind}")
    name = (
        _TF_OPTIMIZER_NAMES.get(kind)
        or {
            "Lion": "lion",
            "BoundedAdagrad": "bounded_adagrad",
            "OnlineYogi": "online_yogi",
            "ProximalYogi": "proximal_yogi",
            "Assign": "assign",
            "RowWiseAdagrad": "rowwise_adagrad",
        }[kind]
    )
    spec["name"] = name
    inf = float("inf")
    if o.clip_gradient_min is not None or o.clip_gradient_max is not None:
        spec["gradient_clip"] = (
            -inf if o.clip_gradient_min is None else o.clip_gradient_min,
            inf if o.clip_gradient_max is None else o.clip_gradient_max,
        )
    if o.clip_weight_min is not None or o.clip_weight_max is not None:
        spec["weight_clip"] = (
            -inf if o.clip_weight_min is None else o.clip_weight_min,
            inf if o.clip_weight_max is None else o.clip_weight_max,
        )
    if o.weight_decay_factor:
        spec["weight_decay"] = o.weight_decay_factor
        spec["multiply_weight_decay_by_lr"] = bool(o.multiply_weight_decay_factor_by_learning_rate)
    return spec


def initial_slot_values(optimizer) -> dict:
    """{slot name: initial value} of an optimizer object, in Load/Retrieve order (its constructor arguments)."""
    kind = type(optimizer).__name__
    if kind in ("Adagrad", "BoundedAdagrad"):
        return {"accumulators": optimizer.initial_accumulator_value}
    if kind == "FTRL":
        return {"accumulators": optimizer.initial_accumulator_value, "linears": 0.0}
    if kind == "OnlineYogi":
        return {"vs": optimizer.initial_v_value, "linears": optimizer.initial_linear_value}
    if kind == "ProximalYogi":
        return {"v": optimizer.initial_v_value, "m": optimizer.initial_m_value}
    if kind == "Lion":
        return {"momenta": optimizer.initial_momentum_value}
    if kind == "RowWiseAdagrad":
        return {"row_accumulators": optimizer.initial_accumulator_value}
    return {name: 0.0 for name in SLOTS[spec_from_optimizer(optimizer)["name"]]}


def _optimizer_row(opt, lr, g, w, slots):
    """One optimizer step on one row; returns (w, slots)."""
    name = opt["name"]
    if name == "sgd":
        return w - lr * g, slots
    if name == "adagrad":
        (a,) = slots
        a = a + g * g
        return w - lr * g / np.sqrt(a), [a]
    if name == "adagrad_momentum":
        a, m = slots
        beta2, exponent, eps = opt.get("beta2", 1.0), opt.get("exponent", 2.0), opt.get("epsilon", 1e-10)
        momentum, nesterov = opt.get("momentum", 0.0), opt.get("use_nesterov", False)
        a = a + g * g if beta2 == 1.0 else beta2 * a + one_minus(beta2) * g * g
        s = g * np.power(a + eps, -1.0 / exponent)
        m = momentum * m + s
        step = momentum * m + s if nesterov else m
        return w - lr * step, [a, m]
    if name == "adam":
        m, v = slots
        b1, b2, eps = opt.get("beta1", 0.9), opt.get("beta2", 0.999), opt.get("epsilon", 1e-7)
        m = b1 * m + one_minus(b1) * g
        v = b2 * v + one_minus(b2) * g * g
        if opt.get("use_sum_inside_sqrt", True):
            w = w - lr * m / np.sqrt(v + eps * eps)
        else:
            w = w - lr * m / (np.sqrt(v) + eps)
        return w, [m, v]
    if name == "ftrl":
        a, lin = slots
        p = -opt.get("lr_power", -0.5)
        l1, l2, beta = opt.get("l1", 0.0), opt.get("l2", 0.0), opt.get("beta", 0.0)
        # sigma is the difference of two nearly equal powers of the stored (float32) accumulator, and the
        # standard form divides it by lr: the engine's float32 rounding of each power (up to an ulp of
        # sqrt(a), times 1/lr) is part of the update, so the reference forms both powers in float32 too: each the
        # float64 power of the float32 operands rounded once to float32, i.e. the correctly rounded float32 power
        # (numpy's own float32 power is not, and differs between numpy versions by an ulp).
        a_new = (np.float32(a) + np.float32(g) * np.float32(g)).astype(np.float64)
        pw_new = _power_f32(a_new, p)
        sigma = pw_new - _power_f32(a, p)
        if opt.get("multiply_linear_by_lr", False):
            lin = lin + lr * g - sigma * w
            quad = pw_new + 2 * lr * l2 + beta
            thr = lr * l1
        else:
            lin = lin + g - sigma / lr * w
            quad = (pw_new + beta) / lr + 2 * l2
            thr = l1
        w = np.where(np.abs(lin) > thr, np.sign(lin) * thr - lin, 0.0) / quad
        return w, [a_new, lin]
    if name == "lion":
        (m,) = slots
        c = opt["beta1"] * m + one_minus(opt["beta1"]) * g
        return w - lr * np.sign(c), [opt["beta2"] * m + one_minus(opt["beta2"]) * g]
    if name == "bounded_adagrad":
        (a,) = slots
        a_new = a + g * g
        if opt["max_accumulator"] > 0:
            a_new = np.minimum(a_new, opt["max_accumulator"])
        step = lr * g / np.sqrt(a_new if opt["update_accumulator_first"] else a)
        if opt["max_var_update"] > 0:
            step = np.clip(step, -opt["max_var_update"], opt["max_var_update"])
        return w - step, [a_new]
    if name == "proximal_yogi":
        v, m = slots
        m = opt["beta1"] * m + one_minus(opt["beta1"]) * g
        v = v - one_minus(opt["beta2"]) * np.sign(v - g * g) * g * g
        eta = lr / (np.sqrt(v) + opt["epsilon"])
        x = w - eta * m
        if opt["l1"] > 0:
            x = np.sign(x) * np.maximum(np.abs(x) - eta * opt["l1"], 0)
        return x / (1 + eta * opt["l2"]), [v, m]
    if name == "online_yogi":
        v, lin = slots
        v_new = v - one_minus(opt["beta2"]) * np.sign(v - g * g) * g * g
        lin = lin + g - (np.sqrt(v_new) - np.sqrt(v)) / lr * w
        w = (np.clip(lin, -opt["l1"], opt["l1"]) - lin) / (np.sqrt(v_new) / lr + 2 * opt["l2"])
        return w, [v_new, lin]
    if name == "assign":
        return g.copy(), []
    if name == "rowwise_adagrad":
        # FBGEMM's EXACT_ROWWISE_ADAGRAD (fbgemm_gpu/codegen/genscript/optimizers.py, rowwise_adagrad(),
        # split_weight_update_cpu): the row's one accumulator grows by the mean of the squared gradient (with the
        # L2 term folded in), epsilon is added outside the square root, and the decay acts through a factor on w.
        (a,) = slots  # shape (1,): one value per row
        wd, decoupled = opt["rowwise_weight_decay"], opt["decoupled_weight_decay"]
        g_sq = g + wd * w if wd and not decoupled else g
        a = a + np.mean(g_sq * g_sq)
        multiplier = lr / (np.sqrt(a) + opt["epsilon"])
        correction = 1.0 if not wd else (1.0 - lr * wd if decoupled else 1.0 - multiplier * wd)
        return correction * w - g * multiplier, [a]
    raise ValueError(name)


def apply_step(opt, lr, table, slots, grads):
    """The per-row pipeline (docs/semantics.md): clip g -> decay -> optimizer -> clip w, on touched rows (all rows
    for non-lazy Adam, with a zero gradient where untouched).  Returns new (table, slots) as float32 arrays.

    `lr` and the float settings of `opt` are rounded to float32 first (the engine's precision; module docstring).
    """
    opt, lr = _float32_settings(opt), f32(lr)
    table = np.asarray(table, np.float64).copy()
    slots = [np.asarray(s, np.float64).copy() for s in slots]
    rows = sorted(grads)
    if opt.get("use_non_lazy_adam", False) or opt.get("use_non_lazy_lion", False):
        rows = range(table.shape[0])
    for r in rows:
        g = np.asarray(grads.get(r, np.zeros(table.shape[1])), np.float64)
        if "gradient_clip" in opt:
            g = np.clip(g, *opt["gradient_clip"])
        w = table[r]
        wd = opt.get("weight_decay", 0.0)
        if wd:
            w = w - wd * (lr if opt.get("multiply_weight_decay_by_lr", False) else 1.0) * w
        w, new_slots = _optimizer_row(opt, lr, g, w, [s[r] for s in slots])
        if "weight_clip" in opt:
            w = np.clip(w, *opt["weight_clip"])
        table[r] = w
        for s, value in zip(slots, new_slots, strict=True):
            s[r] = value
    return table.astype(np.float32), [s.astype(np.float32) for s in slots]


# ---------------------------------------------------------------------------------------------- front-end tests
# The mid-level, Keras and sharded tests describe a feature as rows of ids (RefFeature) and a table with its slots
# (RefTable); both go through the functions above (entries_from_rows, forward, row_gradients, apply_step).


@dataclasses.dataclass
class RefFeature:
    """One feature's batch: rows of ids (dense features: one id per row) and optional per-id weights."""

    table: str
    rows: list  # list[list[int]]
    weights: list | None = None  # same nesting as rows, or None for all ones
    max_sequence_length: int = 0  # > 0: output [B, L, dim], id k of row b at (b, k), k >= L dropped

    def entries(self) -> tuple[list, tuple]:
        """`(entries, sample_shape)` of `entries_from_rows`."""
        return entries_from_rows(self.rows, self.weights, self.max_sequence_length)

    def output_shape(self, dim: int) -> tuple:
        return self.entries()[1] + (dim,)


def ref_activations(feature: RefFeature, table: np.ndarray, combiner: str, quantization=None) -> np.ndarray:
    """The feature's activations (`forward`), shape `output_shape(dim)`."""
    entries, shape = feature.entries()
    return forward(table, entries, shape, combiner, quantization)


def ref_row_gradients(feature: RefFeature, dact: np.ndarray, combiner: str, into: dict) -> None:
    """Adds the feature's per-row gradients (`row_gradients`) into `{row: gradient}` (touched rows are keys)."""
    entries, shape = feature.entries()
    dact = np.asarray(dact, np.float32)
    dact = dact.reshape(shape + (dact.shape[-1],))
    vocabulary_size = 1 + max((i for _, i, _ in entries), default=-1)
    for row, gradient in row_gradients([(entries, combiner, dact)], vocabulary_size).items():
        into[row] = into.get(row, 0.0) + gradient


class RefTable:
    """One table and its slots, updated as the engine does (accumulate, clip g, decay, optimizer, clip w) by
    `apply_step`: one numpy model of the optimizers for every test suite."""

    def __init__(self, params: np.ndarray, optimizer):
        self.params = np.array(params, dtype=np.float32)
        self.opt = optimizer
        self.spec = spec_from_optimizer(optimizer)
        rows = self.params.shape[0]
        self.slots = {
            name: np.full((rows, 1), value, np.float32) if name in PER_ROW_SLOTS else np.full_like(self.params, value)
            for name, value in initial_slot_values(optimizer).items()
        }

    def apply(self, grads: dict, lr: float) -> None:
        names = list(self.slots)
        self.params, slots = apply_step(self.spec, lr, self.params, [self.slots[n] for n in names], grads)
        self.slots = dict(zip(names, slots, strict=True))
