"""`import tf_embed_ops` alone registers the Keras classes, so `keras.models.load_model` finds them.

Whichever is imported first: Keras/TensorFlow before `tf_embed_ops` (registered at once) or after it (registered
when the outermost of their imports finishes; TensorFlow imports Keras and Keras imports TensorFlow). The slow tests
load a saved model in fresh interpreters that never name `tf_embed_ops.keras`; the fast one checks the watcher's
order logic on two stand-in packages that import each other.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import keras
import pytest
import tensorflow as tf

import tf_embed_ops
from tf_embed_ops import keras as te_keras

emb = tf.tpu.experimental.embedding
ROOT = str(pathlib.Path(__file__).resolve().parents[1])


def test_registration_waits_for_the_outermost_of_two_imports_that_import_each_other(tmp_path, monkeypatch):
    (tmp_path / "outer_pkg").mkdir()
    (tmp_path / "outer_pkg" / "__init__.py").write_text("import inner_pkg\nimport sys\nLOADED = sorted(sys.modules)\n")
    (tmp_path / "inner_pkg").mkdir()
    (tmp_path / "inner_pkg" / "__init__.py").write_text("import outer_pkg\n")  # a cycle, as keras <-> tensorflow
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []
    monkeypatch.setattr(tf_embed_ops, "_KERAS_PACKAGES", ("outer_pkg", "inner_pkg"))
    monkeypatch.setattr(
        tf_embed_ops,
        "_register_keras_serializables",
        lambda: calls.append(("outer_pkg" in sys.modules, hasattr(sys.modules["outer_pkg"], "LOADED"))),
    )
    watcher = tf_embed_ops._KerasImportWatcher()
    monkeypatch.setattr(sys, "meta_path", [watcher, *sys.meta_path])
    for name in ("outer_pkg", "inner_pkg"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import outer_pkg  # noqa: F401

    # Once, after the outer package had run to its end (not when the inner one, imported by it, finished).
    assert calls == [(True, True)]
    assert watcher not in sys.meta_path  # nothing left to watch


def _saved_model(tmp_path) -> str:
    table = emb.TableConfig(20, 3, name="t", combiner="sum")
    layer = te_keras.TPUEmbedding({"f": emb.FeatureConfig(table)}, emb.Adagrad(0.1), name="emb")
    inputs = {"f": keras.Input(shape=(), dtype="int64", name="f")}
    model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)["f"]))
    path = str(tmp_path / "m.keras")
    model.save(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "imports",
    [
        "import tf_embed_ops\nimport keras\nload = keras.models.load_model",
        "import tf_embed_ops\nimport tensorflow as tf\nload = tf.keras.models.load_model",
        "import keras\nimport tf_embed_ops\nload = keras.models.load_model",
        # A module of the package first: it imports TensorFlow half way through its own import, so the classes
        # register only once that import has ended (registering at once imported tf_embed_ops.config half made).
        "import tf_embed_ops.config\nimport keras\nload = keras.models.load_model",
        "from tf_embed_ops import _tf_compat\nimport keras\nload = keras.models.load_model",
    ],
)
def test_load_model_after_import_tf_embed_ops_alone(tmp_path, imports):
    path = _saved_model(tmp_path)
    code = textwrap.dedent(
        f"""
        import sys
        {imports.replace(chr(10), chr(10) + "        ")}
        model = load(sys.argv[1])
        layer = model.get_layer("emb")
        print(type(layer).__module__, type(layer).__name__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code, path],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
        env={**os.environ, "PYTHONPATH": ROOT},  # this checkout's package
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["tf_embed_ops.keras.layer", "TPUEmbedding"]
