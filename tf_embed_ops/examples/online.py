"""Online training reaching serving in seconds: `python -m tf_embed_ops.examples.online [--smoke]`.

A stream of synthetic click days: item popularity drifts from day to day (yesterday's hits fade, a new slice of the
catalogue appears every day under new ids), and each item's appeal to each user segment drifts too. A trainer fits
a small CTR model (a static `user` table, a dynamic `item` table whose rows are created for new ids and evicted
after a while unseen) and publishes a delta every `--publish-every` steps with `te.serving.Publisher`. A separate
serving process, plain TensorFlow that never imports `tf_embed_ops`, loads the first full version, applies each
delta as it is published and keeps a second copy frozen at the end of day 1.

Printed: per delta, its bytes, rows and the publish-to-servable latency (from the start of the publish to the
serving process having applied it); per day, the AUC on that day's held-out clicks of the fresh servable and of
the day-1 servable.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

import tf_embed_ops as te
from tf_embed_ops.examples.json_lines_child import WITHOUT_TF_EMBED_OPS, JsonLinesChild

emb = tf.tpu.experimental.embedding

# The serving process. It blocks any import of tf_embed_ops, then reads one JSON command per line on stdin and
# answers one JSON line on stdout.
SERVER = (
    WITHOUT_TF_EMBED_OPS
    + r"""
import json, os, sys, time
import numpy as np
import tensorflow as tf

def auc(labels, scores):
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores)); ranks[order] = np.arange(1, len(scores) + 1)
    pos = labels == 1
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / max(n_pos * n_neg, 1))

directory = sys.argv[1]
models, versions = {}, {}
for line in sys.stdin:
    cmd = json.loads(line)
    out = {}
    if cmd["op"] == "load":
        models[cmd["as"]] = tf.saved_model.load(os.path.join(directory, cmd["path"]))
        versions[cmd["as"]] = int(models[cmd["as"]].signatures["served_version"]()["version"])
        out = {"version": versions[cmd["as"]]}
    elif cmd["op"] == "sync":  # apply every delta the manifest lists after the served version
        with open(os.path.join(directory, "MANIFEST.json")) as f:
            chain = json.load(f)["chain"]
        applied = []
        for entry in chain:
            if entry["version"] <= versions["fresh"]:
                continue
            if entry["kind"] == "full":  # a new full version: load it (its deltas follow)
                models["fresh"] = tf.saved_model.load(os.path.join(directory, entry["path"]))
            else:
                path = tf.constant(os.path.join(directory, entry["path"]))
                models["fresh"].signatures["apply_delta"](path=path)
            versions["fresh"] = entry["version"]
            applied.append({"version": entry["version"], "at": time.time()})
        out = {"applied": applied}
    elif cmd["op"] == "auc":
        data = np.load(cmd["path"])
        feed = {k: tf.constant(data[k]) for k in ("user", "item")}
        out = {name: auc(data["label"], m.signatures["serving_default"](**feed)["output_0"].numpy().ravel())
               for name, m in models.items()}
    elif cmd["op"] == "quit":
        break
    print(json.dumps(out), flush=True)
