"""Config fuzzer: mutated wire-format bytes and text of TPUEmbeddingConfiguration.

Checks per input:
- bytes the C++ parser (what the kernels run on their ``config`` attr) accepts as wire format, Python's protobuf
  accepts too, and both read the same message from them (C++ is stricter in a few places: counted, as the
  library follows C++);
- ``te.config.load`` raises nothing but ConfigError, and accepts exactly what the C++ validator accepts;
- ``te.config.parse_text`` raises nothing but InvalidConfigError;
- every so often, the op itself takes the config attr and agrees with ``load``.
"""

from __future__ import annotations

import random
import time

import numpy as np
import tensorflow as tf
from google.protobuf import message as message_lib
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as cpb

import tf_embed_ops as te
from tf_embed_ops import _loader
from tf_embed_ops import embedding_ops as eo

from ._harness import Budget, Report, Watchdog

_OPTIMIZERS = ["stochastic_gradient_descent", "adagrad", "adam", "ftrl", "adagrad_momentum", "momentum", "lion"]


def _random_valid_config(rng: random.Random) -> cpb.TPUEmbeddingConfiguration:
    c = cpb.TPUEmbeddingConfiguration()
    c.mode = rng.choice([1, 2])
    num_tables = rng.randint(1, 3)
    tags = 0
    for t in range(num_tables):
        td = c.table_descriptor.add()
        td.name = f"t{t}" if rng.random() < 0.9 else "tåble\u00e9"
        td.vocabulary_size = rng.choice([1, 2, 10, 1000, 2**31 - 1])
        td.dimension = rng.choice([1, 4, 16])
        p = td.optimization_parameters
        getattr(p, rng.choice(_OPTIMIZERS)).SetInParent()
        if rng.random() < 0.3:
            p.learning_rate.dynamic.tag = tags
            tags += 1
        else:
            p.learning_rate.constant = rng.choice([0.0, 0.01, 1.0])
        if rng.random() < 0.3:
            p.clipping_limits.lower.value = -1.0
            p.gradient_clipping_limits.upper.value = 2.0
        if rng.random() < 0.2:
            p.weight_decay_factor = 0.1
    for f in range(rng.randint(num_tables, num_tables + 2)):
        fd = c.feature_descriptor.add()
        fd.name = f"f{f}"
        fd.table_id = f % num_tables
        fd.input_shape.extend(rng.choice([[], [4], [2, 3]]))
    return c


def _seeds(rng: random.Random) -> list[bytes]:
    seeds = [_random_valid_config(rng).SerializeToString() for _ in range(40)]
    with open(te.config.example_config_path(), encoding="utf-8") as f:
        seeds.append(te.config.parse_text(f.read()).SerializeToString())
    return seeds


def _varint(value: int, pad: int = 0) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value or pad > 0:
            out.append(byte | 0x80)
            if not value:
                pad -= 1
        else:
            out.append(byte)
            return bytes(out)


# Wire-format fragments the two runtimes have been known to read differently, or that stress the walker.
def _crafted(rng: random.Random) -> bytes:
    number = rng.choice([1, 2, 3, 5, 100, 536870911, rng.randint(1, 2**29 - 1)])
    wire = rng.choice([0, 1, 2, 3, 4, 5, 6, 7])
    tag = (number << 3) | wire
    kind = rng.randrange(6)
    if kind == 0:
        return _varint(tag, pad=rng.randint(0, 6))  # padded / over-long tag
    if kind == 1:
        return _varint(tag | (rng.randint(1, 2**35) << 32))  # tag beyond 32 bits
    if kind == 2:
        return _varint(tag) + _varint(rng.randint(0, 2**64 - 1), pad=rng.randint(0, 2))
    if kind == 3:
        body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 8)))
        return _varint((number << 3) | 2) + _varint(len(body) + rng.choice([0, 0, 1, -1, 2**40]) & (2**64 - 1)) + body
    if kind == 4:
        depth = rng.randint(1, 120)
        return _varint((number << 3) | 3) * depth + _varint((number << 3) | 4) * rng.randint(0, depth + 1)
    return _varint(tag)


def _mutate(data: bytes, rng: random.Random, seeds: list[bytes]) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        pos = rng.randint(0, len(b))
        if op == 0 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        elif op == 2 and b:
            del b[pos : pos + rng.randint(1, 8)]
        elif op == 3:
            b[pos:pos] = _crafted(rng)
        elif op == 4 and b:
            i = rng.randrange(len(b))
            b[i] = rng.choice([0x00, 0x7F, 0x80, 0xFF, 0x08, 0x0A, 0x12])
        elif op == 5:
            other = rng.choice(seeds)
            i = rng.randint(0, len(other))
            b[pos:pos] = other[i : i + rng.randint(1, 32)]
        elif op == 6:
            b = b[: rng.randint(0, len(b))]
        else:
            b = b + _crafted(rng)
    return bytes(b)


def _python_parse(data: bytes):
    proto = cpb.TPUEmbeddingConfiguration()
    try:
        proto.ParseFromString(data)
    except message_lib.DecodeError:
        return None
    return proto


