"""load(): any form of a TPUEmbeddingConfiguration -> a validated EmbeddingConfig, validation done in C++."""

from __future__ import annotations

import os
from typing import Union

from google.protobuf import message as message_lib
from google.protobuf import text_format

from tf_embed_ops import _loader
from tf_embed_ops.config._errors import ConfigError, InvalidConfigError, UnimplementedConfigError
from tf_embed_ops.config._view import EmbeddingConfig, TPUEmbeddingConfiguration

ConfigSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", message_lib.Message, EmbeddingConfig]

TEXT_SUFFIXES = (".pbtxt", ".textproto", ".prototxt", ".txtpb", ".txt")
BINARY_SUFFIXES = (".pb", ".binarypb", ".binpb", ".bin")
_FULL_NAME = TPUEmbeddingConfiguration.DESCRIPTOR.full_name


def validate_serialized(serialized: bytes) -> dict:
    """Runs the C++ parser/validator on wire-format bytes; returns its model as a dict.

    The C++ parser is the one that decides (the kernels run it on their ``config`` attr); its ``"serialized"``
    entry holds the message as C++ parsed it, re-serialized.

    Raises:
      InvalidConfigError: corrupt bytes or a rule violated (the C++ message, unchanged).
      UnimplementedConfigError: an optimizer tf_embed_ops does not run.
    """
    module = _loader.load_config_module()
    try:
        return module.parse(serialized)
    except module.UnimplementedError as e:
        raise UnimplementedConfigError(str(e)) from None
    except module.InvalidArgumentError as e:
        raise InvalidConfigError(str(e)) from None


def parse_text(text: str, origin: str = "config text") -> TPUEmbeddingConfiguration:
    """Text format -> message; a syntax or type error becomes InvalidConfigError naming ``origin`` and the line."""
    if not isinstance(text, str):
        raise ValueError(f"text: expected a str, got {type(text).__name__}")
    try:
        # Text the UTF-8 codec cannot encode (a lone surrogate) would otherwise fail deep in the protobuf
        # runtime (SystemError from upb); refuse it here, with its position.
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidConfigError(
            f"{origin}: not a valid text-format {_FULL_NAME}: character {text[e.start]!r} at offset {e.start} "
            f"cannot be encoded as UTF-8 ({e.reason})"
        ) from None
    proto = TPUEmbeddingConfiguration()
    try:
        text_format.Parse(text, proto)
    except (text_format.ParseError, ValueError) as e:
        # ValueError: a number out of its field's range is reported by the protobuf runtime itself, outside
        # ParseError (found by tests/fuzz).
        raise InvalidConfigError(f"{origin}: not a valid text-format {_FULL_NAME}: {e}") from None
    return proto


def _read_path(path: str) -> bytes:
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in BINARY_SUFFIXES + TEXT_SUFFIXES:
        raise ValueError(
            f"source: cannot tell the format of {path!r} from its suffix {suffix!r}; use one of "
            f"{', '.join(BINARY_SUFFIXES)} (binary) or {', '.join(TEXT_SUFFIXES)} (text format)"
        )
    with open(path, "rb") as f:
        data = f.read()
    if suffix in BINARY_SUFFIXES:
        return data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidConfigError(f"{path}: text-format config is not UTF-8 ({e})") from None
    return parse_text(text, origin=path).SerializeToString()


def _serialized(source: ConfigSource) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        return _read_path(os.fspath(source))
    if isinstance(source, message_lib.Message):
        if source.DESCRIPTOR.full_name != _FULL_NAME:
            raise ValueError(f"source: expected a {_FULL_NAME} message, got {source.DESCRIPTOR.full_name}")
        return source.SerializeToString()
    raise ValueError(
        f"source: expected serialized bytes, a .pb/.pbtxt path, a {_FULL_NAME} message or an EmbeddingConfig; "
        f"got {type(source).__name__}"
    )


def load(source: ConfigSource) -> EmbeddingConfig:
    """Loads and validates a TPUEmbeddingConfiguration.

    The rules (docs/config.md) are checked once, in C++, by the same code the kernels use, so a config that
    loads here is accepted by every op, with the same error messages otherwise.

    Args:
      source: wire-format ``bytes``; a path (``str``/``PathLike``) to a binary (``.pb``) or text-format
        (``.pbtxt``, ``.textproto``, ``.txt``) file; a ``TPUEmbeddingConfiguration`` message; or an
        ``EmbeddingConfig`` (returned as is).

    Returns:
      The validated :class:`EmbeddingConfig` view.

    Raises:
      InvalidConfigError: corrupt bytes, a text-format error, or a violated rule; the message names the
        table/feature, the field and the value.  (A ``ValueError`` and a ``tf.errors.InvalidArgumentError``.)
      UnimplementedConfigError: a valid optimizer tf_embed_ops does not run (e.g. ``rms_prop``).
      ValueError: ``source`` is of an unsupported type or file suffix.
      OSError: the file cannot be read.

    Example:
      >>> cfg = tf_embed_ops.config.load(tf_embed_ops.config.example_config_path())
      >>> [t.name for t in cfg.tables]
    """
    if isinstance(source, EmbeddingConfig):
        return source
    serialized = _serialized(source)
    parsed = validate_serialized(serialized)
    # C++ decided; the Python message is built from C++'s own re-serialization of what it parsed, so the view
    # and the kernels always see the same message (and load accepts exactly what the ops accept).
    proto = TPUEmbeddingConfiguration()
    proto.ParseFromString(parsed.pop("serialized"))
    return EmbeddingConfig(proto, parsed)


__all__ = ["ConfigError", "ConfigSource", "load", "parse_text", "validate_serialized"]
