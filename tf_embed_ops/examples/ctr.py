"""End-to-end example: a DLRM-style click model whose embedding tables train with TPU optimizers on CPU.

    python -m tf_embed_ops.examples.ctr                 # full run (well under 2 minutes on 2 cores)
    python -m tf_embed_ops.examples.ctr --smoke         # seconds; what the test runs
    python -m tf_embed_ops.examples.ctr --write-config ctr.pbtxt   # the TPUEmbeddingConfiguration it trains
    python -m tf_embed_ops.examples.ctr --config ctr.pbtxt         # train from such a config (config loader)
    python -m tf_embed_ops.examples.ctr --dynamic [--smoke]        # open-world ids in dynamic tables (ctr_dynamic.py)
    python -m tf_embed_ops.examples.ctr_serving [--smoke]   # fp32 / int8 / int4 / pruned exports' AUC
    python -m tf_embed_ops.distribute.launch --workers 2 --collective -- \
        python -m tf_embed_ops.examples.ctr --collective [--smoke]   # 2 workers, tables sharded (ctr_collective.py)

The data is synthetic with planted structure (see `make_data`): a click depends on a user x item latent match,
the item's category, the user's interest tags (multi-hot) matching the category, the similarity of the user's
recent history (a sequence feature over the *same* item table as the candidate) to the candidate, and the device.
Tables: user (Adagrad), item (Adagrad; shared by `item` and `history`), category (Adam; shared by `category`
and the multi-hot `tags`), device (FTRL). The baseline is the same model whose tables are ordinary trainable weights
updated by the Keras optimizer; both print train/test AUC, and the run ends by naming the model with the better
test AUC (the one that generalises better to held-out impressions).  It writes no files: only `--write-config`
writes one, at the path given.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

from tf_embed_ops import config as te_config
from tf_embed_ops import embedding_ops
from tf_embed_ops import keras as te_keras
from tf_embed_ops.examples import ctr_dynamic
from tf_embed_ops.keras.layer import activation_specs

emb = tf.tpu.experimental.embedding

SIZES = {"user": 3000, "item": 4000, "category": 40, "device": 4}
DIM = 8
HISTORY = 6


def make_data(n: int, seed: int) -> tuple[dict, np.ndarray]:
    """Samples n impressions from a fixed generative model (the same model for every seed).

    logit = 2 u.v + cat_bias[c] + 1.5 * [c in tags] + 1.5 * mean(history).v + device_bias - 1
    with unit-norm 4-d user/item factors; items of one category share a direction; history items are drawn
    near the user's taste. Labels ~ Bernoulli(sigmoid(logit)).
    """
    world = np.random.default_rng(1234)  # the planted structure
    cat_dir = world.normal(size=(SIZES["category"], 4))
    item_cat = world.integers(SIZES["category"], size=SIZES["item"])
    item_vec = cat_dir[item_cat] + 0.5 * world.normal(size=(SIZES["item"], 4))
    item_vec /= np.linalg.norm(item_vec, axis=1, keepdims=True)
    user_vec = world.normal(size=(SIZES["user"], 4))
    user_vec /= np.linalg.norm(user_vec, axis=1, keepdims=True)
    cat_bias = world.normal(scale=0.7, size=SIZES["category"])
    device_bias = np.array([0.4, -0.3, 0.0, -0.6])
    # Each user likes the categories closest to their taste: 1-3 tags.
    user_tags = np.argsort(-(user_vec @ cat_dir.T), axis=1)[:, :3]
    taste_items = np.argsort(-(user_vec @ item_vec.T), axis=1)[:, :50]

    rng = np.random.default_rng(seed)
    users = rng.integers(SIZES["user"], size=n)
    items = rng.integers(SIZES["item"], size=n)
    devices = rng.integers(SIZES["device"], size=n)
    n_tags = rng.integers(1, 4, size=n)
    tags = [user_tags[u, :k].tolist() for u, k in zip(users, n_tags, strict=False)]
    hist_len = rng.integers(0, HISTORY + 3, size=n)  # longer than HISTORY: truncated by the feature config
    history = [rng.choice(taste_items[u], size=k).tolist() for u, k in zip(users, hist_len, strict=False)]
    hour = rng.uniform(0, 24, size=n)

    cats = item_cat[items]
    match = np.einsum("nd,nd->n", user_vec[users], item_vec[items])
    hist_sim = np.array(
        [item_vec[h[:HISTORY]].mean(0) @ item_vec[i] if h else 0.0 for h, i in zip(history, items, strict=False)]
    )
    in_tags = np.array([c in t for c, t in zip(cats, tags, strict=False)], dtype=np.float64)
    logit = 2 * match + cat_bias[cats] + 1.5 * in_tags + 1.5 * hist_sim + device_bias[devices] - 1.0
    logit += 0.3 * np.sin(hour / 24 * 2 * np.pi)
    labels = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    features = {
        "user": users.astype(np.int64),
        "item": items.astype(np.int64),
        "category": cats.astype(np.int64),
        "device": devices.astype(np.int64),
        "tags": tf.ragged.constant(tags, dtype=tf.int64),
        "history": tf.ragged.constant(history, dtype=tf.int64, ragged_rank=1),
        "numeric": np.stack([np.sin(hour / 24 * 2 * np.pi), np.cos(hour / 24 * 2 * np.pi)], 1).astype(np.float32),
    }
    return features, labels


def feature_config(storage_dtype: str = "float32") -> tuple[dict, object]:
    """The embedding configuration: four tables, two of them shared, four different TPU optimizers.

    `storage_dtype` other than float32 stores the tables and slots in 16 bits (te.TableConfig)."""
    table_config = emb.TableConfig
    if storage_dtype != "float32":
        from tf_embed_ops.table_config import TableConfig

        table_config = functools.partial(TableConfig, storage_dtype=storage_dtype)
    user = table_config(SIZES["user"], DIM, name="user", combiner="sum", optimizer=emb.Adagrad(0.05))
    item = table_config(SIZES["item"], DIM, name="item", combiner="sum", optimizer=emb.Adagrad(0.05))
    category = table_config(SIZES["category"], DIM, name="category", combiner="mean", optimizer=emb.Adam(0.003))
    device = table_config(SIZES["device"], DIM, name="device", combiner="sum", optimizer=emb.FTRL(0.05))
    fc = {
        "category": emb.FeatureConfig(category, name="category"),
        "device": emb.FeatureConfig(device, name="device"),
        "history": emb.FeatureConfig(item, max_sequence_length=HISTORY, name="history"),
        "item": emb.FeatureConfig(item, name="item"),
        "tags": emb.FeatureConfig(category, name="tags"),  # multi-hot, shares the category table
        "user": emb.FeatureConfig(user, name="user"),
    }
    return fc, None


def feature_config_from_file(path: str) -> tuple[dict, object]:
    """Runs from a TPUEmbeddingConfiguration through the config loader.

    A proto carries no combiner, initializer or max_sequence_length: combiners are given per table here, and a
    feature whose recorded shape is [batch, L] becomes a sequence feature of length L again.
    """
    loaded = te_config.load(path)
    combiners = {"user": "sum", "item": "sum", "category": "mean", "device": "sum"}
    fc, optimizer = te_config.to_feature_config(loaded, combiner={t: combiners.get(t, "mean") for t in _tables(loaded)})
    rebuilt = {}
    for name, f in fc.items():
        shape = f.output_shape
        if shape.rank == 2:
            rebuilt[name] = emb.FeatureConfig(f.table, max_sequence_length=int(shape[1]), name=f.name)
        else:
            rebuilt[name] = emb.FeatureConfig(f.table, name=f.name)
    missing = {"user", "item", "category", "device", "tags", "history"} - set(rebuilt)
    if missing:
        raise ValueError(f"{path}: the config must describe features {sorted(missing)} (named feature descriptors)")
    return rebuilt, optimizer


def _tables(loaded) -> list:
    return [t.name for t in loaded.tables]


class KerasOptimizerEmbedding(keras.layers.Layer):
    """Baseline: the same tables and lookups, as ordinary trainable weights updated by the Keras optimizer."""

    def __init__(self, fc: dict, **kwargs):
        super().__init__(**kwargs)
        self._convert_input_args = False
        self.fc = fc
        self.tables = {}
        for f in fc.values():
            t = f.table
            if t.name not in self.tables:
                self.tables[t.name] = self.add_weight(
                    name=t.name, shape=(t.vocabulary_size, t.dim), initializer=t.initializer, trainable=True
                )

    def call(self, features):
        out = {}
        for name, f in self.fc.items():
            x = features[name]
            seq = f.max_sequence_length if isinstance(x, tf.RaggedTensor) else 0
            fi = embedding_ops.normalize_feature(x, max_sequence_length=seq)
            dense = not isinstance(x, tf.RaggedTensor)
            out[name] = te_keras.plain_lookup(fi, dense, self.tables[f.table.name], f.table.dim, f.table.combiner)
        return out

    def compute_output_spec(self, features):
        return activation_specs(features, self.fc)


def build_model(embedding_layer: keras.layers.Layer) -> keras.Model:
    """DLRM: bottom MLP on dense features, pairwise dot-product interactions, top MLP."""
    inputs = {
        "user": keras.Input(shape=(), dtype="int64", name="user"),
        "item": keras.Input(shape=(), dtype="int64", name="item"),
        "category": keras.Input(shape=(), dtype="int64", name="category"),
        "device": keras.Input(shape=(), dtype="int64", name="device"),
        "tags": keras.Input(shape=(None,), dtype="int64", ragged=True, name="tags"),
        "history": keras.Input(shape=(None,), dtype="int64", ragged=True, name="history"),
        "numeric": keras.Input(shape=(2,), dtype="float32", name="numeric"),
    }
    acts = embedding_layer({k: v for k, v in inputs.items() if k != "numeric"})
    bottom = keras.layers.Dense(DIM, activation="relu")(keras.layers.Dense(16, activation="relu")(inputs["numeric"]))
    hist = acts["history"]  # [B, L, DIM]; empty positions are zero vectors
    present = keras.ops.cast(keras.ops.any(keras.ops.not_equal(hist, 0.0), axis=-1, keepdims=True), "float32")
    hist_mean = keras.ops.sum(hist, axis=1) / keras.ops.maximum(keras.ops.sum(present, axis=1), 1.0)
    vectors = [bottom, acts["user"], acts["item"], acts["category"], acts["tags"], acts["device"], hist_mean]
    stacked = keras.ops.stack(vectors, axis=1)  # [B, F, DIM]
    dots = keras.ops.matmul(stacked, keras.ops.transpose(stacked, (0, 2, 1)))
    rows, cols = np.triu_indices(len(vectors), k=1)
    flat = keras.ops.reshape(dots, (-1, len(vectors) * len(vectors)))
    pairs = keras.ops.take(flat, rows * len(vectors) + cols, axis=1)
    top = keras.layers.Concatenate()([bottom, pairs])
    top = keras.layers.Dense(32, activation="relu")(top)
    out = keras.layers.Dense(1, activation="sigmoid")(top)
    return keras.Model(inputs, out)


def dataset(features: dict, labels: np.ndarray, batch: int, shuffle: bool) -> tf.data.Dataset:
    ds = tf.data.Dataset.from_tensor_slices((features, labels))
    if shuffle:
        ds = ds.shuffle(len(labels), seed=0)
    return ds.batch(batch).prefetch(2)


def run(args: argparse.Namespace) -> dict:
    keras.utils.set_random_seed(0)
    n_train, n_test, epochs = (2000, 500, 1) if args.smoke else (args.train_size, args.test_size, args.epochs)
    train_x, train_y = make_data(n_train, seed=1)
    test_x, test_y = make_data(n_test, seed=2)
    train = dataset(train_x, train_y, args.batch_size, shuffle=True)
    train_eval = dataset(train_x, train_y, 2048, shuffle=False)
    test = dataset(test_x, test_y, 2048, shuffle=False)

    results = {}
    for label in ("tpu_embedding", "baseline"):
        storage = getattr(args, "storage_dtype", "float32") if label == "tpu_embedding" else "float32"
        fc, optimizer = feature_config_from_file(args.config) if args.config else feature_config(storage)
        if label == "tpu_embedding":
            layer = te_keras.TPUEmbedding(fc, optimizer, name="embedding")
            what = (
                "tables: TPU optimizers ("
                + ", ".join(f"{t.name}={type(t.optimizer).__name__}" for t in layer.embedding_tables)
                + "), rest: Keras Adam"
            )
        else:
            layer = KerasOptimizerEmbedding(fc, name="embedding")
            what = "tables and rest: Keras Adam"
        model = build_model(layer)
        model.compile(
            optimizer=keras.optimizers.Adam(args.learning_rate),
            loss="binary_crossentropy",
            metrics=[keras.metrics.AUC(name="auc")],
        )
        print(f"\n== {label}: {what}")
        start = time.perf_counter()
        # The dataset shuffles itself (seeded); Keras' own `shuffle` only warns for datasets.  One line per epoch
        # (verbose=2): the per-step bar extrapolates its ETA from the first step, which includes tracing and reads
        # as many minutes for a run of seconds.
        model.fit(train, epochs=epochs, shuffle=False, verbose=2 if not args.quiet else 0)
        seconds = time.perf_counter() - start
        train_auc = model.evaluate(train_eval, verbose=0, return_dict=True)["auc"]
        test_auc = model.evaluate(test, verbose=0, return_dict=True)["auc"]
        results[label] = {"train_auc": train_auc, "test_auc": test_auc, "fit_seconds": seconds}

    print("\n" + summary(results, n_train, n_test))
    return results


def summary(results: dict, n_train: int, n_test: int) -> str:
    """What was compared, the AUC table, which model generalises better, and what was written (nothing)."""
    lines = [
        "Compared: the same DLRM model on the same synthetic impressions "
        f"({n_train} for training, {n_test} held out for the test AUC),",
        "  tpu_embedding: tables trained by their own TPU optimizers (tf_embed_ops' fused kernels),",
        "  baseline:      tables as ordinary weights trained by the model's Keras Adam.",
        "",
        "model            train AUC  test AUC  fit seconds",
    ]
    for label, r in results.items():
        lines.append(f"{label:<16} {r['train_auc']:9.4f} {r['test_auc']:9.4f} {r['fit_seconds']:12.1f}")
    (best, b), (other, o) = sorted(results.items(), key=lambda item: -item[1]["test_auc"])
    if b["test_auc"] == o["test_auc"]:
        lines.append(f"\nBoth models reach the same test AUC ({b['test_auc']:.4f}).")
    else:
        lines.append(
            f"\n{best} generalises better: test AUC {b['test_auc']:.4f} vs {o['test_auc']:.4f} for {other} "
            f"({b['test_auc'] - o['test_auc']:+.4f})."
        )
    lines.append("Nothing was written to disk (`--write-config PATH` writes the configuration).")
    return "\n".join(lines)


def write_config(path: str, batch_size: int) -> None:
    fc, optimizer = feature_config()
    shapes = {k: [batch_size, f.max_sequence_length] if f.max_sequence_length else [batch_size] for k, f in fc.items()}
    proto = te_config.from_feature_config(fc, optimizer, output_shapes=shapes)
    from google.protobuf import text_format

    with open(path, "w", encoding="utf-8") as f:
        f.write(text_format.MessageToString(proto))
    print(f"wrote {path}")


def build_parser() -> argparse.ArgumentParser:
    """The example's command line (shared with `ctr_serving.py`, which trains the same model)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data, one epoch (seconds)")
    parser.add_argument("--config", help="train from this TPUEmbeddingConfiguration (.pbtxt or .pb)")
    parser.add_argument("--write-config", metavar="PATH", help="write the example's configuration and exit")
    parser.add_argument("--train-size", type=int, default=40000)
    parser.add_argument("--test-size", type=int, default=10000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=0.003)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--storage-dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="storage dtype of the tables and slots (te.TableConfig); not with --dynamic (dynamic tables are float32)",
    )
    parser.add_argument("--dynamic", action="store_true", help="raw 64-bit and string ids in dynamic tables")
    parser.add_argument(
        "--collective",
        action="store_true",
        help="run on every worker of `python -m tf_embed_ops.distribute.launch --workers N --collective -- ...`",
    )
    ctr_dynamic.add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.dynamic and args.storage_dtype != "float32":
        parser.error(f"--storage-dtype {args.storage_dtype}: dynamic tables are stored in float32 only")
    if args.collective and (args.dynamic or args.config or args.write_config or args.storage_dtype != "float32"):
        parser.error(
            "--collective trains the example's float32 static tables: without --dynamic, --config, "
            "--write-config and --storage-dtype"
        )
    if args.dynamic:
        ctr_dynamic.run(args)
        return 0
    if args.collective:
        from tf_embed_ops.examples import ctr_collective

        ctr_collective.run(args, make_data, feature_config, build_model)
        return 0
    if args.write_config:
        write_config(args.write_config, args.batch_size)
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
