"""An independent numpy model of the TPU embedding engine, written from specs/tpu_embedding.md (sections 1-3).

Float64 throughout. Inputs are plain Python: per feature, rows of ids (and optional weights) and the layout of
its output (per row, or a sequence of length L). Used by the mid-level and Keras tests as the reference; it
shares no code with tf_embed_ops.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class RefFeature:
    table: str
    rows: list  # list[list[int]] ids per row (dense features: one id per row)
    weights: list | None = None  # same nesting as rows, or None for all ones
    max_sequence_length: int = 0  # > 0: output [B, L, dim], id k of row b at (b, k), k >= L dropped

    def samples(self) -> list:
        """Output samples in row-major order, each a list of (id, weight)."""
        weights = self.weights or [[1.0] * len(r) for r in self.rows]
        if self.max_sequence_length:
            out = []
            for ids, ws in zip(self.rows, weights, strict=False):
                for k in range(self.max_sequence_length):
                    out.append([(ids[k], ws[k])] if k < len(ids) else [])
            return out
        return [list(zip(ids, ws, strict=False)) for ids, ws in zip(self.rows, weights, strict=False)]

    def output_shape(self, dim: int) -> tuple:
        b = len(self.rows)
        return (b, self.max_sequence_length, dim) if self.max_sequence_length else (b, dim)


def _norm(sample: list, combiner: str) -> float:
    if combiner == "sum":
        return 1.0
    if combiner == "mean":
        return sum(w for _, w in sample)
    return float(np.sqrt(sum(w * w for _, w in sample)))


def quantize(x: np.ndarray, lower: float, upper: float, num_buckets: int) -> np.ndarray:
    q = (upper - lower) / (num_buckets - 1)
    return np.floor((np.clip(x, lower, upper) - lower) / q + 0.5) * q + lower


def activations(feature: RefFeature, table: np.ndarray, combiner: str, quantization=None) -> np.ndarray:
    """act[s] = sum_i w_i * E[id_i] / norm_s; 0 for an empty sample or a zero norm."""
    dim = table.shape[1]
    rows = table if quantization is None else quantize(table, *quantization)
    out = []
    for sample in feature.samples():
        norm = _norm(sample, combiner)
        acc = np.zeros(dim)
        if sample and norm != 0.0:
            for i, w in sample:
                acc += w / norm * rows[i]
        out.append(acc)
    return np.asarray(out, dtype=np.float64).reshape(feature.output_shape(dim))


def row_gradients(feature: RefFeature, dact: np.ndarray, combiner: str, into: dict) -> None:
    """grad[r] += w_i / norm_s * dL/dact[s], accumulated into {row: grad} (touched rows are the keys)."""
    flat = dact.reshape(-1, dact.shape[-1])
    for s, sample in enumerate(feature.samples()):
        norm = _norm(sample, combiner)
        for i, w in sample:
            scale = 0.0 if norm == 0.0 else w / norm
            into[i] = into.get(i, 0.0) + scale * flat[s]


class RefTable:
    """One table and its slots, updated as the engine does: accumulate, clip g, decay, optimizer, clip w."""

    def __init__(self, params: np.ndarray, optimizer):
        self.params = np.array(params, dtype=np.float64)
        self.opt = optimizer
        kind = type(optimizer).__name__
        self.kind = kind
        zeros = np.zeros_like(self.params)
        if kind == "Adagrad":
            self.slots = {"accumulators": np.full_like(self.params, optimizer.initial_accumulator_value)}
        elif kind == "AdagradMomentum":
            self.slots = {"accumulators": zeros.copy(), "momenta": zeros.copy()}
        elif kind == "Adam":
            self.slots = {"momenta": zeros.copy(), "velocities": zeros.copy()}
        elif kind == "FTRL":
            self.slots = {
                "accumulators": np.full_like(self.params, optimizer.initial_accumulator_value),
                "linears": zeros.copy(),
            }
        else:
            self.slots = {}

    def apply(self, grads: dict, lr: float) -> None:
        o = self.opt
        rows = set(grads)
        if self.kind == "Adam" and not o.lazy_adam:
            rows = set(range(self.params.shape[0]))
        for r in sorted(rows):
            g = np.array(grads.get(r, np.zeros(self.params.shape[1])), dtype=np.float64)
            lo = -np.inf if o.clip_gradient_min is None else o.clip_gradient_min
            hi = np.inf if o.clip_gradient_max is None else o.clip_gradient_max
            g = np.clip(g, lo, hi)
            w = self.params[r]
            if o.weight_decay_factor:
                wd = o.weight_decay_factor * (lr if o.multiply_weight_decay_factor_by_learning_rate else 1.0)
                w = w - wd * w
            w = self._update(r, w, g, lr)
            lo = -np.inf if o.clip_weight_min is None else o.clip_weight_min
            hi = np.inf if o.clip_weight_max is None else o.clip_weight_max
            self.params[r] = np.clip(w, lo, hi)

    def _update(self, r: int, w: np.ndarray, g: np.ndarray, lr: float) -> np.ndarray:
        o, s = self.opt, self.slots
        if self.kind == "SGD":
            return w - lr * g
        if self.kind == "Adagrad":
            s["accumulators"][r] += g * g
            return w - lr * g / np.sqrt(s["accumulators"][r])
        if self.kind == "AdagradMomentum":
            a = s["accumulators"][r]
            a[:] = a + g * g if o.beta2 == 1 else o.beta2 * a + (1 - o.beta2) * g * g
            scaled = g * np.power(a + o.epsilon, -1.0 / o.exponent)
            m = s["momenta"][r]
            m[:] = o.momentum * m + scaled
            return w - lr * (o.momentum * m + scaled if o.use_nesterov else m)
        if self.kind == "Adam":
            m, v = s["momenta"][r], s["velocities"][r]
            m[:] = o.beta_1 * m + (1 - o.beta_1) * g
            v[:] = o.beta_2 * v + (1 - o.beta_2) * g * g
            if o.sum_inside_sqrt:
                return w - lr * m / np.sqrt(v + o.epsilon**2)
            return w - lr * m / (np.sqrt(v) + o.epsilon)
        if self.kind == "FTRL":
            a, lin = s["accumulators"][r], s["linears"][r]
            p = -o.learning_rate_power
            new_a = a + g * g
            l1, l2, beta = o.l1_regularization_strength, o.l2_regularization_strength, o.beta
            if o.multiply_linear_by_learning_rate:
                lin[:] = lin + lr * g - (new_a**p - a**p) * w
                quad = new_a**p + 2 * lr * l2 + beta
                threshold = lr * l1
            else:
                lin[:] = lin + g - (new_a**p - a**p) / lr * w
                quad = (new_a**p + beta) / lr + 2 * l2
                threshold = l1
            a[:] = new_a
            return np.where(np.abs(lin) > threshold, np.sign(lin) * threshold - lin, 0.0) / quad
        raise ValueError(self.kind)
