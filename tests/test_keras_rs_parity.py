"""Against keras-rs 0.4.0 itself: a DLRM ranking model written as keras-rs documents it trains after one import
changes; forward outputs equal keras-rs's own layer (dense, ragged, sparse, weighted); keras-rs's config
objects drive our layer, round-trip through save/load, and the ones we cannot honour are rejected."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import keras_rs_test_util as util
from tf_embed_ops import keras as te_keras

keras_rs = pytest.importorskip("keras_rs")


def _keras_rs_configs(optimizers=None):
    return util.configs(keras_rs.layers.TableConfig, keras_rs.layers.FeatureConfig, optimizers)


def test_forward_equals_keras_rs_layer_for_the_same_weights_and_inputs():
    configs = _keras_rs_configs()
    theirs = keras_rs.layers.DistributedEmbedding(configs)
    ours = te_keras.DistributedEmbedding(configs)
    x, w, _ = util.inputs(seed=11, overlong=False)  # keras-rs does not truncate off SparseCore
    expected = theirs(x, w)
    for table, values in theirs.get_embedding_tables().items():
        next(v for t, v in ours.embedding_tables.items() if t.name == table).assign(values)
    got = ours(x, w)
    for name in util.FEATURES:
        np.testing.assert_allclose(got[name].numpy(), expected[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    # Without weights too (dense bags and sparse rows then count every id once).
    expected, got = theirs(x), ours(x)
    for name in util.FEATURES:
        np.testing.assert_allclose(got[name].numpy(), expected[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_one_fit_step_with_keras_rs_configs_follows_the_table_optimizers():
    util.check_one_fit_step(te_keras.DistributedEmbedding(_keras_rs_configs(), name="embedding"))


# ------------------------------------------------------------------------- DLRM, as keras-rs documents it

DENSE, SPARSE, VOCAB, DIM, BATCH = 4, ("c1", "c2", "c3"), 40, 8, 32


def _dlrm(distributed_embedding):
    """DLRM ranking with keras-rs: tables in TableConfig/FeatureConfig, DistributedEmbedding, DotInteraction."""
    feature_configs = {}
    for name in SPARSE:
        table = keras_rs.layers.TableConfig(
            name=f"{name}_table",
            vocabulary_size=VOCAB,
            embedding_dim=DIM,
            initializer=keras.initializers.TruncatedNormal(stddev=0.1, seed=len(name) + ord(name[-1])),
            optimizer=keras.optimizers.Adagrad(learning_rate=0.5),
            combiner="mean",
        )
        feature_configs[name] = keras_rs.layers.FeatureConfig(
            name=name, table=table, input_shape=(BATCH,), output_shape=(BATCH, DIM)
        )
    embedding_layer = distributed_embedding(feature_configs, name="embedding")

    dense_input = keras.Input(shape=(DENSE,), name="dense_features", dtype="float32")
    sparse_inputs = {name: keras.Input(shape=(), name=name, dtype="int64") for name in SPARSE}
    dense_out = keras.layers.Dense(16, activation="relu")(dense_input)
    dense_out = keras.layers.Dense(DIM, activation="relu")(dense_out)
    embeddings = embedding_layer(sparse_inputs)
    interaction = keras_rs.layers.DotInteraction()([dense_out] + [embeddings[n] for n in SPARSE])
    top = keras.layers.Concatenate()([dense_out, interaction])
    top = keras.layers.Dense(16, activation="relu")(top)
    output = keras.layers.Dense(1, activation="sigmoid")(top)
    model = keras.Model(inputs={"dense_features": dense_input, **sparse_inputs}, outputs=output)
    model.compile(
        loss=keras.losses.BinaryCrossentropy(),
        optimizer=keras.optimizers.Adam(learning_rate=0.01),
        metrics=[keras.metrics.BinaryAccuracy()],
    )
    return model, embedding_layer


def _dlrm_data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    x = {"dense_features": rng.normal(size=(n, DENSE)).astype(np.float32)}
    score = 0.5 * x["dense_features"][:, 0]
    for i, name in enumerate(SPARSE):
        ids = rng.integers(VOCAB - 2, size=n)
        x[name] = ids.astype(np.int64)
        score += np.where(ids % (i + 2) == 0, 1.0, -1.0)
    y = (score > 0).astype(np.float32).reshape(n, 1)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)


@pytest.mark.slow  # a whole DLRM fit (several seconds)
def test_dlrm_written_for_keras_rs_trains_after_one_import_change():
    keras.utils.set_random_seed(0)
    from tf_embed_ops.keras import DistributedEmbedding  # the one changed import (was keras_rs.layers)

    model, layer = _dlrm(DistributedEmbedding)
    before = {name: v.numpy().copy() for name, v in layer.get_embedding_tables().items()}
    data = _dlrm_data()
    hist = model.fit(data, epochs=10, verbose=0)
    losses = hist.history["loss"]
    assert losses[-1] < 0.6 * losses[0], losses
    after = layer.get_embedding_tables()
    for name, values in before.items():
        moved = np.any(after[name].numpy() != values, axis=1)
        assert moved[: VOCAB - 2].all() and not moved[VOCAB - 2 :].any(), name  # only looked-up rows move
    table_size = VOCAB * DIM
    assert all(int(np.prod(v.shape)) < table_size for v in model.optimizer.variables)
    # Each table's Adagrad accumulator (its own optimizer state) grew where the rows were looked up.
    for table, slots in layer.slot_variables.items():
        acc = slots["accumulators"].numpy()
        assert (acc[: VOCAB - 2] > 0.1).all() and np.all(acc[VOCAB - 2 :] == 0.1), table.name

    # The same model code with keras-rs's own layer: on CPU its tables are trained by the model's Adam.
    theirs, _ = _dlrm(keras_rs.layers.DistributedEmbedding)
    theirs.fit(data.take(1), epochs=1, verbose=0)
    assert any(int(np.prod(v.shape)) == table_size for v in theirs.optimizer.variables)


def test_keras_rs_configs_and_weights_round_trip_through_save_and_load(tmp_path):
    model, layer = _dlrm(te_keras.DistributedEmbedding)
    data = _dlrm_data(64)
    model.fit(data, epochs=1, verbose=0)
    path = str(tmp_path / "dlrm.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    new_layer = loaded.get_layer("embedding")
    assert isinstance(new_layer, te_keras.DistributedEmbedding)
    for name, feature in new_layer._feature_configs.items():
        assert isinstance(feature, keras_rs.layers.FeatureConfig)
        assert isinstance(feature.table, keras_rs.layers.TableConfig)
        assert isinstance(feature.table.optimizer, keras.optimizers.Adagrad)
        assert feature.table.name == f"{name}_table" and tuple(feature.output_shape) == (BATCH, DIM)
    for name, values in layer.get_embedding_tables().items():
        np.testing.assert_array_equal(new_layer.get_embedding_tables()[name].numpy(), values.numpy())
    x = next(iter(data))[0]
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)


def test_keras_rs_configs_we_cannot_honour_are_rejected_by_name():
    table = keras_rs.layers.TableConfig(name="t", vocabulary_size=10, embedding_dim=4, placement="sparsecore")
    feature = keras_rs.layers.FeatureConfig(name="f", table=table, input_shape=(8,), output_shape=(8, 4))
    with pytest.raises(ValueError, match=r"Table 't': placement 'sparsecore' asks for SparseCore"):
        te_keras.DistributedEmbedding({"f": feature})
    table = keras_rs.layers.TableConfig(name="t", vocabulary_size=10, embedding_dim=4)
    feature = keras_rs.layers.FeatureConfig(name="f", table=table, input_shape=(8, 2, 3), output_shape=(8, 4))
    with pytest.raises(ValueError, match=r"Feature 'f': input_shape \(8, 2, 3\) must be"):
        te_keras.DistributedEmbedding({"f": feature})
    table = keras_rs.layers.TableConfig(
        name="t", vocabulary_size=10, embedding_dim=4, optimizer=keras.optimizers.SGD(momentum=0.9)
    )
    feature = keras_rs.layers.FeatureConfig(name="f", table=table, input_shape=(8,), output_shape=(8, 4))
    with pytest.raises(ValueError, match=r"Table 't': option SGD.momentum=0.9"):
        te_keras.DistributedEmbedding({"f": feature})