assert not any(m.split(".")[0] == "tf_embed_ops" for m in sys.modules)
"""
)


class World:
    """The planted structure: user segments, item appeal per segment drifting by day, popularity by item age."""

    def __init__(self, args: argparse.Namespace):
        rng = np.random.default_rng(args.seed)
        self.args = args
        self.segments = 8
        self.user_segment = rng.integers(self.segments, size=args.users)
        total_items = args.items_per_day * (args.days + 1)
        # Two appeal profiles per item; the mix moves from the first to the second over the days (drift).
        self.appeal_start = rng.normal(size=(total_items, self.segments)) * 1.5
        self.appeal_end = rng.normal(size=(total_items, self.segments)) * 1.5
        self.bias_start, self.bias_end = rng.normal(size=total_items) * 1.5, rng.normal(size=total_items) * 1.5
        self.rng = rng

    def day(self, day: int, n: int) -> dict:
        """n impressions of `day` (0-based): items of the last three catalogue slices, the newest most popular."""
        args, rng = self.args, self.rng
        user = rng.integers(args.users, size=n)
        age = np.minimum(rng.geometric(0.55, size=n) - 1, min(day, 2))  # 0 = today's new slice
        item = (day - age) * args.items_per_day + np.minimum(rng.zipf(1.3, size=n) - 1, args.items_per_day - 1).astype(
            np.int64
        )
        mix = day / max(args.days - 1, 1)
        appeal = (1 - mix) * self.appeal_start[item, self.user_segment[user]] + mix * self.appeal_end[
            item, self.user_segment[user]
        ]
        appeal = appeal + (1 - mix) * self.bias_start[item] + mix * self.bias_end[item]
        label = (rng.random(n) < 1 / (1 + np.exp(-(appeal - 1.0)))).astype(np.float32)
        return {"user": user.astype(np.int64), "item": item.astype(np.int64) * 7919 + 17, "label": label}


def build_model(args: argparse.Namespace) -> tuple:
    user = te.TableConfig(args.users, args.dim, name="user", optimizer=te.optimizers.Adagrad(0.3))
    item = te.DynamicTableConfig(
        "item", args.dim, optimizer=te.optimizers.Adagrad(0.3), eviction=te.dynamic.TTL(args.item_ttl)
    )
    layer = te.keras.TPUEmbedding({"user": emb.FeatureConfig(user), "item": emb.FeatureConfig(item)})
    inputs = {
        "user": keras.Input(shape=(), dtype="int64", name="user"),
        "item": keras.Input(shape=(), dtype="int64", name="item"),
    }
    acts = layer(inputs)
    x = keras.layers.Multiply()([acts["user"], acts["item"]])
    x = keras.layers.Concatenate()([x, acts["user"], acts["item"]])
    out = keras.layers.Dense(1, name="logit")(x)
    model = keras.Model(inputs, out)
    model.compile(keras.optimizers.Adam(0.02), keras.losses.BinaryCrossentropy(from_logits=True))
    signature = {"user": tf.TensorSpec([None], tf.int64), "item": tf.TensorSpec([None], tf.int64)}
    return model, signature


class Server(JsonLinesChild):
    """The serving process (see SERVER)."""

    def __init__(self, directory: str):
        super().__init__(SERVER, directory)


def run(args: argparse.Namespace) -> dict:
    """Runs the stream; returns {"deltas": [...], "days": [...]} (what it prints)."""
    directory = args.dir or tempfile.mkdtemp(prefix="online_")
    world = World(args)
    model, signature = build_model(args)
    pub = te.serving.Publisher(model, directory, input_signature=signature, dense_every=args.dense_every)
    server = Server(directory)
    deltas, days = [], []
    say = (lambda *a: None) if args.quiet else print
    try:
        first = pub.publish_full()
        server.ask(op="load", path=str(first), **{"as": "fresh"})
        step = 0
        for day in range(args.days):
            train = world.day(day, args.steps_per_day * args.batch_size)
            held_out = world.day(day, args.eval_size)
            for s in range(args.steps_per_day):
                sl = slice(s * args.batch_size, (s + 1) * args.batch_size)
                model.train_on_batch({"user": train["user"][sl], "item": train["item"][sl]}, train["label"][sl])
                step += 1
                if step % args.publish_every == 0:
                    started = time.time()
                    version = pub.publish_delta()
                    published = time.time()
                    applied = server.ask(op="sync")["applied"]
                    entry = [e for e in pub_chain(directory) if e["version"] == version][0]
                    record = {
                        "version": version,
                        "kind": entry["kind"],
                        "bytes": entry.get("bytes", 0),
                        "rows": sum(entry.get("rows", {}).values()),
                        "evicted": sum(entry.get("evicted", {}).values()),
                        "dense": entry.get("dense", True),
                        "publish_s": published - started,
                        "to_servable_s": applied[-1]["at"] - started if applied else float("nan"),
                    }
                    deltas.append(record)
                    say(
                        f"day {day + 1} step {step:4d}: version {version} ({record['kind']}) "
                        f"{record['bytes'] / 1024:8.1f} KiB, {record['rows']:6d} rows, {record['evicted']:5d} evicted, "
                        f"publish {record['publish_s']:.2f} s, publish-to-servable {record['to_servable_s']:.2f} s"
                    )
            if day == 0:  # the servable left at day 1: the current version, never updated again
                server.ask(op="load", path=str(pub.publish_full()), **{"as": "day1"})
                server.ask(op="sync")
            path = os.path.join(directory, f"heldout-{day}.npz")
            np.savez(path, **held_out)
            aucs = server.ask(op="auc", path=path)
            days.append({"day": day + 1, **aucs})
            say(f"day {day + 1}: AUC fresh servable {aucs['fresh']:.4f}, day-1 servable {aucs['day1']:.4f}")
    finally:
        server.close()
    latencies = np.array([d["to_servable_s"] for d in deltas if d["kind"] == "delta"])
    if latencies.size:
        say(
            f"{latencies.size} deltas, publish-to-servable median {np.median(latencies):.2f} s, "
            f"max {latencies.max():.2f} s; files in {directory}"
        )
    return {"deltas": deltas, "days": days, "directory": directory}


def pub_chain(directory: str) -> list:
    return te.serving.read_manifest(directory)["chain"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true", help="a small, fast run (CI)")
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--steps-per-day", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--publish-every", type=int, default=10, help="steps between two deltas")
    parser.add_argument("--dense-every", type=int, default=3, help="deltas between two dense-weight refreshes")
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--items-per-day", type=int, default=3000)
    parser.add_argument("--item-ttl", type=int, default=150, help="steps an item row lives unseen")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--eval-size", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", default=None, help="the publish directory (default: a new temporary one)")
    parser.add_argument("--quiet", action="store_true")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tf_embed_ops.examples.online", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.days, args.steps_per_day, args.batch_size = 3, 20, 256
        args.users, args.items_per_day, args.eval_size, args.item_ttl = 1000, 600, 4000, 30
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