def _check_bytes(data: bytes, module, report: Report, check_op: bool) -> None:
    wire_ok_cc = True
    try:
        parsed = module.parse(data)
    except module.InvalidArgumentError as e:
        parsed = None
        wire_ok_cc = not str(e).startswith("config: could not parse")
    except module.UnimplementedError:
        parsed = None
    proto = _python_parse(data)
    if wire_ok_cc and proto is None:
        # The dangerous direction (the original bug): bytes the kernels accept that Python's protobuf refuses.
        report.fail("wire-format disagreement: C++ parses bytes Python's protobuf refuses", data)
    elif proto is not None and not wire_ok_cc:
        # C++'s own parser is stricter in a few places (e.g. a field number 0 inside an unknown group); the
        # library follows C++ everywhere (load and the ops both refuse), so this is counted, not a failure.
        report.bump("python_only_wire")
    if parsed is not None and proto is not None:
        ours = cpb.TPUEmbeddingConfiguration()
        ours.ParseFromString(parsed["serialized"])
        # Unknown fields are compared out: Python keeps their bytes as written (a padded varint stays padded),
        # C++ re-encodes their values; neither runtime gives them a meaning.
        ours.DiscardUnknownFields()
        proto.DiscardUnknownFields()
        if ours.SerializeToString(deterministic=True) != proto.SerializeToString(deterministic=True):
            report.fail("C++ and Python read different messages from the same bytes", data)
    try:
        te.config.load(data)
        loaded = True
    except te.config.ConfigError:
        loaded = False
    except Exception as e:
        report.fail(f"load raised {type(e).__name__}: {e}", data)
        return
    if loaded != (parsed is not None):
        report.fail(f"load accepted={loaded} but the C++ validator accepted={parsed is not None}", data)
    report.accepted += loaded
    report.rejected += not loaded
    if check_op and loaded == (parsed is not None):
        report.bump("op_checks")
        _check_op_agrees(data, loaded, report)


def _check_op_agrees(data: bytes, loaded: bool, report: Report) -> None:
    shape = [1, 1]
    if loaded:
        cfg = te.config.load(data)
        if len(cfg.features) != 1 or len(cfg.tables) != 1 or cfg.tables[0].vocabulary_size > 4096:
            return  # the probe below has one feature, one table, and allocates the table
        shape = [cfg.tables[0].vocabulary_size, cfg.tables[0].dimension]
    table = tf.Variable(np.zeros(shape, np.float32))
    try:
        eo.embedding_activations([eo.normalize_feature(tf.constant([0], tf.int64))], [table], data)
        op_ok = True
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
        op_ok = False
    if op_ok != loaded:
        report.fail(f"the op accepted={op_ok} but load accepted={loaded}", data)


_TEXT_PIECES = [
    "table_descriptor {",
    "}",
    "name: 'x'",
    "vocabulary_size: 10",
    "dimension: 4",
    "feature_descriptor {",
    "table_id: 0",
    "input_shape: 3",
    "optimization_parameters { adagrad {} }",
    "learning_rate { constant: 0.1 }",
    "mode: TRAINING",
    "mode: 7",
    "num_hosts: -1",
    "\ud800",
    "\udfff",
    "\x00",
    "'\\xff'",
    '"\\u00e9"',
    "#",
    "\n",
    " ",
    ":",
    "[",
    "]",
    "<",
    ">",
    "1e999",
    "-0",
    "nan",
    "0x7fffffffffffffff",
    "99999999999999999999",
]


def _mutate_text(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 4)):
        pos = rng.randint(0, len(text))
        op = rng.randrange(4)
        if op == 0:
            text = text[:pos] + rng.choice(_TEXT_PIECES) + text[pos:]
        elif op == 1:
            text = text[:pos] + text[pos + rng.randint(1, 12) :]
        elif op == 2:
            text = (
                text[:pos]
                + chr(rng.choice([rng.randrange(0x80), rng.randrange(0xD800, 0xE000), rng.randrange(0x10FFFF)]))
                + text[pos:]
            )
        else:
            i = rng.randint(0, len(text))
            text = text[:pos] + text[i : i + rng.randint(1, 40)] + text[pos:]
    return text


def _check_text(text: str, report: Report) -> None:
    try:
        proto = te.config.parse_text(text)
    except te.config.InvalidConfigError:
        report.rejected += 1
        return
    except Exception as e:
        report.fail(f"parse_text raised {type(e).__name__}: {e}", text)
        return
    try:
        te.config.load(proto)
        report.accepted += 1
    except te.config.ConfigError:
        report.rejected += 1
    except Exception as e:
        report.fail(f"load of parsed text raised {type(e).__name__}: {e}", text)


def run(seconds: float, seed: int = 0, max_inputs: int | None = None) -> Report:
    rng = random.Random(seed)
    module = _loader.load_config_module()
    seeds = _seeds(rng)
    texts = [str(_random_valid_config(rng)) for _ in range(10)]
    report = Report("config", seed)
    budget = Budget(seconds, max_inputs)
    start = time.monotonic()
    with Watchdog() as watchdog:
        while budget.more():
            budget.count += 1
            if budget.count % 256 == 0:
                watchdog.kick()
            if rng.random() < 0.9:
                _check_bytes(_mutate(rng.choice(seeds), rng, seeds), module, report, budget.count % 997 == 0)
                report.bump("bytes")
            else:
                _check_text(_mutate_text(rng.choice(texts), rng), report)
                report.bump("text")
    report.inputs = budget.count
    report.seconds = time.monotonic() - start
    return report
