"""Our engine: the fused step (``embedding_activations`` + ``send_tpu_embedding_gradients``) on a workload.

One step is what the TPU engine does: normalise the features (in the graph, as the enqueue does), look up and
combine, then apply the fused backward + optimizer update in place, given the activations' gradient (a fixed
upstream tensor, the same for every engine). A training step returns nothing, as the speed-of-light kernel's
step run by TensorFlow does: a training loop feeds the activations to its model inside the graph and never hands
them to Python. Both ops are stateful, so the function still runs them (as its control outputs). For the same
reason a training step's features and gradients are constants of its graph (``raw_features`` and
``activation_gradients`` called inside it): a training loop's features come from an iterator in its graph and
their gradients from its model, and the kernel steps on data it holds, so neither hands its data to the step at
each call. The serving lookup takes its features from outside, as a request's are.
The hyper-parameters are those of ``peers/tf_native.py`` so every engine runs the same update rule.

Example:
    >>> step = fused_step(w1(smoke=True), "adagrad")  # doctest: +SKIP
    >>> step()                                        # one training step  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2 as opt_pb2
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as cfg_pb2

from benchmarks.peers import tf_native as tn
from benchmarks.workloads import Workload

# Our optimizers in the suite, with their slot initial values (Load/Retrieve order; TPU defaults).
SLOT_INIT = {
    "sgd": [],
    "adagrad": [tn.ADAGRAD_INIT],
    "adagrad_momentum": [tn.ADAGRAD_INIT, 0.0],
    "adam": [0.0, 0.0],
    "adam_nonlazy": [0.0, 0.0],
    "ftrl": [tn.ADAGRAD_INIT, 0.0],
    "momentum": [0.0],
    "rms_prop": [1.0, 0.0],
    "centered_rms_prop": [1.0, 0.0, 0.0],
    "rowwise_adagrad": [0.0],  # FBGEMM's momentum1 starts at 0; one value per row
}
OPTIMIZERS = tuple(SLOT_INIT)
# Slots of one value per row ([vocab, 1]), as the optimizer schema declares them.
PER_ROW_SLOTS = {"rowwise_adagrad"}


def table_optimizer(optimizer: str):
    """The suite's optimizer ``optimizer`` as a user writes it, with the hyper-parameters of ``peers/tf_native.py``.

    Its proto comes from the optimizer schema, through ``tf_embed_ops.config.from_feature_config``: the suite
    keeps no list of proto fields of its own.
    """
    from tf_embed_ops import optimizers as catalogue

    emb = tf.tpu.experimental.embedding
    if optimizer == "sgd":
        return emb.SGD(tn.LR)
    if optimizer == "adagrad":
        return emb.Adagrad(tn.LR, initial_accumulator_value=tn.ADAGRAD_INIT)
    if optimizer == "adagrad_momentum":
        return emb.AdagradMomentum(
            tn.LR, momentum=tn.MOMENTUM, exponent=2.0, beta2=1.0, epsilon=tn.ADAGRAD_MOMENTUM_EPS
        )
    if optimizer in ("adam", "adam_nonlazy"):
        return emb.Adam(
            tn.LR,
            beta_1=tn.BETA1,
            beta_2=tn.BETA2,
            epsilon=tn.EPS,
            lazy_adam=optimizer == "adam",
            sum_inside_sqrt=False,  # the peers' Adam: sqrt(v) + epsilon
        )
    if optimizer == "ftrl":
        return emb.FTRL(tn.LR, learning_rate_power=-0.5, initial_accumulator_value=tn.ADAGRAD_INIT)
    if optimizer == "momentum":
        return catalogue.Momentum(tn.LR, momentum=tn.MOMENTUM)
    if optimizer in ("rms_prop", "centered_rms_prop"):
        cls = catalogue.RMSProp if optimizer == "rms_prop" else catalogue.CenteredRMSProp
        return cls(tn.LR, rho=tn.RHO, momentum=tn.MOMENTUM, epsilon=tn.EPS)
    if optimizer == "rowwise_adagrad":
        # FBGEMM's peer runs eps 1e-8, no weight decay.
        return catalogue.RowWiseAdagrad(tn.LR, epsilon=1e-8, weight_decay=0.0, decoupled_weight_decay=False)
    raise ValueError(f"optimizer: unknown {optimizer!r}; expected one of {OPTIMIZERS}")


def _optimization_parameters(optimizer: str) -> opt_pb2.OptimizationParameters:
    from tf_embed_ops import config as te_config

    emb = tf.tpu.experimental.embedding
    table = emb.TableConfig(1, 1, optimizer=table_optimizer(optimizer), name="t")
    return te_config.from_feature_config([emb.FeatureConfig(table)]).table_descriptor[0].optimization_parameters


def make_config(wl: Workload, optimizer: str) -> cfg_pb2.TPUEmbeddingConfiguration:
    """The TPUEmbeddingConfiguration of the workload: one table descriptor per table, one feature each."""
    cfg = cfg_pb2.TPUEmbeddingConfiguration()
    cfg.mode = cfg_pb2.TPUEmbeddingConfiguration.TRAINING
    cfg.num_hosts = 1
    cfg.num_tensor_cores = 1
    cfg.sharding_strategy = cfg_pb2.TPUEmbeddingConfiguration.DIV_DEFAULT
    for t in wl.tables:
        td = cfg.table_descriptor.add()
        td.name, td.vocabulary_size, td.dimension = t.name, t.vocab, t.dim
        td.optimization_parameters.CopyFrom(_optimization_parameters(optimizer))
    for f in wl.features:
        fd = cfg.feature_descriptor.add()
        fd.name, fd.table_id = f.name, f.table
        fd.input_shape.extend([f.batch, f.sequence_length] if f.sequence_length else [f.batch])
    return cfg


def raw_features(wl: Workload) -> list:
    """The features as a user hands them over: dense ids, or RaggedTensors for bags and sequences.

    Called inside a ``tf.function``, they are constants of its graph; called eagerly, tensors a function captures
    (and is handed at each call).
    """
    out = []
    for f in wl.features:
        ids = tf.constant(f.ids, tf.int64)
        if f.row_splits is None:
            out.append(ids)
        else:
            out.append(tf.RaggedTensor.from_row_splits(ids, tf.constant(f.row_splits, tf.int64), validate=False))
    return out


def activation_gradients(wl: Workload) -> list[tf.Tensor]:
    """Each feature's fixed activation gradient (``tf_native.upstream_gradients``), as constants of the graph it is
    called in."""
    return [tf.constant(g) for g in tn.upstream_gradients(wl)]


def _state(wl: Workload, optimizer: str) -> tuple[list[tf.Variable], list[list[tf.Variable]]]:
    tables = tn.make_tables(wl, 0)
    slots = [
        [
            tf.Variable(tf.fill([t.vocab, 1 if optimizer in PER_ROW_SLOTS else t.dim], v), name=f"{t.name}_s{i}")
            for i, v in enumerate(SLOT_INIT.get(optimizer, []))
        ]
        for t in wl.tables
    ]
    return tables, slots


def _api():
    from tf_embed_ops import embedding_ops

    return embedding_ops


def fused_step(wl: Workload, optimizer: str) -> Callable[[], None]:
    """One fused training step of ``optimizer`` on ``wl`` (forward, loss gradient, fused backward + update)."""
    api = _api()
    cfg = make_config(wl, optimizer).SerializeToString()
    tables, slots = _state(wl, optimizer)
    combiners = [wl.combiner] * len(wl.tables)
    lengths = [f.sequence_length for f in wl.features]

    @tf.function
    def step():
        raw = raw_features(wl)
        feats = [api.normalize_feature(x, max_sequence_length=n) for x, n in zip(raw, lengths, strict=True)]
        api.embedding_activations(feats, tables, cfg, combiners)
        # The activations' gradient is the fixed upstream tensor (as for every engine): the model between the
        # activations and the loss is not what is measured.
        api.send_tpu_embedding_gradients(activation_gradients(wl), [], feats, tables, slots, cfg, combiners)

    step.state = (tables, slots)
    return step


def lookup_step(wl: Workload) -> Callable[[], list[tf.Tensor]]:
    """Serving: our forward op alone (normalise + look up + combine)."""
    api = _api()
    cfg = make_config(wl, "sgd").SerializeToString()
    tables = tn.make_tables(wl, 3)
    raw = raw_features(wl)
    combiners = [wl.combiner] * len(wl.tables)
    lengths = [f.sequence_length for f in wl.features]

    @tf.function
    def step():
        feats = [api.normalize_feature(x, max_sequence_length=n) for x, n in zip(raw, lengths, strict=True)]
        return api.embedding_activations(feats, tables, cfg, combiners)

    step.tables = tables
    return step


def available() -> tuple[bool, str]:
    """(True, "") if the op library and the fused wrappers load, else (False, why)."""
    try:
        _api()
        import tf_embed_ops

        _ = tf_embed_ops.ops
    except Exception as e:  # reported in the results, never hidden
        return False, f"{type(e).__name__}: {e}"
    return True, ""
