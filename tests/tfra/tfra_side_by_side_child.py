"""Child of test_tfra_side_by_side.py, run by the TFRA interpreter (TensorFlow 2.16 + TFRA 0.8.1 + tf_keras).

Trains the same keys, from the same initial rows, with the same batches and upstream gradients, in TFRA
(`de.keras.layers.Embedding` + `de.DynamicEmbeddingOptimizer` around a tf_keras optimizer) and, when tf_embed_ops
imports in this interpreter, in `tf_embed_ops.tfra` (around the Keras 3 optimizer of the same family); prints one
JSON object: per library and optimizer, the lookups of every step, the final rows and slots of every key (sorted by
key), or why tf_embed_ops did not run here.

    python tfra_side_by_side_child.py JOB.json
"""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":  # (imported by the test to train tf_embed_ops.tfra on our own TensorFlow)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # TFRA drives Keras 2 (tf_keras) optimizers
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

SLOT_NAMES = {"sgd": [], "adagrad": ["accumulator"], "adam": ["m", "v"]}


def _optimizer(kind: str, module, job: dict):
    lr = job["learning_rate"]
    if kind == "sgd":
        return module.optimizers.SGD(lr)
    if kind == "adagrad":
        return module.optimizers.Adagrad(lr, initial_accumulator_value=job["adagrad_init"], epsilon=job["epsilon"])
    return module.optimizers.Adam(lr, beta_1=job["beta_1"], beta_2=job["beta_2"], epsilon=job["epsilon"])


def train(de, keras_module, kind: str, job: dict, ours: bool) -> dict:
    keys = np.array(job["keys"], np.int64)
    layer = de.keras.layers.Embedding(job["dim"], initializer=keras_module.initializers.Zeros(), name=f"sbs_{kind}")
    optimizer = de.DynamicEmbeddingOptimizer(_optimizer(kind, keras_module, job))
    layer.params.upsert(tf.constant(keys), tf.constant(np.array(job["initial_rows"], np.float32)))
    lookups = []
    for batch, upstream in zip(job["batches"], job["upstream"], strict=True):
        with tf.GradientTape() as tape:
            out = layer(tf.constant(keys[np.array(batch)]))
            loss = tf.reduce_sum(out * tf.constant(np.array(upstream, np.float32)))
        variables = layer.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        lookups.append(out.numpy().tolist())
    exported_keys, rows = layer.params.export()
    order = np.argsort(exported_keys.numpy())
    slots = {}
    if ours:
        packed = layer.params.table.export()["slots"].numpy()
        for i, name in enumerate(SLOT_NAMES[kind]):
            slots[name] = packed[:, i * job["dim"] : (i + 1) * job["dim"]].tolist()
    else:
        for slot in layer.params.get_slot_variables(optimizer):
            if slot.name.split("/")[-1] not in SLOT_NAMES[kind]:
                continue  # TFRA lists the slots of every optimizer that trained a table
            slot_keys, values = slot.export()
            index = {k: i for i, k in enumerate(slot_keys.numpy().tolist())}
            sorted_keys = exported_keys.numpy()[order].tolist()
            slots[slot.name.split("/")[-1]] = [values.numpy()[index[k]].tolist() for k in sorted_keys if k in index]
    return {
        "lookups": lookups,
        "keys": exported_keys.numpy()[order].tolist(),
        "rows": rows.numpy()[order].tolist(),
        "slots": slots,
        "iterations": int(optimizer.iterations.numpy()),
    }


def main(path: str) -> int:
    with open(path) as f:
        job = json.load(f)
    import tensorflow_recommenders_addons as tfra
    import tensorflow_recommenders_addons.dynamic_embedding as tfra_de
    import tf_keras

    out = {"tensorflow": tf.__version__, "tfra_version": tfra.__version__, "tfra": {}, "ours": {}}
    for kind in job["optimizers"]:
        out["tfra"][kind] = train(tfra_de, tf_keras, kind, job, ours=False)
    try:
        import keras

        import tf_embed_ops.tfra as te_de

        te_de.get_variable("probe", dim=1).size()  # loads the op library
    except Exception as e:  # reported to the parent, which skips saying why
        out["ours_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:400]}"
    else:
        for kind in job["optimizers"]:
            out["ours"][kind] = train(te_de, keras, kind, job, ours=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
