"""The optimizer schema, read from the C++ table (cc/lib/optimizers/schema.h) through the config module.

One entry per optimizer the kernels run: its proto field names, Python argument names and defaults, valid
ranges, slots and when it needs gradient accumulation.  ``tf_embed_ops.optimizers`` generates its classes from it
and ``tf_embed_ops.config`` maps every optimizer object to and from the proto with it, so Python checks exactly
what the C++ validator checks, with the same range texts.

Python values are checked as the proto will store them: rounded to float32 first (``1e-50`` is ``0`` there, so
``epsilon=1e-50`` is refused in Python as in C++).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf import unknown_fields

from tf_embed_ops import _loader


def as_float32(value: Any) -> float:
    """``value`` as the float32 a proto field stores, as a Python float (no overflow warning: it is checked)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def shortest_float32(value: float) -> float:
    """The shortest decimal naming the same float32 (``0.1``, not ``0.10000000149011612``)."""
    return float(str(np.float32(value)))


@dataclasses.dataclass(frozen=True)
class Range:
    """The valid values of a float argument (bounds None = unbounded; ``text`` is the C++ description)."""

    lower: float | None
    lower_inclusive: bool
    upper: float | None
    upper_inclusive: bool
    finite: bool
    text: str

    def contains(self, value: float) -> bool:
        """Whether the float32 ``value`` is valid: the same test as the C++ ``Range::Contains`` (NaN fails every
        bound, so it is valid only where nothing is checked)."""
        if self.finite and not math.isfinite(value):
            return False
        if self.lower is not None and not (value >= self.lower if self.lower_inclusive else value > self.lower):
            return False
        return self.upper is None or (value <= self.upper if self.upper_inclusive else value < self.upper)

    @property
    def unchecked(self) -> bool:
        return self.lower is None and self.upper is None and not self.finite

    def check(self, argument: str, value: Any, where: str = "") -> None:
        """Raises ValueError naming ``argument`` (and ``where``) when ``value`` is not a number in range."""
        if self.unchecked:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            raise ValueError(f"{where}Argument `{argument}` must be a number, {self.text}. Received: {value!r}")
        stored = as_float32(value)
        if not self.contains(stored):
            as_stored = "" if stored == value or math.isnan(stored) else f" (as float32: {stored!r})"
            raise ValueError(f"{where}Argument `{argument}` must be {self.text}. Received: {value!r}{as_stored}")


@dataclasses.dataclass(frozen=True)
class HyperParameter:
    """One field of the optimizer's proto message and the Python argument that sets it."""

    proto_name: str
    python_name: str
    type: str  # "float" or "bool"
    python_default: float | bool
    range: Range
    python_negated: bool  # the Python bool means the opposite of the proto field (lazy_adam)
    doc: str

    def to_proto(self, python_value: Any) -> Any:
        if self.type == "bool":
            return bool(python_value) != self.python_negated
        return python_value

    def from_proto(self, proto_value: Any) -> Any:
        if self.type == "bool":
            return bool(proto_value) != self.python_negated
        return proto_value


@dataclasses.dataclass(frozen=True)
class Slot:
    """A slot in Load/Retrieve order, and the Python argument (or None) that sets its initial value."""

    name: str
    default_initial_value: float
    python_name: str | None
    range: Range
    per_row: bool = False  # one value per row: a [vocabulary_size, 1] variable instead of [vocabulary_size, dim]

    def shape(self, vocabulary_size: int, dim: int) -> tuple[int, int]:
        """The slot variable's shape in a table of ``vocabulary_size`` rows and ``dim`` columns."""
        return (vocabulary_size, 1 if self.per_row else dim)


@dataclasses.dataclass(frozen=True)
class Accumulation:
    """When the optimizer needs gradient accumulation: always, or when the bool proto field ``when_set`` is true."""

    always: bool
    when_set: str | None
    reason: str


