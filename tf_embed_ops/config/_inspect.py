"""Human-readable and JSON renderings of an EmbeddingConfig (used by ``python -m tf_embed_ops inspect``)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from tf_embed_ops.config._view import EmbeddingConfig, TableInfo


def _aligned(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in (header, *rows)]
    return "\n".join(lines)


def _value(v: float | bool) -> str:
    return str(v).lower() if isinstance(v, bool) else f"{v:g}"


def _hyperparameters(table: TableInfo) -> str:
    return " ".join(f"{k}={_value(v)}" for k, v in table.optimizer.hyperparameters.items()) or "-"


def _options(table: TableInfo) -> str:
    out = []
    if table.weight_clipping.active:
        out.append(f"clip_weights={table.weight_clipping}")
    if table.gradient_clipping.active:
        out.append(f"clip_gradients={table.gradient_clipping}")
    if table.weight_decay_factor:
        lr = "*lr" if table.multiply_weight_decay_factor_by_learning_rate else ""
        out.append(f"weight_decay={table.weight_decay_factor:g}{lr}")
    if not table.gradient_accumulation:
        out.append("no_accumulation")
    q = table.simulated_quantization
    if q is not None:
        out.append(f"quantize={q.num_buckets}@[{q.lower:g}, {q.upper:g}]")
    if table.low_dimensional_packing_status != "UNSPECIFIED":
        out.append(f"packing={table.low_dimensional_packing_status}")
    return " ".join(out) or "-"


def format_text(cfg: EmbeddingConfig, title: str = "") -> str:
    """The config as aligned tables: tables, features, learning-rate tags."""
    pipelining = "on" if cfg.pipeline_execution_with_tensor_core else "off"
    head = (
        f"mode {cfg.mode}, {cfg.num_hosts} host(s), {cfg.num_tensor_cores} tensor core(s), sharding "
        f"{cfg.sharding_strategy}, pipelining {pipelining}, {cfg.num_learning_rate_tags} learning-rate tag(s)"
    )
    tables = _aligned(
        ["id", "table", "vocab", "dim", "optimizer", "hyper-parameters", "lr", "options", "slots (initial value)"],
        [
            [
                str(t.table_id),
                t.name,
                str(t.vocabulary_size),
                str(t.dimension),
                t.optimizer.kind,
                _hyperparameters(t),
                str(t.learning_rate),
                _options(t),
                ", ".join(f"{s.name}={s.default_initial_value:g}" for s in t.optimizer.slots) or "-",
            ]
            for t in cfg.tables
        ],
    )
    features = _aligned(
        ["#", "feature", "table", "input_shape"],
        [
            [
                str(f.index),
                f.name or "-",
                f.table_name,
                "[" + ", ".join(map(str, f.input_shape)) + "]" if f.input_shape else "unknown",
            ]
            for f in cfg.features
        ],
    )
    parts = [title, head, "", f"Tables ({len(cfg.tables)})", tables, "", f"Features ({len(cfg.features)})", features]
    if cfg.features_synthesized:
        parts.append(
            "(no feature descriptors: one feature per table, batch_size_per_tensor_core "
            f"{cfg.batch_size_per_tensor_core})"
        )
    if cfg.num_learning_rate_tags:
        tags = _aligned(["tag", "tables"], [[str(k), ", ".join(v)] for k, v in cfg.learning_rate_tags.items()])
        parts += ["", "Dynamic learning-rate tags (send op learning_rates[tag])", tags]
    return "\n".join(p for p in parts if p is not None).lstrip("\n") + "\n"


def format_json(cfg: EmbeddingConfig) -> str:
    """The config view as indented JSON (``EmbeddingConfig.to_dict``)."""
    return json.dumps(cfg.to_dict(), indent=2) + "\n"
