"""Differences between the supported TensorFlow minors, held in tf_embed_ops/_tf_compat.py."""

from __future__ import annotations

import numpy as np
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


def test_table_config_dtype_before_2_20_is_float32_only(monkeypatch):
    monkeypatch.setattr(_tf_compat, "TENSORFLOW_MINOR", (2, 19))
    assert _tf_compat.table_config_dtype_kwargs(tf.float32) == {}
    with pytest.raises(_tf_compat.TensorFlowVersionError, match=r"TableConfig\(dtype=int32\) needs TensorFlow 2\.20"):
        _tf_compat.table_config_dtype_kwargs(tf.int32)
    monkeypatch.setattr(_tf_compat, "TENSORFLOW_MINOR", (2, 20))
    assert _tf_compat.table_config_dtype_kwargs(tf.int32) == {"dtype": tf.int32}


def test_table_config_dtype_keyword_is_what_the_running_tensorflow_takes():
    """Whatever the minor, the keyword table_config_dtype_kwargs gives is one TensorFlow's TableConfig accepts."""
    table = tf.tpu.experimental.embedding.TableConfig(
        8, 2, name="t", **_tf_compat.table_config_dtype_kwargs(tf.float32)
    )
    assert table.dtype == tf.float32


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
    module = ImportError(
        "cannot import name 'tpu_embedding_v3_checkpoint_adapter' from 'tensorflow.python.tpu' (/x/tpu/__init__.py)"
    )
    assert _tf_compat.missing_api(module).startswith(
        "tpu_embedding_v3_checkpoint_adapter needs TensorFlow 2.17 or newer"
    )
    assert _tf_compat.missing_api(ImportError("cannot import name 'tpu_embedding_v9'")) is None
    field = AttributeError("frequency_aware_adagrad")  # protobuf's, for a field the message does not have
    assert _tf_compat.missing_api(field).startswith("frequency_aware_adagrad needs TensorFlow 2.19 or newer")
    assert _tf_compat.missing_api(AttributeError("frequency_aware_adagrad_v2")) is None
    monkeypatch.setattr(_tf_compat, "TENSORFLOW_MINOR", (2, 17))
    assert _tf_compat.missing_api(error) is None  # on a minor that has it, it is a real bug
    assert _tf_compat.missing_api(module) is None
    monkeypatch.setattr(_tf_compat, "TENSORFLOW_MINOR", (2, 19))
    assert _tf_compat.missing_api(field) is None


@pytest.mark.parametrize("value", [0.0, -3.5, np.inf, -np.inf, np.nan], ids=["zero", "finite", "inf", "-inf", "nan"])
def test_zero_depending_on_is_an_exact_zero_for_every_value(value):
    for fn in (_tf_compat.zero_depending_on, tf.function(_tf_compat.zero_depending_on)):
        out = fn(tf.constant([value, 1.0], tf.float32))
        assert out.dtype == tf.float32
        np.testing.assert_array_equal(out.numpy(), [0.0, 0.0])
        assert not np.signbit(out.numpy()).any()


def test_a_restore_calls_the_checkpoint_adapter_hook_first_on_every_minor(tmp_path):
    """`_checkpoint_adapter(path)` (TensorFlow 2.17's hook, added to 2.16's restore by _tf_compat) runs before any
    child is restored, so a refusal there leaves every variable as it was."""

    class Guarded(tf.Module):
        def __init__(self, refuse):
            super().__init__()
            self.refuse, self.seen = refuse, []
            self.a, self.b = tf.Variable(1.0), tf.Variable(2.0)

        def _checkpoint_adapter(self, path):
            self.seen.append((path, self.a.numpy(), self.b.numpy()))
            if self.refuse:
                raise ValueError("refused")
            return None

    source = Guarded(refuse=False)
    source.a.assign(10.0)
    source.b.assign(20.0)
    path = tf.train.Checkpoint(m=source).write(str(tmp_path / "ckpt"))
    target = Guarded(refuse=True)
    with pytest.raises(ValueError, match="refused"):
        tf.train.Checkpoint(m=target).read(path)
    assert (target.a.numpy(), target.b.numpy()) == (1.0, 2.0)
    assert [(p, a, b) for p, a, b in target.seen] == [(path, 1.0, 2.0)]
    accepted = Guarded(refuse=False)
    tf.train.Checkpoint(m=accepted).read(path).assert_consumed()
    assert (accepted.a.numpy(), accepted.b.numpy()) == (10.0, 20.0) and len(accepted.seen) == 1


def test_require_reference_names_the_reference_and_the_minor_it_needs(monkeypatch):
    name = "TensorFlow's TPUEmbeddingForServing lookup of a subset of the features"
    monkeypatch.setattr(_tf_compat, "TENSORFLOW_MINOR", (2, 20))
    with pytest.raises(_tf_compat.TensorFlowVersionError, match=rf"^{name} needs TensorFlow 2\.21 or newer"):
        _tf_compat.require_reference(name)
    monkeypatch.setattr(_tf_compat, "TENSORFLOW_MINOR", (2, 21))
    _tf_compat.require_reference(name)
