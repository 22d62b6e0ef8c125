"""The readable view of a validated TPUEmbeddingConfiguration: what ``load()`` returns.

Every value comes from the C++ validator's model (cc/config), so what Python shows is what the kernels run.
float32 hyper-parameters are shown as the shortest decimal that round-trips in float32 (``0.1``, not
``0.10000000149011612``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf import text_format

from tf_embed_ops import _optimizer_schema
from tf_embed_ops._tf_compat import tpu_embedding_configuration_pb2

TPUEmbeddingConfiguration = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration


def _f32(value: float) -> float:
    """The shortest decimal that names the same float32 (inf and nan pass through)."""
    return float(str(np.float32(value)))


def _bound(value: float | None) -> float | None:
    # An infinite clip bound clips nothing: shown as None, like an absent one.
    return None if value is None or math.isinf(value) else _f32(value)


@dataclasses.dataclass(frozen=True)
class SlotInfo:
    """An optimizer slot: its name (Load/Retrieve order, checkpoint suffix ``<table>/<name>``), the value
    TensorFlow's optimizer fills it with by default, and whether it holds one value per row (a
    ``[vocabulary_size, 1]`` variable, row-wise Adagrad) rather than one per element (``[vocabulary_size, dim]``)."""

    name: str
    default_initial_value: float
    per_row: bool = False

    def shape(self, vocabulary_size: int, dim: int) -> tuple[int, int]:
        """The slot variable's shape in a table of ``vocabulary_size`` rows and ``dim`` columns."""
        return (vocabulary_size, 1 if self.per_row else dim)


@dataclasses.dataclass(frozen=True)
class OptimizerInfo:
    """The table's algorithm: ``kind`` is the proto field name (``"adam"``, ``"stochastic_gradient_descent"``...),
    ``hyperparameters`` its fields as in the proto, ``slots`` in Load/Retrieve order."""

    kind: str
    hyperparameters: Mapping[str, float | bool]
    slots: tuple[SlotInfo, ...]
    updates_all_rows: bool  # non-lazy Adam: every row is updated every step

    @property
    def slot_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slots)

    @property
    def in_tpu_proto(self) -> bool:
        """Whether TensorFlow's TPU proto has this algorithm (False: row-wise Adagrad, which tf_embed_ops carries in
        an extension field; a TPU cannot run it)."""
        return _optimizer_schema.schema_for_kind(self.kind).in_tpu_proto

    @property
    def python_class(self) -> str:
        """The Python class of this algorithm (``"RowWiseAdagrad"``)."""
        return _optimizer_schema.schema_for_kind(self.kind).python_class


@dataclasses.dataclass(frozen=True)
class LearningRateInfo:
    """Either a constant or the dynamic learning-rate ``tag`` (index into the send op's ``learning_rates``)."""

    constant: float | None = None
    tag: int | None = None

    @property
    def is_dynamic(self) -> bool:
        return self.tag is not None

    def __str__(self) -> str:
        return f"tag {self.tag}" if self.is_dynamic else f"{self.constant:g}"


@dataclasses.dataclass(frozen=True)
class ClipLimits:
    """Closed interval; ``None`` is an open side (an explicit infinite bound in the proto reads the same)."""

    lower: float | None = None
    upper: float | None = None

    @property
    def active(self) -> bool:
        return self.lower is not None or self.upper is not None

    def __str__(self) -> str:
        if not self.active:
            return "-"
        lo = "-inf" if self.lower is None else f"{self.lower:g}"
        hi = "inf" if self.upper is None else f"{self.upper:g}"
        return f"[{lo}, {hi}]"


@dataclasses.dataclass(frozen=True)
class QuantizationInfo:
    """Forward-only simulated quantization of looked-up rows (docs/semantics.md, "Simulated quantization")."""

    num_buckets: int
    lower: float
    upper: float


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """One table_descriptor, validated.  ``vocabulary_size`` is the proto's (already padded to num_hosts)."""

    table_id: int
    name: str
    vocabulary_size: int
    dimension: int
    num_features: int  # as given; 0 unless the config is V1-style (no feature descriptors)
    optimizer: OptimizerInfo
    learning_rate: LearningRateInfo
    weight_clipping: ClipLimits
    gradient_clipping: ClipLimits
    weight_decay_factor: float
    multiply_weight_decay_factor_by_learning_rate: bool
    gradient_accumulation: bool  # UNSPECIFIED reads as True, as on TPU
    gradient_accumulation_status: str
    low_dimensional_packing_status: str
    simulated_quantization: QuantizationInfo | None

    @property
    def slot_names(self) -> tuple[str, ...]:
        return self.optimizer.slot_names


