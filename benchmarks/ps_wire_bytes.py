"""Bytes on the wire per worker per step of the parameter-server path (`ShardedTPUEmbedding`): measured, and by formula.

What crosses the network in a step is what each server's two ops receive from the worker and return to it: the
forward op (`embedding_ops.embedding_activations`) and the fused update (`embedding_ops.send_tpu_embedding_gradients`)
run on the server that holds the shards; everything else runs on the worker. `WireCounter` wraps those two
functions and adds up, per server and step, the bytes of every tensor a call receives (ids, sample coordinates,
weights, sample shapes, gradients, learning rates) and returns (activations or rows), each distinct tensor once per
server (a `tf.function` sends a tensor once to each device that reads it). Table and slot handles are not data.
The counter runs the step eagerly with the shards on this machine (`num_shards=N`): the calls, and so the bytes,
are those of a cluster with N servers.

The formulas (per worker and step; for a feature f of table t over N_t shards: n_f ids, S_f output samples,
rank r_f of its sample shape, D_t the table's dim; U_t the step's distinct ids of table t):

    full partials (the previous protocol):  sum_f [ n_f * (12 + 8 * (r_f + 1)) + N_t * (8 * r_f + 2 * 4 * S_f * D_t) ]
    compact rows (today):                   sum_t [ U_t * (8 + 2 * 4 * D_t) + 16 * N_t ]

(ids 8 bytes, weights and floats 4, one int64 coordinate per sample dimension plus the reduced column; a compact
call's sample shape is one int64, sent once with the forward and once with the update).

Tables need no real size here: bytes depend on the ids only through how many there are and how many are
distinct, so each table's ids are renumbered to 0..U_t-1 in their order (DIV shards then split the distinct ids
evenly, the ids' own vocabulary split them by range; the totals are the same).

Usage: python -m benchmarks.ps_wire_bytes [--smoke] [--servers 2 4] [--out FILE]
(also `python -m benchmarks --only ps_wire_bytes`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import numpy as np
import tensorflow as tf

from benchmarks import workloads as wls
from tf_embed_ops import embedding_ops

emb_api = tf.tpu.experimental.embedding


def tensor_bytes(x) -> int:
    """Bytes of a tensor's data (0 for None)."""
    if x is None:
        return 0
    t = tf.convert_to_tensor(x)
    return int(t.shape.num_elements()) * t.dtype.size


class WireCounter:
    """Adds up the bytes each server's ops receive and return while it is active (`with counter.counting():`).

    `requests[server]` and `responses[server]` are bytes; a server is identified by the table shards it runs on.
    """

    def __init__(self):
        self.requests: dict = {}
        self.responses: dict = {}
        self._seen: dict = {}

    def _receive(self, server, tensors) -> None:
        seen = self._seen.setdefault(server, {})
        for t in tensors:
            if t is None or id(t) in seen:
                continue
            seen[id(t)] = t  # kept alive, so its id is not reused during the step
            self.requests[server] = self.requests.get(server, 0) + tensor_bytes(t)

    @staticmethod
    def _server(tables) -> tuple:
        return tuple(id(v) for v in tables)

    @staticmethod
    def _feature_tensors(features) -> list:
        return [x for f in features for x in f]

    @contextlib.contextmanager
    def counting(self):
        forward, update = embedding_ops.embedding_activations, embedding_ops.send_tpu_embedding_gradients

        def counted_forward(features, tables, config, combiners=None, name=None):
            server = self._server(tables)
            self._receive(server, self._feature_tensors(features))
            outputs = forward(features, tables, config, combiners=combiners, name=name)
            self.responses[server] = self.responses.get(server, 0) + sum(tensor_bytes(o) for o in outputs)
            return outputs

        def counted_update(gradients, learning_rates, features, tables, *args, **kwargs):
            self._receive(self._server(tables), list(gradients) + list(learning_rates))
            self._receive(self._server(tables), self._feature_tensors(features))
            return update(gradients, learning_rates, features, tables, *args, **kwargs)

        embedding_ops.embedding_activations = counted_forward
        embedding_ops.send_tpu_embedding_gradients = counted_update
        try:
            yield self
        finally:
            embedding_ops.embedding_activations, embedding_ops.send_tpu_embedding_gradients = forward, update
            self._seen = {}

    def total(self) -> int:
        return sum(self.requests.values()) + sum(self.responses.values())


def renumbered(workload: wls.Workload) -> tuple[list, list]:
    """Per table its vocabulary (its distinct ids), and per feature its ids renumbered to 0..U_t-1 in order."""
    vocab, ids = [], []
    for t in range(len(workload.tables)):
        distinct = np.unique(np.concatenate([f.ids for f in workload.features if f.table == t]))
        vocab.append(max(int(distinct.shape[0]), 1))
        for f in workload.features:
            if f.table == t:
                ids.append((f, np.searchsorted(distinct, f.ids).astype(np.int64)))
    order = {id(f): i for i, f in enumerate(workload.features)}
    ids.sort(key=lambda pair: order[id(pair[0])])
    return vocab, [i for _, i in ids]


