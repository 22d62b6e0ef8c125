"""The CTR example's serving exports side by side: `python -m tf_embed_ops.examples.ctr_serving [--smoke]`.

Trains the tf_embed_ops model of `ctr.py`, exports it four ways with `te.keras.export_for_serving` into a temporary
directory (removed at the end) and evaluates each export loaded with `tf.saved_model.load` (stock TensorFlow ops):

- `float32`: the tables as trained;
- `int8`, `int4`: every table row-wise quantized (docs/serving.md, "Quantized and pruned exports");
- `pruned`: float32, with the `user` and `item` tables cut to the half of their rows with the largest L2 norm (the
  others read zeros).

It prints each export's SavedModel size and test AUC (exact, from the ranks of the scores), and the AUC change
from the float32 export.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops import keras as te_keras
from tf_embed_ops.examples import ctr
from tf_embed_ops.serving import metadata as metadata_lib

__all__ = ["SIGNATURE", "auc", "compare", "export_variants", "summary", "variants"]

_RAGGED = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64)
SIGNATURE = {
    "user": tf.TensorSpec([None], tf.int64),
    "item": tf.TensorSpec([None], tf.int64),
    "category": tf.TensorSpec([None], tf.int64),
    "device": tf.TensorSpec([None], tf.int64),
    "tags": _RAGGED,
    "history": _RAGGED,
    "numeric": tf.TensorSpec([None, 2], tf.float32),
}


def variants(sizes: dict) -> dict:
    """{export name: export_for_serving keyword arguments}, for tables of `sizes` ({table name: rows})."""
    half = {name: te.serving.Prune(max_rows=sizes[name] // 2) for name in ("user", "item")}
    return {
        "float32": {},
        "int8": {"quantization": "int8"},
        "int4": {"quantization": "int4"},
        "pruned": {"prune": half},
    }


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC: the probability that a positive scores above a negative (ties count half), from average ranks."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, np.float64).reshape(-1)
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(scores.shape[0], np.float64)
    sorted_scores = scores[order]
    start = 0
    for end in np.append(np.flatnonzero(np.diff(sorted_scores)) + 1, scores.shape[0]):
        ranks[order[start:end]] = (start + end + 1) / 2.0  # 1-based average rank of a tie group
        start = end
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def _feed(features: dict, start: int, stop: int) -> dict:
    out = {}
    for name, value in features.items():
        part = value[start:stop]
        if isinstance(part, tf.RaggedTensor):
            out[f"{name}_values"], out[f"{name}_row_splits"] = part.values, part.row_splits
        else:
            out[name] = tf.constant(part)
    return out


def predict_export(export_dir: str, features: dict, batch: int = 4096) -> np.ndarray:
    """Scores of a loaded export's `serving_default` signature over `features`, in batches."""
    fn = tf.saved_model.load(export_dir).signatures["serving_default"]
    n = int(features["user"].shape[0])
    return np.concatenate([fn(**_feed(features, s, min(n, s + batch)))["output_0"].numpy() for s in range(0, n, batch)])


def export_variants(model: keras.Model, directory: str, sizes: dict) -> dict:
    """Exports `model` once per `variants` entry under `directory`; returns {name: export directory}."""
    out = {}
    for name, kwargs in variants(sizes).items():
        out[name] = os.path.join(directory, name)
        te_keras.export_for_serving(model, out[name], SIGNATURE, **kwargs)
    return out


def compare(model: keras.Model, test_x: dict, test_y: np.ndarray, sizes: dict) -> dict:
    """{variant: {"test_auc", "saved_model_bytes", "tables"}} for the exports of a trained CTR model."""
    directory = tempfile.mkdtemp(prefix="ctr_serving_")
    try:
        results = {}
        for name, path in export_variants(model, directory, sizes).items():
            results[name] = {
                "test_auc": auc(test_y, predict_export(path, test_x)),
                "saved_model_bytes": metadata_lib.saved_model_bytes(path),
                "tables": metadata_lib.read_export_metadata(path),
            }
        return results
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def summary(results: dict) -> str:
    base = results["float32"]
    lines = ["export     SavedModel   vs fp32   test AUC   change", "-" * 52]
    for name, r in results.items():
        ratio = base["saved_model_bytes"] / r["saved_model_bytes"]
        change = r["test_auc"] - base["test_auc"]
        lines.append(
            f"{name:<9} {r['saved_model_bytes'] / 2**10:9.0f} KiB {ratio:7.2f}x {r['test_auc']:9.4f} {change:+8.4f}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict:
    """Trains the example's tf_embed_ops model (as `ctr.run` does), then compares its exports."""
    keras.utils.set_random_seed(0)
    n_train, n_test, epochs = (2000, 500, 1) if args.smoke else (args.train_size, args.test_size, args.epochs)
    train_x, train_y = ctr.make_data(n_train, seed=1)
    test_x, test_y = ctr.make_data(n_test, seed=2)
    fc, optimizer = ctr.feature_config()
    model = ctr.build_model(te_keras.TPUEmbedding(fc, optimizer, name="embedding"))
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate), loss="binary_crossentropy")
    train = ctr.dataset(train_x, train_y, args.batch_size, shuffle=True)
    model.fit(train, epochs=epochs, shuffle=False, verbose=0 if args.quiet else 2)
    results = compare(model, test_x, test_y, ctr.SIZES)
    print("\n" + summary(results))
    return results


def main(argv: list[str] | None = None) -> int:
    """The example's own command line (`ctr.py`'s arguments: sizes, epochs, --smoke)."""
    run(ctr.build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
