"""The CTR example on open-world ids: `python -m tf_embed_ops.examples.ctr --dynamic [--smoke]`.

Users arrive as raw 64-bit ids and items as strings, never as row numbers; every simulated day brings new users
(the population grows) and a new slice of the item catalogue (old items stop being shown). Both live in dynamic
tables (docs/dynamic_tables.md):

- `user`: int64 keys, a row only after a user has been seen twice (`FrequencyAdmission(2)`: one-off visitors
  cost no memory; `--bloom`: `BloomAdmission(2, ...)`, a counting Bloom filter of fixed size), LRU eviction down
  to `--max-users` rows at every step;
- `item`: string keys, fingerprinted inside the op, evicted after `--item-ttl` steps unseen (`TTL`);

next to two static tables (`category`, `device`). Each day the model is first evaluated on the day's impressions
(progressive validation: AUC on data it has not trained on), then trained on them for one pass; the run prints,
per day, each dynamic table's size and that day's inserts, keys refused admission, keys refused for space and
evictions, and the AUC. It writes no files.
"""

from __future__ import annotations

import argparse
import time

import keras
import numpy as np
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops import keras as te_keras

emb = tf.tpu.experimental.embedding

DIM = 8
CATEGORIES = 30
DEVICES = 4
_MASK64 = (1 << 64) - 1


def raw_user_id(index: np.ndarray) -> np.ndarray:
    """The 64-bit id a user is known by: an odd-multiplier scramble of their index (a bijection on 64 bits), so
    ids look like production ids (spread over the whole int64 range, negative ones included)."""
    scrambled = (index.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x632BE59BD9B4E019)) & np.uint64(
        _MASK64
    )
    return scrambled.view(np.int64)


def item_name(index: np.ndarray) -> np.ndarray:
    return np.array([f"item-{i:07x}" for i in index], dtype=object)


class World:
    """The planted structure: user and item factors; item categories; category and device biases."""

    def __init__(self, max_users: int, max_items: int):
        rng = np.random.default_rng(4321)
        cat_dir = rng.normal(size=(CATEGORIES, 4))
        self.item_cat = rng.integers(CATEGORIES, size=max_items)
        item_vec = cat_dir[self.item_cat] + 0.5 * rng.normal(size=(max_items, 4))
        self.item_vec = item_vec / np.linalg.norm(item_vec, axis=1, keepdims=True)
        user_vec = rng.normal(size=(max_users, 4))
        self.user_vec = user_vec / np.linalg.norm(user_vec, axis=1, keepdims=True)
        self.cat_bias = rng.normal(scale=0.7, size=CATEGORIES)
        self.device_bias = np.array([0.4, -0.3, 0.0, -0.6])


def make_day(world: World, day: int, n: int, users_per_day: int, items_per_day: int, item_window: int):
    """Day `day`'s n impressions. Users 0..(day+1)*users_per_day exist, the newest most active (half the traffic
    comes from the day's new users, many seen once); items of the last `item_window` days' slices are shown.

    logit = 2.5 u.v + cat_bias[c] + device_bias[d] - 0.5; labels ~ Bernoulli(sigmoid(logit)).
    """
    rng = np.random.default_rng(1000 + day)
    known = (day + 1) * users_per_day
    fresh = rng.integers(day * users_per_day, known, size=n)
    returning = rng.integers(0, known, size=n)
    users = np.where(rng.uniform(size=n) < 0.5, fresh, returning)
    first_item = max(0, day - item_window + 1) * items_per_day
    items = rng.integers(first_item, (day + 1) * items_per_day, size=n)
    devices = rng.integers(DEVICES, size=n)
    cats = world.item_cat[items]
    logit = 2.5 * np.einsum("nd,nd->n", world.user_vec[users], world.item_vec[items])
    logit += world.cat_bias[cats] + world.device_bias[devices] - 0.5
    labels = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    features = {
        "user": raw_user_id(users),
        "item": item_name(items),
        "category": cats.astype(np.int64),
        "device": devices.astype(np.int64),
    }
    return features, labels


def _dynamic_table(name: str, **options) -> te.DynamicTableConfig:
    """A dynamic table of the example: Adagrad, sum combiner, normal initial rows; `options` as `DynamicTableConfig`."""
    return te.DynamicTableConfig(
        name,
        DIM,
        optimizer=te.optimizers.Adagrad(0.05),
        combiner="sum",
        initializer=keras.initializers.RandomNormal(0.0, 0.05),
        **options,
    )


def feature_config(args: argparse.Namespace) -> dict:
    user = _dynamic_table(
        "user",
        key_dtype=tf.int64,
        max_rows=2 * args.max_users,  # headroom within a step; LRU trims to max_users at its end
        admission=te.dynamic.BloomAdmission(2, num_counters=args.bloom_counters, num_hashes=3, counter_bits=4)
        if getattr(args, "bloom", False)
        else te.dynamic.FrequencyAdmission(2, max_pending_keys=4 * args.max_users),
        eviction=te.dynamic.LRU(args.max_users),
        seed=1,
    )
    item = _dynamic_table("item", key_dtype=tf.string, eviction=te.dynamic.TTL(args.item_ttl), seed=2)
    category = emb.TableConfig(CATEGORIES, DIM, name="category", combiner="sum", optimizer=emb.Adam(0.003))
    device = emb.TableConfig(DEVICES, DIM, name="device", combiner="sum", optimizer=emb.FTRL(0.05))
    return {
        "category": emb.FeatureConfig(category, name="category"),
        "device": emb.FeatureConfig(device, name="device"),
        "item": emb.FeatureConfig(item, name="item"),
        "user": emb.FeatureConfig(user, name="user"),
    }


