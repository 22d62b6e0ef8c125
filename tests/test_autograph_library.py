"""AutoGraph treats tf_embed_ops as library code, as it treats TensorFlow's and Keras' own modules.

A `tf.function` that calls our classes converts the user's own code only: ours runs as written, as TensorFlow's TPU
embedding classes do (and a first trace does not spend seconds converting our functions one by one). The
package's examples are user code and are converted like it.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.autograph.impl import api as autograph_api
from tensorflow.python.autograph.impl import conversion

import tf_embed_ops as te
from tf_embed_ops import embedding_ops, tpu_embedding
from tf_embed_ops.examples import ctr

emb_api = tf.tpu.experimental.embedding


def _user_function(x):
    return x + 1


def test_our_functions_are_library_code_and_the_examples_and_user_code_are_not():
    assert te.TPUEmbedding is tpu_embedding.TPUEmbedding  # resolves through the package, registering the rule
    assert conversion.is_allowlisted(embedding_ops.embedding_activations)
    assert conversion.is_allowlisted(te.TPUEmbedding(_features(), emb_api.SGD(0.1)).dequeue)
    assert not conversion.is_allowlisted(_user_function)
    example_functions = [v for v in vars(ctr).values() if callable(v) and getattr(v, "__module__", "") == ctr.__name__]
    assert example_functions and not any(conversion.is_allowlisted(f) for f in example_functions)


def _features():
    table = emb_api.TableConfig(16, 4, name="t", optimizer=emb_api.Adagrad(0.1), combiner="mean")
    return {"f": emb_api.FeatureConfig(table=table, output_shape=[4])}


@pytest.mark.parametrize("front", ["mid_level", "v2"])
def test_a_traced_training_step_converts_only_the_users_code(monkeypatch, front):
    converted = []
    real = autograph_api._convert_actual

    def recording(entity, program_ctx):
        converted.append(f"{getattr(entity, '__module__', '?')}.{getattr(entity, '__qualname__', entity)}")
        return real(entity, program_ctx)

    monkeypatch.setattr(autograph_api, "_convert_actual", recording)
    ids = tf.constant([1, 2, 3, 15], tf.int64)
    if front == "v2":
        sc = emb_api.SparseCoreEmbeddingConfig(max_ids_per_chip_per_sample=64)
        emb = te.TPUEmbeddingV2(_features(), sparse_core_embedding_config=sc)

        def step():
            with tf.GradientTape() as tape:
                acts, batch = emb({"f": ids})
                tape.watch(acts)
                loss = tf.reduce_sum(acts["f"] ** 2)
            emb.apply_gradients(tape.gradient(loss, acts), batch)
            return acts["f"]
    else:
        emb = te.TPUEmbedding(_features(), emb_api.Adagrad(0.1))
        emb.build()

        def step():
            emb.enqueue({"f": ids}, training=True)
            acts = emb.dequeue()
            emb.apply_gradients({"f": tf.ones_like(acts["f"])})
            return acts["f"]

    before = next(iter(emb.embedding_tables.values())).numpy() if front == "mid_level" else None
    out = tf.function(step)()
    assert out.shape == [4, 4]
    ours = [c for c in converted if c.startswith("tf_embed_ops.")]
    assert not ours, f"AutoGraph converted our functions: {ours}"
    assert any(c.startswith(__name__) for c in converted), converted  # the user's step itself was converted
    if before is not None:
        assert not np.array_equal(before, next(iter(emb.embedding_tables.values())).numpy())  # the step trained