@dataclasses.dataclass(frozen=True)
class OptimizerSchema:
    """Everything about one optimizer but its math (see cc/lib/optimizers/schema.h)."""

    kind: str  # the OptimizationParameters.parameters oneof field
    python_class: str
    origin: str  # "tensorflow" (tf.tpu.experimental.embedding's class) or "catalogue" (generated here)
    summary: str
    default_learning_rate: float | None  # None: the argument is required
    learning_rate_doc: str
    needs_dynamic_learning_rate: bool
    load_op: str  # tf.raw_ops name of TensorFlow's TPU Load op, "" when there is none
    # 0: ``kind`` is a field of the OptimizationParameters.parameters oneof.  > 0: not in TensorFlow's proto; a
    # config carries it in this field number of OptimizationParameters (an unknown field for TensorFlow), see
    # docs/config.md, "Optimizers that are not in the TPU proto".
    extension_field: int
    accumulation: Accumulation
    hyper_parameters: tuple[HyperParameter, ...]
    slots: tuple[Slot, ...]

    def proto_values(self, python_values: Mapping[str, Any]) -> dict[str, Any]:
        """``{proto field: value}`` from ``{python argument: value}``."""
        return {h.proto_name: h.to_proto(python_values[h.python_name]) for h in self.hyper_parameters}

    @property
    def in_tpu_proto(self) -> bool:
        """Whether TensorFlow's TPU proto has this optimizer (else only tf_embed_ops' kernels run it)."""
        return self.extension_field == 0

    def fill(self, parameters: Any, python_values: Mapping[str, Any]) -> None:
        """Selects this optimizer in ``parameters`` (an OptimizationParameters) and writes its fields."""
        if not self.in_tpu_proto:
            parameters.MergeFromString(self.extension_bytes(python_values))
            return
        message = getattr(parameters, self.kind)
        message.SetInParent()
        for field, value in self.proto_values(python_values).items():
            setattr(message, field, value)

    def extension_bytes(self, python_values: Mapping[str, Any]) -> bytes:
        """The wire bytes of this optimizer's extension field: field ``extension_field`` of OptimizationParameters,
        a message whose field ``i + 1`` is hyper-parameter ``i`` (float: fixed32, bool: varint), every field written.
        Merged into a message, they become an unknown field that protobuf keeps through copies and serialisation.
        """
        values = self.proto_values(python_values)
        payload = b""
        for i, h in enumerate(self.hyper_parameters):
            if h.type == "bool":
                payload += _varint((i + 1) << 3) + _varint(int(bool(values[h.proto_name])))
            else:
                payload += _varint((i + 1) << 3 | 5) + struct.pack("<f", as_float32(values[h.proto_name]))
        return _varint(self.extension_field << 3 | 2) + _varint(len(payload)) + payload

    def python_values(self, proto_values: Mapping[str, Any]) -> dict[str, Any]:
        """``{python argument: value}`` from ``{proto field: value}`` (e.g. a loaded table's hyperparameters)."""
        return {h.python_name: h.from_proto(proto_values[h.proto_name]) for h in self.hyper_parameters}

    def check(
        self, python_values: Mapping[str, Any], *, learning_rate: Any, use_gradient_accumulation: bool, where: str = ""
    ) -> None:
        """The checks the C++ validator makes, on Python arguments.

        Args:
          python_values: ``{python argument: value}`` for every hyper-parameter, and for the slot arguments present.
          learning_rate: a float or a callable.
          use_gradient_accumulation: the optimizer's setting.
          where: prefix of the messages (e.g. ``"table 'video': "``).

        Raises:
          ValueError: naming the argument, the allowed range and the value.
        """
        for h in self.hyper_parameters:
            if h.type == "float":
                h.range.check(h.python_name, python_values[h.python_name], where)
        for s in self.slots:
            if s.python_name is not None and s.python_name in python_values:
                s.range.check(s.python_name, python_values[s.python_name], where)
        if self.needs_dynamic_learning_rate and not callable(learning_rate):
            raise ValueError(
                f"{where}Argument `learning_rate` of {self.python_class} must be "
                f"{self.learning_rate_doc.rstrip('.')} (it becomes the table's dynamic learning rate). "
                f"Received: {learning_rate!r}"
            )
        if not use_gradient_accumulation and self.needs_accumulation(python_values):
            trigger = "use_gradient_accumulation=False"
            if not self.accumulation.always:
                spec = next(h for h in self.hyper_parameters if h.proto_name == self.accumulation.when_set)
                trigger = f"{spec.python_name}={python_values[spec.python_name]!r}"
            raise ValueError(
                f"{where}Argument `{trigger}` is refused: {self.accumulation.reason}. Set "
                "`use_gradient_accumulation=True`."
            )

    def needs_accumulation(self, python_values: Mapping[str, Any]) -> bool:
        """Whether these arguments need gradient accumulation (the schema's rule)."""
        if self.accumulation.always:
            return True
        when = self.accumulation.when_set
        return when is not None and bool(self.proto_values(python_values)[when])


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _range(d: Mapping[str, Any]) -> Range:
    return Range(d["lower"], d["lower_inclusive"], d["upper"], d["upper_inclusive"], d["finite"], d["text"])


