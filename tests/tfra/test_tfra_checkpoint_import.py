"""A checkpoint written by real TFRA 0.8.1 restores bitwise after `python -m tf_embed_ops import-tfra`.

The fixture (`tests/fixtures/tfra/`: `ckpt.*`, a few KB, and `expected.npz`, the tables' keys, rows and Adam slots
as TFRA exported them) was written by `tests/fixtures/tfra/make_checkpoint.py` in a TFRA venv (TensorFlow 2.16.2,
tf_keras); the model is `fixture_model.py`, the same code here with `de = tf_embed_ops.tfra` and Keras 3. This test
needs no TFRA.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf

import tf_embed_ops.tfra as de
from tests.fixtures.tfra import fixture_model
from tf_embed_ops import __main__ as cli

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "tfra")
SRC = os.path.join(FIXTURE, "ckpt")


def _fingerprints(keys: np.ndarray) -> np.ndarray:
    return tf.bitcast(tf.fingerprint(tf.constant(keys), "farmhash64"), tf.int64).numpy()


def _restored(tmp_path):
    dst = str(tmp_path / "converted" / "ckpt")
    assert cli.main(["import-tfra", SRC, dst]) == 0
    model = fixture_model.TfraFixtureModel(de, keras)
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05))
    features, _ = fixture_model.batch(0)
    model(features, training=False)  # builds the dense layer; reads only
    optimizer.build(model.trainable_variables)
    status = tf.train.Checkpoint(model=model, optimizer=optimizer).restore(dst)
    status.assert_existing_objects_matched()
    return model, optimizer


def test_restores_tables_slots_and_dense_weights_bitwise(tmp_path):
    model, optimizer = _restored(tmp_path)
    expected = np.load(os.path.join(FIXTURE, "expected.npz"))
    for layer in (model.user, model.item):
        raw = expected[f"{layer.name}/keys"]
        keys = _fingerprints(raw) if raw.dtype.kind == "S" else raw
        order = np.argsort(keys)
        got = {k: v.numpy() for k, v in layer.params.table.export().items()}
        assert np.array_equal(got["keys"], keys[order])
        assert np.array_equal(got["weights"].view(np.uint32), expected[f"{layer.name}/values"][order].view(np.uint32))
        m, v = got["slots"][:, :4], got["slots"][:, 4:]
        assert np.array_equal(m.view(np.uint32), expected[f"{layer.name}/slot/m"][order].view(np.uint32))
        assert np.array_equal(v.view(np.uint32), expected[f"{layer.name}/slot/v"][order].view(np.uint32))
    assert np.array_equal(model.dense.kernel.numpy(), expected["dense/kernel"])
    assert np.array_equal(model.dense.bias.numpy(), expected["dense/bias"])
    assert int(optimizer.iterations.numpy()) == int(expected["iterations"])
    # The dense weights' Adam slots: Keras 2's _variables/k is Keras 3's k + 1.
    reader = tf.train.load_checkpoint(SRC)
    for k in range(5, 9):
        want = reader.get_tensor(f"optimizer/_variables/{k}/.ATTRIBUTES/VARIABLE_VALUE")
        assert np.array_equal(optimizer.variables[k + 1].numpy(), want)


def test_restored_model_trains_on(tmp_path):
    model, optimizer = _restored(tmp_path)
    features, labels = fixture_model.batch(3)
    before = model.user.params.table.export()["weights"].numpy()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(features) - labels))
    variables = model.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
    assert int(optimizer.iterations.numpy()) == 4
    assert not np.array_equal(before, model.user.params.table.export()["weights"].numpy())


def test_refuses_a_checkpoint_without_tfra_tables(tmp_path, capsys):
    plain = str(tmp_path / "plain" / "ckpt")
    tf.train.Checkpoint(v=tf.Variable(1.0)).write(plain)
    dst = str(tmp_path / "out" / "ckpt")
    assert cli.main(["import-tfra", plain, dst]) == 1
    assert "holds no TFRA de.Variable" in capsys.readouterr().err
    assert not os.path.exists(os.path.dirname(dst))  # nothing written


def _tfra_shaped_checkpoint(path: str, slot: str) -> None:
    """A checkpoint with TFRA's layout (`<owner>/tables_of_<name>/0/.ATTRIBUTES/table-keys|values`, slots under
    the optimizer), written with TensorFlow's MutableHashTable, which names its tensors as TFRA's tables do."""

    def table(keys, values):
        t = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, [0.0, 0.0])
        t.insert(tf.constant(keys, tf.int64), tf.constant(values, tf.float32))
        return t

    def node(**children):
        n = tf.Module()
        for name, child in children.items():
            setattr(n, name, child)
        return n

    def shards(t):
        n = tf.Module()
        setattr(n, "0", t)
        return n

    params = node()
    params.tables_of_t = shards(table([1, 2], [[1.0, 2.0], [3.0, 4.0]]))
    slot_name = f"t/DynamicEmbedding/t-shadow/{slot}"
    holder = node()
    setattr(holder, f"tables_of_{slot_name}", shards(table([1], [[0.5, 0.5]])))
    optimizer = node()
    setattr(optimizer, slot_name, holder)
    tf.train.Checkpoint(model=node(emb=node(params=params)), optimizer=optimizer).write(path)


def test_converts_a_hand_built_tfra_layout(tmp_path):
    src = str(tmp_path / "src" / "ckpt")
    _tfra_shaped_checkpoint(src, "accumulator")
    assert any("tables_of_t/0/.ATTRIBUTES/table-keys" in k for k, _ in tf.train.list_variables(src))
    dst = str(tmp_path / "dst" / "ckpt")
    assert cli.main(["import-tfra", src, dst, "--initial-accumulator-value", "0.25"]) == 0
    reader = tf.train.load_checkpoint(dst)
    np.testing.assert_array_equal(reader.get_tensor("model/emb/params/table/.ATTRIBUTES/keys"), [1, 2])
    # Key 2 has no slot row (never trained): the given initial accumulator.
    np.testing.assert_array_equal(
        reader.get_tensor("model/emb/params/table/.ATTRIBUTES/slots"), [[0.5, 0.5], [0.25, 0.25]]
    )


def test_refuses_unknown_optimizer_slots(tmp_path, capsys):
    src = str(tmp_path / "src" / "ckpt")
    _tfra_shaped_checkpoint(src, "momentum")  # SGD with momentum: no table optimizer
    dst = str(tmp_path / "dst" / "ckpt")
    assert cli.main(["import-tfra", src, dst]) == 1
    assert "optimizer slots ['momentum']" in capsys.readouterr().err
    assert not os.path.exists(os.path.dirname(dst))