def _feature_input(feature: wls.Feature, ids: np.ndarray):
    if feature.row_splits is None:
        return tf.constant(ids)
    return tf.RaggedTensor.from_row_splits(tf.constant(ids), tf.constant(feature.row_splits))


def measure(workload: wls.Workload, num_servers: int, repeat: int = 1) -> dict:
    """Bytes per server and in all of one training step of `workload` over `num_servers` servers.

    Args:
      workload: the step's tables and ids.
      num_servers: shards per table (at most its distinct ids).
      repeat: the batch repeated `repeat` times (same distinct ids, `repeat` x the ids and samples).

    Returns:
      {"requests", "responses", "total", "per_server"}: bytes.
    """
    from tf_embed_ops.distribute import ShardedTPUEmbedding  # pylint: disable=import-outside-toplevel

    vocab, ids = renumbered(workload)
    tables = [
        emb_api.TableConfig(v, t.dim, name=t.name, combiner=workload.combiner, initializer=tf.zeros_initializer())
        for v, t in zip(vocab, workload.tables, strict=True)
    ]
    config = {f.name: emb_api.FeatureConfig(tables[f.table], name=f.name) for f in workload.features}
    features = {}
    for f, f_ids in zip(workload.features, ids, strict=True):
        if f.row_splits is None:
            f_ids = np.tile(f_ids, repeat)
        else:
            bag = f.ids.shape[0] // f.batch
            f_ids = np.tile(f_ids, repeat)
            f = wls.Feature(f.name, f.table, f_ids, np.arange(0, f_ids.shape[0] + 1, bag, dtype=np.int64))
        features[f.name] = _feature_input(f, f_ids)
    emb = ShardedTPUEmbedding(config, emb_api.SGD(0.01), num_shards=num_servers)
    emb.build(per_replica_batch_size=workload.batch * repeat)
    counter = WireCounter()
    with counter.counting():
        emb.enqueue(features)
        acts = emb.dequeue()
        emb.apply_gradients(tf.nest.map_structure(tf.ones_like, acts))
    per_server = [counter.requests.get(s, 0) + counter.responses.get(s, 0) for s in counter.requests]
    return {
        "requests": sum(counter.requests.values()),
        "responses": sum(counter.responses.values()),
        "total": counter.total(),
        "per_server": per_server,
    }


def formula(workload: wls.Workload, num_servers: int, protocol: str, repeat: int = 1) -> int:
    """Bytes per worker per step by the module's formulas ("full" = previous protocol, "compact" = today's)."""
    distinct = workload.unique_rows()
    shards = [min(num_servers, max(u, 1)) for u in distinct]
    if protocol == "compact":
        return sum(u * (8 + 2 * 4 * t.dim) + 16 * n for u, t, n in zip(distinct, workload.tables, shards, strict=True))
    if protocol != "full":
        raise ValueError(f"Argument `protocol` must be 'full' or 'compact'; got {protocol!r}.")
    total = 0
    for f in workload.features:
        n, samples, rank = f.ids.shape[0] * repeat, f.batch * repeat, 1
        dim = workload.tables[f.table].dim
        total += n * (12 + 8 * (rank + 1)) + shards[f.table] * (8 * rank + 2 * 4 * samples * dim)
    return total


def _workloads(smoke: bool) -> list:
    return [wls.w1(smoke), wls.w4(smoke)]


def run(opts, log, servers=(2, 4)) -> dict:
    """The suite's section: measured and formula bytes for W1 and W4, and the doubled batch."""
    rows = []
    for wl in _workloads(opts.smoke):
        for n in servers:
            t0 = time.time()
            got = measure(wl, n)
            doubled = measure(wl, n, repeat=2)
            rows.append(
                {
                    "workload": wl.name,
                    "servers": n,
                    "batch": wl.batch,
                    "ids": wl.num_ids,
                    "distinct_ids": sum(wl.unique_rows()),
                    "measured_bytes": got["total"],
                    "measured_request_bytes": got["requests"],
                    "measured_response_bytes": got["responses"],
                    "measured_bytes_doubled_batch": doubled["total"],
                    "formula_compact_bytes": formula(wl, n, "compact"),
                    "formula_full_bytes": formula(wl, n, "full"),
                    "formula_full_bytes_doubled_batch": formula(wl, n, "full", repeat=2),
                }
            )
            log(f"ps_wire_bytes {wl.name} x{n}: {got['total']:,} bytes measured ({time.time() - t0:.0f} s)")
    return {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "rows": rows}


def _table(rows: list) -> str:
    lines = [
        "| workload | servers | measured bytes/step | formula (compact) | formula (full partials) "
        "| doubled batch, measured |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['servers']} | {r['measured_bytes']:,} | {r['formula_compact_bytes']:,} | "
            f"{r['formula_full_bytes']:,} | {r['measured_bytes_doubled_batch']:,} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="the workloads' smoke sizes")
    p.add_argument("--servers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--out", default=None, help="write the JSON here")
    args = p.parse_args(argv)

    class _Opts:
        smoke = args.smoke

    result = run(_Opts, lambda m: print(m, file=sys.stderr), tuple(args.servers))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    print(_table(result["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