@dataclasses.dataclass(frozen=True)
class FeatureInfo:
    """One feature_descriptor (or, V1-style, the feature synthesised for a table).  ``input_shape`` is ``()``
    when not known yet (it becomes known at the first batch)."""

    index: int
    name: str
    table_id: int
    table_name: str
    input_shape: tuple[int, ...]


def _table_info(table_id: int, d: Mapping[str, Any]) -> TableInfo:
    opt = d["optimizer"]
    hyper = {k: (v if isinstance(v, bool) else _f32(v)) for k, v in opt["hyperparameters"].items()}
    lr = d["learning_rate"]
    q = d["simulated_quantization"]
    return TableInfo(
        table_id=table_id,
        name=d["name"],
        vocabulary_size=d["vocabulary_size"],
        dimension=d["dimension"],
        num_features=d["num_features"],
        optimizer=OptimizerInfo(
            kind=opt["kind"],
            hyperparameters=hyper,
            slots=tuple(SlotInfo(name, _f32(value), per_row) for name, value, per_row in opt["slots"]),
            updates_all_rows=opt["updates_all_rows"],
        ),
        learning_rate=LearningRateInfo(tag=lr["tag"]) if lr["dynamic"] else LearningRateInfo(_f32(lr["constant"])),
        weight_clipping=ClipLimits(*map(_bound, d["weight_clipping"])),
        gradient_clipping=ClipLimits(*map(_bound, d["gradient_clipping"])),
        weight_decay_factor=_f32(d["weight_decay_factor"]),
        multiply_weight_decay_factor_by_learning_rate=d["multiply_weight_decay_factor_by_learning_rate"],
        gradient_accumulation=d["gradient_accumulation"],
        gradient_accumulation_status=d["gradient_accumulation_status"],
        low_dimensional_packing_status=d["low_dimensional_packing_status"],
        simulated_quantization=None
        if q is None
        else QuantizationInfo(q["num_buckets"], _f32(q["lower"]), _f32(q["upper"])),
    )


