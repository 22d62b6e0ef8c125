"""Differences between the supported TensorFlow minors, held in tf_embed_ops/_tf_compat.py."""

from __future__ import annotations

import pytest
import tensorflow as tf

from tf_embed_ops import _tf_compat


def test_running_minor_is_parsed():
    assert _tf_compat.TENSORFLOW_MINOR == tuple(int(n) for n in tf.__version__.split(".")[:2])


def test_require_tensorflow_names_the_feature_and_the_minor_it_needs(monkeypatch):
    monkeypatch.setattr(_tf_compat, "TENSORFLOW_MINOR", (2, 16))
    with pytest.raises(_tf_compat.TensorFlowVersionError, match=r"^Frobnication needs TensorFlow 2\.17 or newer; "):
        _tf_compat.require_tensorflow((2, 17), "Frobnication")
    _tf_compat.require_tensorflow((2, 16), "Frobnication")


def test_table_config_dtype_on_2_16_is_float32_only(monkeypatch):
    monkeypatch.setattr(_tf_compat, "TENSORFLOW_MINOR", (2, 16))
    assert _tf_compat.table_config_dtype_kwargs(tf.float32) == {}
    with pytest.raises(_tf_compat.TensorFlowVersionError, match=r"TableConfig\(dtype=int32\) needs TensorFlow 2\.17"):
        _tf_compat.table_config_dtype_kwargs(tf.int32)
    monkeypatch.setattr(_tf_compat, "TENSORFLOW_MINOR", (2, 17))
    assert _tf_compat.table_config_dtype_kwargs(tf.int32) == {"dtype": tf.int32}


def test_every_table_config_has_a_dtype():
    table = tf.tpu.experimental.embedding.TableConfig(8, 2, name="t")
    assert table.dtype == tf.float32


def test_tensorflows_serving_class_has_its_variables_on_every_minor():
    emb = tf.tpu.experimental.embedding
    table = emb.TableConfig(8, 2, name="t")
    serving = emb.TPUEmbeddingForServing(emb.FeatureConfig(table=table), emb.Adagrad(0.1))
    assert serving.variables["t"]["parameters"] is serving.embedding_tables[table]
    assert sorted(serving.variables["t"]) == ["accumulators", "parameters"]


def test_sparse_core_stacking_is_refused_before_2_17(monkeypatch):
    monkeypatch.setattr(_tf_compat, "TENSORFLOW_MINOR", (2, 16))
    with pytest.raises(_tf_compat.TensorFlowVersionError, match=r"TPUEmbeddingV2 .* needs TensorFlow 2\.17"):
        _tf_compat.clone_feature_config({})
    with pytest.raises(_tf_compat.TensorFlowVersionError, match=r"needs TensorFlow 2\.17"):
        _tf_compat.stack_sparse_core_tables([], [], 1, 1, None)


def test_a_test_refused_by_the_running_minor_is_skipped_with_the_reason(tmp_path):
    """tests/conftest.py reports TensorFlowVersionError as a skip naming the minor needed; other errors still fail."""
    import os
    import shutil
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    shutil.copy(os.path.join(here, "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_minor.py").write_text(
        "from tf_embed_ops import _tf_compat\n"
        "def test_refused(monkeypatch):\n"
        "    monkeypatch.setattr(_tf_compat, 'TENSORFLOW_MINOR', (2, 16))\n"
        "    _tf_compat.require_tensorflow((2, 17), 'Frobnication')\n"
        "def test_other_error():\n"
        "    raise NotImplementedError('not a version refusal')\n"
        "def test_missing_api(monkeypatch):\n"
        "    monkeypatch.setattr(_tf_compat, 'TENSORFLOW_MINOR', (2, 16))\n"
        "    raise AttributeError(\"module 'x' has no attribute 'SparseCoreEmbeddingConfig'\")\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(here),
    )
    assert "Frobnication needs TensorFlow 2.17 or newer" in out.stdout, out.stdout
    assert "SparseCoreEmbeddingConfig needs TensorFlow 2.17 or newer" in out.stdout, out.stdout
    assert "1 failed, 2 skipped" in out.stdout, out.stdout


def test_a_missing_api_of_a_newer_minor_is_named_with_that_minor(monkeypatch):
    error = AttributeError(
        "module 'tensorflow._api.v2.tpu.experimental.embedding' has no attribute 'SparseCoreEmbeddingConfig'"
    )
    monkeypatch.setattr(_tf_compat, "TENSORFLOW_MINOR", (2, 16))
    assert _tf_compat.missing_api(error).startswith("SparseCoreEmbeddingConfig needs TensorFlow 2.17 or newer")
    assert _tf_compat.missing_api(AttributeError("no attribute 'something_else'")) is None
    assert _tf_compat.missing_api(ValueError("'SparseCoreEmbeddingConfig'")) is None
    monkeypatch.setattr(_tf_compat, "TENSORFLOW_MINOR", (2, 17))
    assert _tf_compat.missing_api(error) is None  # on a minor that has it, it is a real bug
