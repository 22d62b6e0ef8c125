"""keras-rs's `DistributedEmbedding` on CPU vs ours, one training step each, on the same ids.

* ``keras_rs``: `keras_rs.layers.DistributedEmbedding` as it runs off SparseCore: plain embedding tables trained
  by the model's Keras Adam (dense: every row's slots are read and written every step).
* ``ours_keras_rs``: `tf_embed_ops.keras.DistributedEmbedding` from the same configs, the table's own Adam (the
  TPU's lazy Adam, mapped from the same `keras.optimizers.Adam`); the model's Adam sees only the update trigger.

Both run the Keras train-step pattern (tape over the layer call, `apply_gradients` on the trainable weights) with
the workload's fixed upstream gradient, and return the activations so nothing is pruned. keras-rs is optional:
without it the builders raise ImportError, which the suite records as that engine's error.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from benchmarks.peers.tf_native import BETA1, BETA2, EPS, LR, make_inputs
from benchmarks.workloads import Workload


def _configs(wl: Workload, keras_rs, table_optimizer) -> dict:
    import keras  # pylint: disable=import-outside-toplevel

    tables = [
        keras_rs.layers.TableConfig(
            name=t.name,
            vocabulary_size=t.vocab,
            embedding_dim=t.dim,
            initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=i),
            optimizer=table_optimizer(),
            combiner=wl.combiner,
        )
        for i, t in enumerate(wl.tables)
    ]
    out = {}
    for f in wl.features:
        if f.kind == "sequence":
            raise NotImplementedError("DistributedEmbedding combines every sample's ids; no sequence features")
        dim = wl.tables[f.table].dim
        shape = (f.batch,) if f.kind == "single" else (f.batch, int(np.diff(f.row_splits).max()))
        out[f.name] = keras_rs.layers.FeatureConfig(
            name=f.name, table=tables[f.table], input_shape=shape, output_shape=(f.batch, dim)
        )
    return out


def _step(layer, wl: Workload, training_kwargs: dict) -> Callable[[], list]:
    import keras  # pylint: disable=import-outside-toplevel

    inputs = make_inputs(wl)
    feeds, upstream = {}, []
    for f, entry in zip(wl.features, inputs["features"], strict=True):
        if f.kind == "single":
            feeds[f.name] = entry["ids"]
        else:
            feeds[f.name] = tf.RaggedTensor.from_row_splits(entry["ids"], entry["row_splits"])
        upstream.append(entry["upstream"])
    names = sorted(feeds)  # dict outputs flatten in key order
    upstream = [upstream[[f.name for f in wl.features].index(n)] for n in names]
    model_optimizer = keras.optimizers.Adam(LR, BETA1, BETA2, EPS)
    layer(feeds)  # build
    model_optimizer.build(layer.trainable_variables)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            acts = layer(feeds, **training_kwargs)
            flat = [acts[n] for n in names]
        grads = tape.gradient(flat, layer.trainable_variables, output_gradients=upstream)
        model_optimizer.apply_gradients(zip(grads, layer.trainable_variables, strict=True))
        return flat

    step.layer = layer  # keep the state alive with the function
    return step


def keras_rs_step(wl: Workload) -> Callable[[], list]:
    """keras-rs's layer off SparseCore: the model's Keras Adam trains the tables."""
    import keras_rs  # pylint: disable=import-outside-toplevel

    layer = keras_rs.layers.DistributedEmbedding(_configs(wl, keras_rs, lambda: "adam"))
    return _step(layer, wl, {})


def ours_step(wl: Workload) -> Callable[[], list]:
    """Ours from the same keras-rs configs, each table trained by its own (TPU, lazy) Adam."""
    import keras  # pylint: disable=import-outside-toplevel
    import keras_rs  # pylint: disable=import-outside-toplevel

    from tf_embed_ops.keras import DistributedEmbedding  # pylint: disable=import-outside-toplevel

    configs = _configs(wl, keras_rs, lambda: keras.optimizers.Adam(LR, BETA1, BETA2, EPS))
    return _step(DistributedEmbedding(configs), wl, {"training": True})


# Engine name -> builder; the suite times these next to its Adam engines on W1.
ENGINES = {"keras_rs": keras_rs_step, "ours_keras_rs": ours_step}
