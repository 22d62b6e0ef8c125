"""The metadata an export records about its tables, in ``assets.extra/tf_embed_ops_export.json``.

Plain JSON, read without TensorFlow or `tf_embed_ops` ops (``python -m tf_embed_ops inspect-export DIR``):

    {"format": "tf_embed_ops.serving_export", "version": 1, "sha256": <hex digest of the canonical "tables" JSON>,
     "tables": {name: {"kind": "static" | "dynamic", "dim", "rows_trained", "rows_exported", "rows_pruned",
                       "quantization": "none" | "int8" | "int4" | "float16" | "bfloat16", "trained_dtype",
                       "bytes", "bytes_float32", "prune": {criterion: value} | null}}}

``assets.extra`` is the SavedModel directory TensorFlow Serving leaves to tools: nothing in the graph reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from tf_embed_ops.formats import atomic_write

__all__ = [
    "FORMAT",
    "METADATA_PATH",
    "VERSION",
    "format_text",
    "read_export_metadata",
    "saved_model_bytes",
    "write_export_metadata",
]

FORMAT = "tf_embed_ops.serving_export"
VERSION = 1
METADATA_PATH = os.path.join("assets.extra", "tf_embed_ops_export.json")


def _digest(tables: dict) -> str:
    return hashlib.sha256(json.dumps(tables, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_export_metadata(export_dir: str, tables: dict) -> str:
    """Writes the metadata of `tables` ({name: table_metadata}) into `export_dir`; returns the file's path."""
    path = os.path.join(export_dir, METADATA_PATH)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = {"format": FORMAT, "version": VERSION, "sha256": _digest(tables), "tables": tables}
    atomic_write.write_file(path, json.dumps(body, indent=1, sort_keys=True).encode("utf-8"))
    return path


def read_export_metadata(export_dir: str) -> dict:
    """The `tables` metadata of an export, validated ({name: {...}}, see the module docstring).

    Raises:
      ValueError: no metadata (not an export of `export_for_serving`), another format or version, a checksum
        that does not match, or malformed JSON.
    """
    path = os.path.join(export_dir, METADATA_PATH)
    if not os.path.isfile(path):
        raise ValueError(f"{export_dir}: no {METADATA_PATH}; not a tf_embed_ops serving export (or an older one)")
    try:
        with open(path, encoding="utf-8") as f:
            body = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable metadata ({e})") from e
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ValueError(f"{path}: not {FORMAT} metadata")
    if body.get("version") != VERSION:
        raise ValueError(f"{path}: metadata version {body.get('version')!r}; this reader knows version {VERSION}")
    tables = body.get("tables")
    if not isinstance(tables, dict) or body.get("sha256") != _digest(tables):
        raise ValueError(f"{path}: the metadata's checksum does not match its content (corrupted or edited)")
    return tables


def saved_model_bytes(export_dir: str) -> int:
    """Bytes of the SavedModel's files (graph, variables, assets), the metadata excluded."""
    total = 0
    for root, _, files in os.walk(export_dir):
        for name in files:
            path = os.path.join(root, name)
            if os.path.relpath(path, export_dir) != METADATA_PATH:
                total += os.path.getsize(path)
    return total


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def format_text(export_dir: str, tables: dict, total_bytes: int) -> str:
    """A per-table report: rows kept of trained, bytes, the ratio to float32, quantization and pruning."""
    lines = [
        f"export: {export_dir}",
        f"SavedModel size: {_mib(total_bytes)} ({total_bytes} bytes)",
        "",
        f"{'table':<20} {'kind':<8} {'dim':>5} {'rows kept/trained':>22} {'bytes':>12} {'vs fp32':>8} "
        f"{'quantization':<12} pruning",
    ]
    for name in sorted(tables):
        t: dict[str, Any] = tables[name]
        rows = f"{t['rows_exported']}/{t['rows_trained']}"
        ratio = t["bytes_float32"] / t["bytes"] if t["bytes"] else float("inf")
        prune = ", ".join(f"{k}={v}" for k, v in (t.get("prune") or {}).items()) or "-"
        lines.append(
            f"{name:<20} {t['kind']:<8} {t['dim']:>5} {rows:>22} {t['bytes']:>12} {ratio:>7.2f}x "
            f"{t['quantization']:<12} {prune}"
        )
    return "\n".join(lines) + "\n"
