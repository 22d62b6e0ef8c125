"""TensorFlow-native peers: what a TensorFlow user does today without this package.

Each builder takes a ``Workload`` and returns a zero-argument step function (a ``tf.function`` call) running the
same forward + backward + update as our fused step, on its own copy of the tables:

* ``keras_step``: Keras 3 optimizers on ``tf.Variable`` tables, ``tf.nn.embedding_lookup`` /
  ``tf.nn.embedding_lookup_sparse`` forward, ``tf.GradientTape`` backward (IndexedSlices gradients).
* ``raw_op_step``: the tape's IndexedSlices de-duplicated with ``tf.unique`` + ``tf.math.unsorted_segment_sum``,
  then ``tf.raw_ops.ResourceSparseApply*`` (or ``ResourceScatterSub`` for SGD, ``ResourceApplyAdam`` for dense Adam);
  where TensorFlow has no sparse kernel (lazy Adam, AdagradMomentum) a gather -> math -> scatter composite.
* ``lookup_step``: the serving path, ``tf.nn.embedding_lookup`` / ``tf.nn.embedding_lookup_sparse`` alone.

Hyper-parameters follow the TPU optimizers (``benchmarks/ours.py``): no Adam bias correction, Adagrad without
epsilon, FTRL lr_power -0.5. The activations' gradient is a fixed random tensor per feature, fed to the tape as
``output_gradients`` (no loss is computed: the model between activations and loss is not what is measured), and
the activations are returned so that no engine's forward pass can be pruned.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from benchmarks.workloads import Workload

LR = 0.01
ADAGRAD_INIT = 0.1
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8
MOMENTUM = 0.9
ADAGRAD_MOMENTUM_EPS = 1e-10  # tf.tpu.experimental.embedding.AdagradMomentum's default
RHO = 0.9

# Which of our optimizers each peer covers (others are reported as "no such peer").
KERAS_OPTIMIZERS = ("sgd", "adagrad", "adam", "adam_nonlazy", "ftrl")
RAW_OPTIMIZERS = (
    "sgd",
    "adagrad",
    "adagrad_momentum",
    "adam",
    "adam_nonlazy",
    "ftrl",
    "momentum",
    "rms_prop",
    "centered_rms_prop",
)
RAW_KIND = {
    "adam": "gather/scatter",
    "adagrad_momentum": "gather/scatter",
    "adam_nonlazy": "ResourceApplyAdam",
    "sgd": "ResourceScatterSub",
    "adagrad": "ResourceSparseApplyAdagradV2",
    "ftrl": "ResourceSparseApplyFtrl",
    "momentum": "ResourceSparseApplyMomentum",
    "rms_prop": "ResourceSparseApplyRMSProp",
    "centered_rms_prop": "ResourceSparseApplyCenteredRMSProp",
}


def upstream_gradients(wl: Workload) -> list[np.ndarray]:
    """The fixed gradient of each feature's activation ([batch, dim], or [batch, length, dim] for a sequence), the
    same draws for every engine."""
    rng = np.random.default_rng(7)
    out = []
    for f in wl.features:
        dim = wl.tables[f.table].dim
        shape = [f.batch, f.sequence_length, dim] if f.kind == "sequence" else [f.batch, dim]
        out.append(rng.standard_normal(shape).astype(np.float32) * 1e-3)
    return out


def make_inputs(wl: Workload) -> dict:
    """TF tensors of one step (same ids for every engine) and fixed upstream gradients."""
    feats = []
    for f, upstream in zip(wl.features, upstream_gradients(wl), strict=True):
        ids = tf.constant(f.ids, tf.int64)
        entry = {"ids": ids, "table": f.table, "kind": f.kind, "batch": f.batch, "length": f.sequence_length}
        if f.kind == "bag":
            rows = np.repeat(np.arange(f.batch, dtype=np.int64), np.diff(f.row_splits))
            cols = np.arange(f.ids.shape[0], dtype=np.int64) - f.row_splits[rows]
            width = int(np.diff(f.row_splits).max()) if f.ids.shape[0] else 1
            entry["sparse"] = tf.SparseTensor(np.stack([rows, cols], 1), ids, [f.batch, max(width, 1)])
            entry["row_splits"] = tf.constant(f.row_splits, tf.int64)
        if f.kind == "sequence":
            entry["row_splits"] = tf.constant(f.row_splits, tf.int64)
        entry["upstream"] = tf.constant(upstream)
        feats.append(entry)
    return {"features": feats}


def make_tables(wl: Workload, seed: int = 0) -> list[tf.Variable]:
    """Fresh table variables (uniform(-0.05, 0.05): the values do not affect the speed of any engine)."""
    return [
        tf.Variable(tf.random.stateless_uniform([t.vocab, t.dim], [seed, i], -0.05, 0.05), name=t.name)
        for i, t in enumerate(wl.tables)
    ]


def _forward(tables: list[tf.Variable], inputs: dict, combiner: str) -> list[tf.Tensor]:
    acts = []
    for f in inputs["features"]:
        table = tables[f["table"]]
        if f["kind"] == "bag":
            acts.append(tf.nn.embedding_lookup_sparse(table, f["sparse"], None, combiner=combiner))
        elif f["kind"] == "sequence":
            rows = tf.nn.embedding_lookup(table, f["ids"])
            acts.append(tf.reshape(rows, [f["batch"], f["length"], -1]))
        else:
            acts.append(tf.nn.embedding_lookup(table, f["ids"]))
    return acts


def _table_grads(tape: tf.GradientTape, acts: list[tf.Tensor], tables: list[tf.Variable], inputs: dict) -> list:
    """IndexedSlices gradient per table, given the fixed upstream gradient of each activation."""
    return tape.gradient(acts, tables, output_gradients=[f["upstream"] for f in inputs["features"]])


def keras_step(wl: Workload, optimizer: str) -> Callable[[], tf.Tensor]:
    """Keras 3 optimizer on tf.Variable tables. Keras has no lazy Adam: "adam" and "adam_nonlazy" both run Adam."""
    import keras

    if optimizer not in KERAS_OPTIMIZERS:
        raise NotImplementedError(f"Keras 3 has no {optimizer} optimizer")
    make = {
        "sgd": lambda: keras.optimizers.SGD(LR),
        "adagrad": lambda: keras.optimizers.Adagrad(LR, initial_accumulator_value=ADAGRAD_INIT, epsilon=1e-7),
        "adam": lambda: keras.optimizers.Adam(LR, BETA1, BETA2, EPS),
        "adam_nonlazy": lambda: keras.optimizers.Adam(LR, BETA1, BETA2, EPS),
        "ftrl": lambda: keras.optimizers.Ftrl(LR, initial_accumulator_value=ADAGRAD_INIT),
    }[optimizer]
    opt = make()
    tables = make_tables(wl, 1)
    inputs = make_inputs(wl)
    opt.build(tables)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            acts = _forward(tables, inputs, wl.combiner)
        grads = _table_grads(tape, acts, tables, inputs)
        opt.apply_gradients(zip(grads, tables, strict=True))
        return acts

    step.tables = tables  # keep the state alive with the function
    return step


def _dedup(grad: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor]:
    uniq, idx = tf.unique(grad.indices)
    return uniq, tf.math.unsorted_segment_sum(grad.values, idx, tf.shape(uniq)[0])


def _slot(table: tf.Variable, value: float = 0.0) -> tf.Variable:
    return tf.Variable(tf.fill(tf.shape(table), value))


def _raw_apply(optimizer: str, table: tf.Variable, slots: list[tf.Variable], uniq: tf.Tensor, g: tf.Tensor):
    lr = tf.constant(LR)
    if optimizer == "sgd":
        return tf.raw_ops.ResourceScatterSub(resource=table.handle, indices=uniq, updates=lr * g)
    if optimizer == "adagrad":
        return tf.raw_ops.ResourceSparseApplyAdagradV2(
            var=table.handle, accum=slots[0].handle, lr=lr, epsilon=tf.constant(0.0), grad=g, indices=uniq
        )
    if optimizer == "ftrl":
        return tf.raw_ops.ResourceSparseApplyFtrl(
            var=table.handle,
            accum=slots[0].handle,
            linear=slots[1].handle,
            grad=g,
            indices=uniq,
            lr=lr,
            l1=tf.constant(0.0),
            l2=tf.constant(0.0),
            lr_power=tf.constant(-0.5),
        )
    if optimizer == "momentum":
        return tf.raw_ops.ResourceSparseApplyMomentum(
            var=table.handle, accum=slots[0].handle, lr=lr, grad=g, indices=uniq, momentum=tf.constant(MOMENTUM)
        )
    if optimizer in ("rms_prop", "centered_rms_prop"):
        centered = optimizer == "centered_rms_prop"
        apply = tf.raw_ops.ResourceSparseApplyCenteredRMSProp if centered else tf.raw_ops.ResourceSparseApplyRMSProp
        return apply(
            var=table.handle,
            ms=slots[0].handle,
            mom=slots[1].handle,
            lr=lr,
            rho=tf.constant(RHO),
            momentum=tf.constant(MOMENTUM),
            epsilon=tf.constant(EPS),
            grad=g,
            indices=uniq,
            **({"mg": slots[2].handle} if centered else {}),
        )
    if optimizer == "adam":
        # Lazy Adam, TPU form (no bias correction): gather the touched rows, update, scatter them back.
        m = BETA1 * tf.gather(slots[0], uniq) + (1 - BETA1) * g
        v = BETA2 * tf.gather(slots[1], uniq) + (1 - BETA2) * g * g
        w = tf.gather(table, uniq) - LR * m / (tf.sqrt(v) + EPS)
        return tf.group(
            slots[0].scatter_update(tf.IndexedSlices(m, uniq)),
            slots[1].scatter_update(tf.IndexedSlices(v, uniq)),
            table.scatter_update(tf.IndexedSlices(w, uniq)),
        )
    if optimizer == "adagrad_momentum":
        # TPU AdagradMomentum (exponent 2, beta2 1, no Nesterov): gather -> math -> scatter.
        a = tf.gather(slots[0], uniq) + g * g
        mom = MOMENTUM * tf.gather(slots[1], uniq) + g * tf.math.rsqrt(a + ADAGRAD_MOMENTUM_EPS)
        w = tf.gather(table, uniq) - LR * mom
        return tf.group(
            slots[0].scatter_update(tf.IndexedSlices(a, uniq)),
            slots[1].scatter_update(tf.IndexedSlices(mom, uniq)),
            table.scatter_update(tf.IndexedSlices(w, uniq)),
        )
    raise NotImplementedError(f"no raw-op peer for {optimizer}")


_RAW_SLOT_INIT = {
    "sgd": [],
    "adagrad": [ADAGRAD_INIT],
    "ftrl": [ADAGRAD_INIT, 0.0],
    "momentum": [0.0],
    "rms_prop": [1.0, 0.0],
    "centered_rms_prop": [1.0, 0.0, 0.0],
    "adam": [0.0, 0.0],
    "adam_nonlazy": [0.0, 0.0],
    "adagrad_momentum": [ADAGRAD_INIT, 0.0],
}


def raw_op_step(wl: Workload, optimizer: str) -> Callable[[], tf.Tensor]:
    """tf.unique + unsorted_segment_sum, then the ResourceSparseApply* kernel (or the composite) per table."""
    if optimizer not in RAW_OPTIMIZERS:
        raise NotImplementedError(f"no raw-op peer for {optimizer}")
    tables = make_tables(wl, 2)
    slots = [[_slot(t, v) for v in _RAW_SLOT_INIT[optimizer]] for t in tables]
    inputs = make_inputs(wl)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            acts = _forward(tables, inputs, wl.combiner)
        grads = _table_grads(tape, acts, tables, inputs)
        ops = []
        for t, (table, grad) in enumerate(zip(tables, grads, strict=True)):
            if optimizer == "adam_nonlazy":
                # Dense TPU Adam (every row, no bias correction: beta powers 0 make lr_t = lr).
                ops.append(
                    tf.raw_ops.ResourceApplyAdam(
                        var=table.handle,
                        m=slots[t][0].handle,
                        v=slots[t][1].handle,
                        beta1_power=tf.constant(0.0),
                        beta2_power=tf.constant(0.0),
                        lr=tf.constant(LR),
                        beta1=tf.constant(BETA1),
                        beta2=tf.constant(BETA2),
                        epsilon=tf.constant(EPS),
                        grad=tf.convert_to_tensor(grad),
                    )
                )
                continue
            uniq, g = _dedup(grad)
            ops.append(_raw_apply(optimizer, table, slots[t], uniq, g))
        with tf.control_dependencies(ops):
            return [tf.identity(a) for a in acts]

    step.state = (tables, slots)
    return step


def lookup_step(wl: Workload) -> Callable[[], list[tf.Tensor]]:
    """Serving: tf.nn.embedding_lookup (one id per sample, sequences) / tf.nn.embedding_lookup_sparse (bags)."""
    tables = make_tables(wl, 3)
    inputs = make_inputs(wl)

    @tf.function
    def step():
        return _forward(tables, inputs, wl.combiner)

    step.tables = tables
    return step
