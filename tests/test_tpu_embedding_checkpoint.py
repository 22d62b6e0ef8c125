"""Checkpoints: TensorFlow's key layout, round trips, and bit-exact cross-restores with TPUEmbeddingForServing."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_embed_ops

emb_api = tf.tpu.experimental.embedding


def _feature_config():
    """Fresh config objects (TPUEmbedding writes optimizers/names into them, so never share across objects)."""
    video = emb_api.TableConfig(10, 4, name="video", optimizer=emb_api.Adam(0.1), combiner="sum")
    user = emb_api.TableConfig(8, 2, name="user", combiner="sum")
    am = emb_api.TableConfig(6, 3, name="am", optimizer=emb_api.AdagradMomentum(0.1, momentum=0.5), combiner="sum")
    plain = emb_api.TableConfig(5, 2, name="plain", optimizer=emb_api.SGD(0.1), combiner="sum")
    fc = {
        "watched": emb_api.FeatureConfig(table=video),
        "liked": emb_api.FeatureConfig(table=video),
        "user": emb_api.FeatureConfig(table=user),
        "am": emb_api.FeatureConfig(table=am),
        "plain": emb_api.FeatureConfig(table=plain),
    }
    return fc, emb_api.FTRL(0.1)


EXPECTED_KEYS = {
    "embedding/video/.ATTRIBUTES/VARIABLE_VALUE",
    "embedding/video.Smomenta/.ATTRIBUTES/VARIABLE_VALUE",
    "embedding/video.Svelocities/.ATTRIBUTES/VARIABLE_VALUE",
    "embedding/user/.ATTRIBUTES/VARIABLE_VALUE",
    "embedding/user.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE",
    "embedding/user.Slinears/.ATTRIBUTES/VARIABLE_VALUE",
    "embedding/am/.ATTRIBUTES/VARIABLE_VALUE",
    "embedding/am.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE",
    "embedding/am.Smomenta/.ATTRIBUTES/VARIABLE_VALUE",
    "embedding/plain/.ATTRIBUTES/VARIABLE_VALUE",
}


def _keys(path):
    return {name for name, _ in tf.train.list_variables(path)} - {"_CHECKPOINTABLE_OBJECT_GRAPH"}


def _train_one_step(emb):
    features = {k: tf.constant([1, 2, 2], tf.int64) for k in ("watched", "liked", "user", "am", "plain")}
    emb.enqueue(features)
    acts = emb.dequeue()
    emb.apply_gradients({k: tf.fill(tf.shape(v), 0.5) for k, v in acts.items()})


def _all_values(obj):
    return {
        f"{table}/{slot}": var.numpy().copy() for table, slots in obj.variables.items() for slot, var in slots.items()
    }


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k  # bit-exact


def test_checkpoint_keys_are_tensorflows(tmp_path):
    ours = tf_embed_ops.TPUEmbedding(*_feature_config())
    ours.build()
    theirs = emb_api.TPUEmbeddingForServing(*_feature_config())
    theirs.build()
    ours_path = tf.train.Checkpoint(embedding=ours).write(str(tmp_path / "ours"))
    theirs_path = tf.train.Checkpoint(embedding=theirs).write(str(tmp_path / "theirs"))
    assert _keys(ours_path) == EXPECTED_KEYS
    assert _keys(theirs_path) == EXPECTED_KEYS


@pytest.mark.parametrize("restore_before_build", [True, False])
def test_round_trip(tmp_path, restore_before_build):
    emb = tf_embed_ops.TPUEmbedding(*_feature_config())
    _train_one_step(emb)
    saved = _all_values(emb)
    path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path / "ck"))

    fresh = tf_embed_ops.TPUEmbedding(*_feature_config())
    if not restore_before_build:
        fresh.build()
    status = tf.train.Checkpoint(embedding=fresh).restore(path)
    fresh.build()  # with a pending restore, variables take the checkpoint values at creation
    status.assert_existing_objects_matched()
    _assert_same(saved, _all_values(fresh))


def test_ours_restores_into_tensorflows_serving_class(tmp_path):
    emb = tf_embed_ops.TPUEmbedding(*_feature_config())
    _train_one_step(emb)
    path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path / "ck"))
    serving = emb_api.TPUEmbeddingForServing(*_feature_config())
    tf.train.Checkpoint(embedding=serving).restore(path).assert_existing_objects_matched()
    _assert_same(_all_values(emb), _all_values(serving))
    # ... and looks up the same rows.
    ids = {k: tf.constant([1, 2], tf.int64) for k in ("watched", "liked", "user", "am", "plain")}
    ours, theirs = emb(ids), serving(ids)
    for k in ids:
        assert np.array_equal(ours[k].numpy(), theirs[k].numpy()), k


def test_tensorflows_serving_class_restores_into_ours(tmp_path):
    serving = emb_api.TPUEmbeddingForServing(*_feature_config())
    serving.build()
    rng = np.random.default_rng(0)
    for slots in serving.variables.values():
        for var in slots.values():
            var.assign(rng.normal(size=var.shape).astype(np.float32))
    path = tf.train.Checkpoint(embedding=serving).save(str(tmp_path / "ck"))
    emb = tf_embed_ops.TPUEmbedding(*_feature_config())
    tf.train.Checkpoint(embedding=emb).restore(path).assert_existing_objects_matched()
    _assert_same(_all_values(serving), _all_values(emb))
