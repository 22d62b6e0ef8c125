"""An independent numpy model of the TPU embedding engine, written from docs/semantics.md.

Inputs are plain Python: per feature, rows of ids (and optional weights) and the layout of its output (per row,
or a sequence of length L).  Used by the mid-level and Keras tests as the reference; optimizer steps come from
numpy_reference.py.  It shares no code with tf_embed_ops.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tests import numpy_reference


@dataclasses.dataclass
class RefFeature:
    table: str
    rows: list  # list[list[int]] ids per row (dense features: one id per row)
    weights: list | None = None  # same nesting as rows, or None for all ones
    max_sequence_length: int = 0  # > 0: output [B, L, dim], id k of row b at (b, k), k >= L dropped

    def samples(self) -> list:
        """Output samples in row-major order, each a list of (id, weight); weights rounded to float32, the
        precision of the op's weights input (the reference must compute with the values the kernels receive)."""
        weights = [[numpy_reference.f32(w) for w in ws] for ws in self.weights] if self.weights else None
        weights = weights or [[1.0] * len(r) for r in self.rows]
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
    """grad[r] += w_i / norm_s * dL/dact[s], accumulated into {row: grad} (touched rows are the keys).

    dact is rounded to float32 first: the op receives the activation gradients as float32."""
    dact = np.asarray(dact, np.float32).astype(np.float64)
    flat = dact.reshape(-1, dact.shape[-1])
    for s, sample in enumerate(feature.samples()):
        norm = _norm(sample, combiner)
        for i, w in sample:
            scale = 0.0 if norm == 0.0 else w / norm
            into[i] = into.get(i, 0.0) + scale * flat[s]


class RefTable:
    """One table and its slots, updated as the engine does (accumulate, clip g, decay, optimizer, clip w) by the
    per-row reference of numpy_reference.py: one numpy model of the optimizers for every test suite."""

    def __init__(self, params: np.ndarray, optimizer):
        self.params = np.array(params, dtype=np.float32)
        self.opt = optimizer
        self.spec = numpy_reference.spec_from_optimizer(optimizer)
        rows = self.params.shape[0]
        self.slots = {
            name: np.full((rows, 1), value, np.float32)
            if name in numpy_reference.PER_ROW_SLOTS
            else np.full_like(self.params, value)
            for name, value in numpy_reference.initial_slot_values(optimizer).items()
        }

    def apply(self, grads: dict, lr: float) -> None:
        names = list(self.slots)
        self.params, slots = numpy_reference.apply_step(
            self.spec, lr, self.params, [self.slots[n] for n in names], grads
        )
        self.slots = dict(zip(names, slots, strict=True))
