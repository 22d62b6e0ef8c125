"""What the report's sections share: the engines' and optimizers' labels, the peers, and the cells of a table (a
record's time, a peer's time and our speedup over it, a rate) with the look-ups of run records they format."""

from __future__ import annotations

import json
import os

__all__ = [
    "ENGINE_LABELS",
    "OPT_LABELS",
    "PEERS",
    "find",
    "fmt_ratio",
    "index",
    "ms",
    "peer_cell",
    "rate",
    "ratio",
    "write_section_json",
]

ENGINE_LABELS = {
    "ours": "tf_embed_ops (fused)",
    "keras": "Keras 3 optimizer",
    "raw_op": "tf.raw_ops sparse apply",
    "fbgemm": "FBGEMM TBE (CPU)",
    "fbgemm_rowwise": "FBGEMM row-wise Adagrad",
    "tf_lookup": "tf.nn.embedding_lookup(_sparse)",
    "keras_rs": "keras-rs DistributedEmbedding on CPU (the model's Adam)",
    "ours_keras_rs": "tf_embed_ops.keras.DistributedEmbedding (table Adam)",
    "speed_of_light": "speed-of-light kernel (C++, no framework)",
    "tf_empty_step": "empty tf.function step",
    "ours_one_id": "ours, fused SGD step on one id",
}
OPT_LABELS = {
    "sgd": "SGD",
    "adagrad": "Adagrad",
    "adagrad_momentum": "AdagradMomentum",
    "adam": "Adam (lazy)",
    "adam_nonlazy": "Adam (non-lazy)",
    "ftrl": "FTRL",
    "momentum": "Momentum",
    "rms_prop": "RMSProp",
    "centered_rms_prop": "CenteredRMSProp",
    "rowwise_adagrad": "RowWiseAdagrad",
    "lookup": "lookup only",
}
PEERS = ("keras", "raw_op", "fbgemm", "fbgemm_rowwise", "speed_of_light")


def write_section_json(result: dict, out_dir: str, common: dict, section: str, **extra) -> list[str]:
    """Writes ``<section>.json`` (``common``, the run's ``section`` and ``extra``) through a temporary name; returns
    its file name in a list (empty when the run had no such section)."""
    if not result.get(section):
        return []
    name = f"{section}.json"
    path = os.path.join(out_dir, name)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({**common, section: result[section], **extra}, f, indent=1, default=float)
    os.replace(path + ".tmp", path)
    return [name]


def index(runs: list[dict], section: str) -> dict[tuple[str, str, str], dict]:
    return {(r["workload"], r["optimizer"], r["engine"]): r for r in runs if r.get("section") == section}


def find(recs: list[dict], **match) -> dict | None:
    """The first record whose fields equal ``match``."""
    return next((r for r in recs if all(r.get(k) == v for k, v in match.items())), None)


def ms(rec: dict | None) -> str:
    if rec is None:
        return "—"
    if "error" in rec:
        return "n/a"
    return f"{rec['median_ms']:.3g} ± {rec['iqr_ms'] / 2:.2g}"


def ratio(peer: dict | None, mine: dict | None) -> float | None:
    if not peer or not mine or "median_ms" not in peer or "median_ms" not in mine or mine["median_ms"] <= 0:
        return None
    return peer["median_ms"] / mine["median_ms"]


def fmt_ratio(x: float | None) -> str:
    if x is None:
        return "—"
    return f"**{x:.3g}x**" if x >= 1 else f"{x:.2g}x"


def peer_cell(peer: dict | None, mine: dict | None) -> str:
    if peer is None:
        return "—"
    if "error" in peer:
        return "n/a"
    return f"{peer['median_ms']:.3g} ({fmt_ratio(ratio(peer, mine))})"


def rate(x: float | None) -> str:
    if not x:
        return "—"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"