def build_model(layer: keras.layers.Layer) -> keras.Model:
    dtypes = {"user": "int64", "item": "string", "category": "int64", "device": "int64"}
    inputs = {name: keras.Input(shape=(), dtype=dtype, name=name) for name, dtype in dtypes.items()}
    acts = layer(inputs)
    match = keras.ops.sum(acts["user"] * acts["item"], axis=-1, keepdims=True)
    top = keras.layers.Concatenate()([match, acts["user"], acts["item"], acts["category"], acts["device"]])
    top = keras.layers.Dense(16, activation="relu")(top)
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(top))


def _dataset(features: dict, labels: np.ndarray, batch: int, shuffle: bool) -> tf.data.Dataset:
    ds = tf.data.Dataset.from_tensor_slices((features, labels))
    if shuffle:
        ds = ds.shuffle(len(labels), seed=0)
    return ds.batch(batch)


def _totals(layer) -> dict:
    return {
        config.name: {k: int(v) for k, v in table.stats().items()} for config, table in layer.dynamic_tables.items()
    }


def run(args: argparse.Namespace) -> list[dict]:
    """Trains day by day; returns one record per day (table statistics and AUC), as printed."""
    keras.utils.set_random_seed(0)
    days, per_day = (2, 1500) if args.smoke else (args.days, args.impressions_per_day)
    users_per_day, items_per_day = (300, 200) if args.smoke else (args.users_per_day, args.items_per_day)
    world = World(days * users_per_day, days * items_per_day)
    layer = te_keras.TPUEmbedding(feature_config(args), name="embedding")
    model = build_model(layer)
    model.compile(
        keras.optimizers.Adam(args.learning_rate), "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")]
    )
    print(
        "== dynamic tables: user (int64 ids, admitted after 2 sightings, LRU to "
        f"{args.max_users} rows), item (string ids, TTL {args.item_ttl} steps); static: category, device"
    )
    header = f"{'day':>3} {'table':<5} {'size':>7} {'inserts':>8} {'refused':>8} {'full':>6} {'evicted':>8}"
    print(header + "   AUC before training on the day")
    records = []
    before = _totals(layer)
    start = time.perf_counter()
    for day in range(days):
        x, y = make_day(world, day, per_day, users_per_day, items_per_day, args.item_window)
        # Progressive validation: score the day before training on it (lookups with training=False insert nothing).
        auc = model.evaluate(_dataset(x, y, 2048, False), verbose=0, return_dict=True)["auc"] if day else float("nan")
        model.fit(_dataset(x, y, args.batch_size, True), epochs=1, shuffle=False, verbose=0)
        after = _totals(layer)
        record = {"day": day, "auc": auc, "tables": {}}
        for name in ("user", "item"):
            now, then = after[name], before[name]
            delta = {
                "size": now["size"],
                "inserts": now["inserts"] - then["inserts"],
                "refused": now["refused"] - then["refused"],
                "refused_full": now["refused_full"] - then["refused_full"],
                "evictions": now["evictions"] - then["evictions"],
            }
            record["tables"][name] = delta
            auc_text = ("   -" if day == 0 else f"   {auc:.4f}") if name == "user" else ""
            print(
                f"{day:>3} {name:<5} {delta['size']:>7} {delta['inserts']:>8} {delta['refused']:>8} "
                f"{delta['refused_full']:>6} {delta['evictions']:>8}{auc_text}"
            )
        before = after
        records.append(record)
    print(
        f"\n{days} days in {time.perf_counter() - start:.1f} s. 'refused': keys seen that did not reach admission "
        "(per batch); 'full': admitted keys refused because the table was at max_rows. Nothing was written to disk."
    )
    return records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--dynamic")
    group.add_argument("--days", type=int, default=6)
    group.add_argument("--impressions-per-day", type=int, default=12000)
    group.add_argument("--users-per-day", type=int, default=2500)
    group.add_argument("--items-per-day", type=int, default=800)
    group.add_argument("--item-window", type=int, default=2, help="days an item slice is shown")
    group.add_argument("--max-users", type=int, default=4000, help="the user table's max_rows and LRU target")
    group.add_argument("--item-ttl", type=int, default=60, help="steps an item row lives unseen")
    group.add_argument(
        "--bloom",
        action="store_true",
        help="admit users through a counting Bloom filter (te.dynamic.BloomAdmission) instead of exact counts",
    )
    group.add_argument("--bloom-counters", type=int, default=1 << 18, help="the Bloom filter's counters (4 bits)")