def _json_float(value: Any) -> Any:
    # JSON has no infinities; an absent clip bound is already None.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class EmbeddingConfig:
    """A validated TPUEmbeddingConfiguration with a readable view.  Made by :func:`tf_embed_ops.config.load`.

    Attributes:
      tables: ``TableInfo`` per table, index = table id.
      features: ``FeatureInfo`` per feature, index = position in the ops' per-feature input lists.
      mode, sharding_strategy: enum names (``"TRAINING"``, ``"DIV_DEFAULT"``...).  ``mode`` may be
        ``"UNSPECIFIED"``: load() accepts it; ops that need a mode reject it.
      num_hosts, num_tensor_cores, batch_size_per_tensor_core, pipeline_execution_with_tensor_core: as in the proto.
      num_learning_rate_tags: length of the send op's ``learning_rates`` list (tags are dense in [0, n)).
      features_synthesized: True for a V1-style config (no feature descriptors): one feature per table.

    Example:
      >>> cfg = tf_embed_ops.config.load("model.pbtxt")
      >>> cfg.table_by_name("video").optimizer.slot_names
      ('momenta', 'velocities')
    """

    def __init__(self, proto: TPUEmbeddingConfiguration, parsed: Mapping[str, Any]):
        # Private: use load().  `parsed` is the dict tf_embed_ops._config.parse returned for `proto`.
        self._proto = TPUEmbeddingConfiguration()
        self._proto.CopyFrom(proto)
        self.tables: tuple[TableInfo, ...] = tuple(_table_info(i, t) for i, t in enumerate(parsed["tables"]))
        self.features: tuple[FeatureInfo, ...] = tuple(
            FeatureInfo(i, f["name"], f["table_id"], self.tables[f["table_id"]].name, tuple(f["input_shape"]))
            for i, f in enumerate(parsed["features"])
        )
        self.features_synthesized: bool = parsed["features_synthesized"]
        self.mode: str = parsed["mode"]
        self.num_hosts: int = parsed["num_hosts"]
        self.num_tensor_cores: int = parsed["num_tensor_cores"]
        self.batch_size_per_tensor_core: int = parsed["batch_size_per_tensor_core"]
        self.sharding_strategy: str = parsed["sharding_strategy"]
        self.pipeline_execution_with_tensor_core: bool = parsed["pipeline_execution_with_tensor_core"]
        self.num_learning_rate_tags: int = parsed["num_learning_rate_tags"]

    @property
    def learning_rate_tags(self) -> dict[int, tuple[str, ...]]:
        """``{tag: names of the tables using it}`` for every dynamic learning-rate tag, in tag order."""
        out: dict[int, tuple[str, ...]] = {}
        for tag in range(self.num_learning_rate_tags):
            out[tag] = tuple(t.name for t in self.tables if t.learning_rate.tag == tag)
        return out

    def table_by_name(self, name: str) -> TableInfo:
        """The table called ``name``.

        Raises:
          KeyError: no table has that name (the message lists the names).
        """
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(f"no table named {name!r}; tables: {[t.name for t in self.tables]}")

    def to_proto(self) -> TPUEmbeddingConfiguration:
        """A copy of the validated message."""
        out = TPUEmbeddingConfiguration()
        out.CopyFrom(self._proto)
        return out

    def check_tpu_compatible(self, what: str = "export for a TPU") -> None:
        """Raises ValueError naming the first table whose optimizer TensorFlow's TPU proto lacks (row-wise Adagrad:
        tf_embed_ops carries it in an extension field that a TPU ignores, so the table would have no optimizer)."""
        for t in self.tables:
            if not t.optimizer.in_tpu_proto:
                raise ValueError(
                    f"Cannot {what}: table {t.name!r} uses optimizer {t.optimizer.python_class} "
                    f"({t.optimizer.kind}), which TensorFlow's TPUEmbeddingConfiguration has no field for; only "
                    "tf_embed_ops' kernels run it. Give the table a TPU optimizer (e.g. Adagrad) to export it."
                )

    def to_tpu_proto(self) -> TPUEmbeddingConfiguration:
        """The message for a TPU (TensorFlow's ``TPUEmbeddingConfiguration``): a copy of the validated message.

        Raises:
          ValueError: a table's optimizer is not in TensorFlow's TPU proto (row-wise Adagrad); the message names
            the table and the optimizer.
        """
        self.check_tpu_compatible()
        return self.to_proto()

    def serialize(self) -> bytes:
        """The message in (deterministic) wire format: what the ops' ``config`` attr takes."""
        return self._proto.SerializeToString(deterministic=True)

    def to_text(self) -> str:
        """The message in protobuf text format (what a ``.pbtxt`` file holds).

        Raises:
          ValueError: a table's optimizer is not in TensorFlow's TPU proto (row-wise Adagrad): the text format has
            no form for the extension field that carries it (use ``serialize()``).
        """
        self.check_tpu_compatible("write the text format")
        return text_format.MessageToString(self._proto)

    def to_dict(self) -> dict[str, Any]:
        """The whole view as JSON-ready data (infinite floats as strings)."""

        def convert(value: Any) -> Any:
            if dataclasses.is_dataclass(value):
                return {f.name: convert(getattr(value, f.name)) for f in dataclasses.fields(value)}
            if isinstance(value, Mapping):
                return {k: convert(v) for k, v in value.items()}
            if isinstance(value, (tuple, list)):
                return [convert(v) for v in value]
            return _json_float(value)

        return {
            "mode": self.mode,
            "num_hosts": self.num_hosts,
            "num_tensor_cores": self.num_tensor_cores,
            "batch_size_per_tensor_core": self.batch_size_per_tensor_core,
            "sharding_strategy": self.sharding_strategy,
            "pipeline_execution_with_tensor_core": self.pipeline_execution_with_tensor_core,
            "num_learning_rate_tags": self.num_learning_rate_tags,
            "learning_rate_tags": {str(k): list(v) for k, v in self.learning_rate_tags.items()},
            "features_synthesized": self.features_synthesized,
            "tables": [convert(t) for t in self.tables],
            "features": [convert(f) for f in self.features],
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EmbeddingConfig):
            return NotImplemented
        return self._proto == other._proto

    __hash__ = None  # mutable proto inside; equality is by content

    def __repr__(self) -> str:
        tables = ", ".join(f"{t.name}:{t.optimizer.kind}" for t in self.tables)
        return (
            f"EmbeddingConfig(tables=[{tables}], features={len(self.features)}, mode={self.mode}, "
            f"num_learning_rate_tags={self.num_learning_rate_tags})"
        )
