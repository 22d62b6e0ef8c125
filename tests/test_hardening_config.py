"""One parser decides: the kernels' `config` attr and `te.config.load` accept exactly the same bytes, including
crafted wire format that the C++ and Python protobuf runtimes used to read differently; text the UTF-8 codec
cannot encode is a config error, not a SystemError."""

from __future__ import annotations

import google.protobuf as protobuf
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import message as message_lib
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as cpb

import tf_embed_ops as te
from tf_embed_ops import embedding_ops as eo


def _base() -> bytes:
    c = cpb.TPUEmbeddingConfiguration()
    td = c.table_descriptor.add()
    td.name, td.vocabulary_size, td.dimension, td.num_features = "video", 5, 2, 1
    td.optimization_parameters.stochastic_gradient_descent.SetInParent()
    td.optimization_parameters.learning_rate.constant = 0.1
    c.batch_size_per_tensor_core = 2
    return c.SerializeToString()


def _python_accepts(data: bytes) -> bool:
    try:
        cpb.TPUEmbeddingConfiguration().ParseFromString(data)
    except message_lib.DecodeError:
        return False
    return True


def _load_accepts(data: bytes) -> bool:
    try:
        te.config.load(data)
    except te.config.ConfigError:
        return False
    return True


def _op_accepts(data: bytes) -> bool:
    table = tf.Variable(np.zeros([5, 2], np.float32))
    try:
        eo.embedding_activations([eo.normalize_feature(tf.constant([1, 2], tf.int64))], [table], data)
    except tf.errors.InvalidArgumentError:
        return False
    return True


# Field 100 (unknown to the message) as a varint, its tag written in several ways.
CRAFTED = {
    # Six tag bytes: C++ protobuf used to accept this and read the tag's low 32 bits; Python refuses it.
    "six_byte_tag": (bytes([0xA0, 0x86, 0x80, 0x80, 0x80, 0x00, 0x01]), False),
    # Five bytes whose value needs more than 32 bits: truncated by C++ to field 100, refused by Python.
    "tag_over_32_bits": (bytes([0xA0, 0x86, 0x80, 0x80, 0x10, 0x01]), False),
    # Over-long tag whose low 32 bits are table_descriptor (field 1, wire type 2): C++ used to read a second
    # table from it.
    "tag_truncating_onto_a_known_field": (bytes([0x8A, 0x80, 0x80, 0x80, 0x70, 0x00]), False),
    "field_number_zero": (bytes([0x00, 0x01]), False),
    "end_group_without_group": (bytes([0xA4, 0x06]), False),
    "wire_type_6": (bytes([0xA6, 0x06]), False),
    "eleven_byte_varint": (bytes([0xA0, 0x06]) + b"\xff" * 10 + b"\x01", False),
    # Accepted by both: a padded (non-minimal) five-byte tag, a ten-byte varint, an unknown group.
    "padded_five_byte_tag": (bytes([0xA0, 0x86, 0x80, 0x80, 0x00, 0x01]), True),
    "ten_byte_varint": (bytes([0xA0, 0x06]) + b"\xff" * 9 + b"\x01", True),
    "unknown_group": (bytes([0xA3, 0x06, 0x08, 0x01, 0xA4, 0x06]), True),
}

# Refused by the C++ runtime itself although Python's skips it: the library follows C++ (load and the op agree).
# (Python's parser skips it with protobuf 7, TensorFlow 2.21's; protobuf 4, TensorFlow 2.16's to 2.18's, refuses it
# too.)
CPP_STRICTER = {"field_number_zero_inside_an_unknown_group": bytes([0xA3, 0x06, 0x00, 0x00, 0xA4, 0x06])}
PYTHON_SKIPS_CPP_STRICTER = int(protobuf.__version__.split(".")[0]) >= 7


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_load_python_protobuf_and_the_op_agree_on_crafted_bytes(name):
    suffix, accepted = CRAFTED[name]
    data = _base() + suffix
    assert _python_accepts(data) is accepted
    assert _load_accepts(data) is accepted
    assert _op_accepts(data) is accepted


@pytest.mark.parametrize("name", sorted(CPP_STRICTER))
def test_where_cpp_is_stricter_load_and_the_op_follow_it(name):
    data = _base() + CPP_STRICTER[name]
    if PYTHON_SKIPS_CPP_STRICTER:
        assert _python_accepts(data)
    assert not _load_accepts(data)
    assert not _op_accepts(data)


def test_over_long_tag_error_names_the_byte_offset():
    data = _base() + CRAFTED["six_byte_tag"][0]
    with pytest.raises(te.config.InvalidConfigError, match=rf"could not parse {len(data)} bytes .*: varint at byte"):
        te.config.load(data)
    table = tf.Variable(np.zeros([5, 2], np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"varint at byte \d+ is longer than 5 bytes"):
        eo.embedding_activations([eo.normalize_feature(tf.constant([1, 2], tf.int64))], [table], data)


def test_load_view_is_the_message_the_kernels_parsed():
    """Accepted bytes with an unknown field: the Python view keeps it, exactly as the C++ message holds it."""
    data = _base() + CRAFTED["padded_five_byte_tag"][0]
    cfg = te.config.load(data)
    assert [t.name for t in cfg.tables] == ["video"]


@pytest.mark.parametrize("text", ["table_descriptor { name: '\ud800' }", "\udfff", "# comment \ud83d\n"])
def test_parse_text_with_a_lone_surrogate_is_a_config_error(text):
    with pytest.raises(te.config.InvalidConfigError, match=r"cannot be encoded as UTF-8"):
        te.config.parse_text(text)


def test_text_file_with_a_lone_surrogate_escape_is_a_config_error(tmp_path):
    path = tmp_path / "c.pbtxt"
    path.write_bytes(b"table_descriptor { name: '\xed\xa0\x80' }")  # a surrogate encoded in "UTF-8"
    with pytest.raises(te.config.InvalidConfigError, match="not UTF-8"):
        te.config.load(str(path))


@pytest.mark.parametrize(
    "text",
    [
        "table_descriptor { dimension: 9223372036854775807 }",
        "table_descriptor { vocabulary_size: 99999999999999999999 }",
        "num_hosts: -2147483649",
    ],
)
def test_parse_text_with_an_out_of_range_number_is_a_config_error(text):
    """The protobuf runtime reports these as a bare ValueError, outside its ParseError (found by the fuzzer)."""
    with pytest.raises(te.config.InvalidConfigError, match="not a valid text-format"):
        te.config.parse_text(text)