def _schema(d: Mapping[str, Any]) -> OptimizerSchema:
    acc = d["accumulation"]
    return OptimizerSchema(
        kind=d["kind"],
        python_class=d["python_class"],
        origin=d["origin"],
        summary=d["summary"],
        default_learning_rate=d["default_learning_rate"],
        learning_rate_doc=d["learning_rate_doc"],
        needs_dynamic_learning_rate=d["needs_dynamic_learning_rate"],
        load_op=d["load_op"],
        extension_field=d["extension_field"],
        accumulation=Accumulation(acc["always"], acc["when_set"], acc["reason"]),
        hyper_parameters=tuple(
            HyperParameter(
                h["proto_name"],
                h["python_name"],
                h["type"],
                h["python_default"],
                _range(h["range"]),
                h["python_negated"],
                h["doc"],
            )
            for h in d["hyper_parameters"]
        ),
        slots=tuple(
            Slot(
                s["name"],
                shortest_float32(s["default_initial_value"]),
                s["python_name"],
                _range(s["range"]),
                s["per_row"],
            )
            for s in d["slots"]
        ),
    )


@functools.cache
def schemas() -> tuple[OptimizerSchema, ...]:
    """Every optimizer's schema, in the C++ table's order (TensorFlow's five first)."""
    return tuple(_schema(d) for d in _loader.load_config_module().optimizer_schema())


def kind_of(parameters: Any) -> str | None:
    """The optimizer an OptimizationParameters message selects: its ``parameters`` oneof field, or the kind whose
    extension field it carries (row-wise Adagrad); None when neither is set."""
    oneof = parameters.WhichOneof("parameters")
    if oneof is not None:
        return oneof
    numbers = {f.field_number for f in unknown_fields.UnknownFieldSet(parameters)}
    for s in schemas():
        if not s.in_tpu_proto and s.extension_field in numbers:
            return s.kind
    return None


def refill(parameters: Any, schema: OptimizerSchema, python_values: Mapping[str, Any]) -> None:
    """Rewrites the hyper-parameters of ``schema``'s optimizer in ``parameters`` from ``{python argument: value}``
    (no range check: tests use it to write values the validator must refuse)."""
    if schema.in_tpu_proto:
        parameters.ClearField(schema.kind)
    else:
        parameters.DiscardUnknownFields()
    schema.fill(parameters, python_values)


def schema_for_kind(kind: str) -> OptimizerSchema:
    """The schema of the optimizer whose proto oneof field is ``kind``.

    Raises:
      KeyError: tf_embed_ops does not run ``kind``.
    """
    for s in schemas():
        if s.kind == kind:
            return s
    raise KeyError(f"no optimizer of kind {kind!r}; known: {[s.kind for s in schemas()]}")
