"""The feature lifecycle of dynamic tables in the suite (``--only lifecycle``; docs/dynamic_lifecycle.md).

* **Eviction sweep**: rows per second of one eviction round of each policy over a table of N rows, single thread
  (the round runs under the table's lock, serially), for rounds that evict nothing (the pure scan) and, for the
  capacity policies, rounds that select victims; the bytes the round reads per row over its time, against the
  machine's streaming copy bandwidth from the bundled probe (``bandwidth.probe``).
* **Bloom admission**: a Zipf stream with a tail of one-off ids, through exact counting (`FrequencyAdmission`) and
  through `BloomAdmission` of several sizes and counter widths: the filter's fixed memory against the exact
  counters', false admissions (keys Bloom admits that exact counting does not: Bloom never undercounts, so exact
  is a subset) overall and among one-off ids, against the documented formula.
* **CTR**: the example's AUC on its last day with the user table's exact admission and with Bloom admission.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import tensorflow as tf

# The bytes one round reads per live row: the packed metadata (key, last step, count), plus the weights for
# L2Norm and the decayed state for DecayedLFU.
META_BYTES = 20


def _table(config):
    from tf_embed_ops.dynamic.table import DynamicTable

    return DynamicTable(config)


def _config(name, dim, rows, **kw):
    import tf_embed_ops as te

    return te.DynamicTableConfig(
        name, dim, optimizer=te.optimizers.SGD(0.1), max_rows=rows, initial_capacity=rows, combiner="sum", **kw
    )


def _fill(table, rows: int, dim: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    keys = np.sort(rng.choice(2**62, size=rows, replace=False).astype(np.int64))
    table.import_(
        keys,
        rng.standard_normal([rows, dim]).astype(np.float32),
        counts=rng.integers(1, 100, rows).astype(np.int64),
        last_steps=rng.integers(0, 1000, rows).astype(np.int64),
    )


def _time(fn, reps: int, prepare=None) -> float:
    """The best of `reps` timed calls of fn, after one warmup call (first touch of pages, kernel creation)."""
    times = []
    for _ in range(reps + 1):
        if prepare is not None:
            prepare()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times[1:])


def sweep(rows: int, dim: int, reps: int, log) -> list[dict]:
    import tf_embed_ops as te

    out = []
    cases = [
        ("TTL (scan, nothing evicted)", None, te.dynamic.TTL(10**9), META_BYTES),
        ("CountAndAge (scan, nothing evicted)", None, te.dynamic.CountAndAge(1, 10**9), META_BYTES),
        ("L2Norm (scan + norms, nothing evicted)", None, te.dynamic.L2Norm(0.0), META_BYTES + 4 * dim),
        ("LRU (score every row + select, evicts 1)", None, te.dynamic.LRU(rows), META_BYTES),
        ("DecayedLFU (decay round + select, evicts 1)", te.dynamic.DecayedLFU(rows, 0.9), None, META_BYTES + 8),
    ]
    for label, own, explicit, bytes_per_row in cases:
        table = _table(_config("sweep", dim, rows + 1, eviction=own))
        _fill(table, rows, dim)
        policy = explicit if explicit is not None else own
        capacity = isinstance(policy, te.dynamic.LRU | te.dynamic.DecayedLFU)
        fresh = iter(range(-(2**40), 0))

        def prepare(table=table, capacity=capacity, fresh=fresh):
            if capacity:  # one row over the target, so the round selects a victim among all rows
                _insert(table, [next(fresh)])

        seconds = _time(lambda table=table, policy=policy: table.evict(policy, step=1000), reps, prepare)
        n = rows
        rate = n / seconds
        rec = {
            "policy": label,
            "rows": n,
            "seconds": seconds,
            "rows_per_s": rate,
            "bytes_per_row": bytes_per_row,
            "read_gbs": rate * bytes_per_row / 1e9,
        }
        log(f"lifecycle sweep: {label}: {n} rows in {seconds * 1e3:.1f} ms = {rate / 1e6:.1f} M rows/s")
        out.append(rec)
        del table
    return out


def _insert(table, keys):
    from tf_embed_ops.dynamic import config as config_lib
    from tf_embed_ops.dynamic import ops as _ops
    from tf_embed_ops.embedding_ops import normalize_feature

    feature = tf.tpu.experimental.embedding.FeatureConfig(table=table.config, name="f")
    proto = config_lib.dynamic_config_proto([feature]).SerializeToString()
    ids = tf.constant(np.asarray(keys, np.int64))
    _ops.dynamic_embedding_activations([normalize_feature(ids)], [table.handle], 1000, proto, ["sum"], training=True)


def _zipf_stream(steps: int, batch: int, one_off_fraction: float, vocab: int, seed: int):
    """Batches of ids: Zipf(1.1) over `vocab` ids, and a fraction of ids never seen again."""
    rng = np.random.default_rng(seed)
    next_one_off = 1 << 40
    out = []
    for _ in range(steps):
        n_off = int(batch * one_off_fraction)
        zipf = (rng.zipf(1.1, batch - n_off) % vocab).astype(np.int64)
        one_off = np.arange(next_one_off, next_one_off + n_off, dtype=np.int64)
        next_one_off += n_off
        out.append(np.concatenate([zipf, one_off]))
    return out


def _admit(table, stream):
    from tf_embed_ops.dynamic import config as config_lib
    from tf_embed_ops.dynamic import ops as _ops
    from tf_embed_ops.embedding_ops import normalize_feature

    feature = tf.tpu.experimental.embedding.FeatureConfig(table=table.config, name="f")
    proto = config_lib.dynamic_config_proto([feature]).SerializeToString()
    for step, ids in enumerate(stream):
        _ops.dynamic_embedding_activations(
            [normalize_feature(tf.constant(ids))], [table.handle], step, proto, ["sum"], training=True
        )
    return set(table.export()["keys"].numpy().tolist())


def _formula(num_hashes: int, sightings: int, num_counters: int, min_count: int) -> float:
    """P(Poisson(lambda) >= min_count - 1) ** num_hashes, lambda = num_hashes * sightings / num_counters."""
    lam = num_hashes * sightings / num_counters
    below = sum(math.exp(-lam) * lam**i / math.factorial(i) for i in range(min_count - 1))
    return (1.0 - below) ** num_hashes


def bloom(smoke: bool, log) -> dict:
    import tf_embed_ops as te

    steps, batch = (8, 2048) if smoke else (40, 8192)
    min_count = 3
    stream = _zipf_stream(steps, batch, 0.5, 200_000, seed=7)
    sightings = sum(len(b) for b in stream)
    one_offs = {int(k) for b in stream for k in b if k >= 1 << 40}
    exact_cfg = _config("exact", 8, 1 << 22, admission=te.dynamic.FrequencyAdmission(min_count, 1 << 22))
    exact_table = _table(exact_cfg)
    exact = _admit(exact_table, stream)
    pending = int(exact_table.export()["pending_keys"].shape[0])
    rec = {
        "stream": {"steps": steps, "batch": batch, "sightings": sightings, "one_off_ids": len(one_offs)},
        "min_count": min_count,
        "exact": {
            "admitted": len(exact),
            "pending_counters": pending,
            "pending_bytes_estimate": pending * 48,  # unordered_map node (key, count, last step, next) + bucket
        },
        "bloom": [],
    }
    log(f"lifecycle bloom: exact admits {len(exact)} keys, holds {pending} pending counters (~{pending * 48} B)")
    for num_counters, bits in ((1 << 16, 4), (1 << 18, 4), (1 << 20, 4), (1 << 20, 8), (1 << 22, 4)):
        admission = te.dynamic.BloomAdmission(min_count, num_counters, num_hashes=3, counter_bits=bits)
        table = _table(_config("bloom", 8, 1 << 22, admission=admission))
        got = _admit(table, stream)
        missing = len(exact - got)  # must be 0: the estimate never undercounts
        false = got - exact
        false_one_off = len(false & one_offs)
        # Sightings of keys without a row feed the counters; approximately all sightings of non-admitted keys.
        predicted = _formula(3, sightings, num_counters, min_count)
        r = {
            "num_counters": num_counters,
            "counter_bits": bits,
            "memory_bytes": admission.memory_bytes,
            "admitted": len(got),
            "missing_vs_exact": missing,
            "false_admissions": len(false),
            "false_one_off_rate": false_one_off / max(1, len(one_offs)),
            "formula_one_off_rate": predicted,
        }
        log(
            f"lifecycle bloom: {num_counters} x {bits} bits ({admission.memory_bytes} B): admitted {len(got)}, "
            f"false {len(false)} (one-off rate {r['false_one_off_rate']:.2e}, formula {predicted:.2e}), "
            f"missing {missing}"
        )
        rec["bloom"].append(r)
    return rec


def ctr(smoke: bool, log) -> dict:
    from tf_embed_ops.examples import ctr_dynamic

    out = {}
    for mode in ("exact", "bloom"):
        parser = argparse.ArgumentParser()
        ctr_dynamic.add_arguments(parser)
        argv = ["--days", "2" if smoke else "4", "--impressions-per-day", "1500" if smoke else "8000"]
        if mode == "bloom":
            argv.append("--bloom")
        args = parser.parse_args(argv)
        args.smoke = False
        args.learning_rate, args.batch_size = 0.003, 256
        records = ctr_dynamic.run(args)
        out[mode] = {"last_day_auc": records[-1]["auc"], "user_table": records[-1]["tables"]["user"]}
        log(f"lifecycle ctr: {mode} admission: last-day AUC {records[-1]['auc']:.4f}")
    return out


def run(opts, log) -> dict:
    from benchmarks import bandwidth

    rows = 20_000 if opts.smoke else 4_000_000  # 80 MB of row metadata: more than the L3 cache
    result = {"rows": rows, "dim": 16, "threads": 1}
    try:
        probe = bandwidth.probe(1, mb=64 if opts.smoke else 512, reps=2, dims=(16,))
        result["stream_copy_gbs"] = probe.get("stream_copy_gbs")
    except Exception as e:
        result["stream_copy_gbs"] = None
        log(f"lifecycle: bandwidth probe failed ({e}); reporting rows/s only")
    result["sweep"] = sweep(rows, 16, 2 if opts.smoke else 5, log)
    if result["stream_copy_gbs"]:
        for r in result["sweep"]:
            r["fraction_of_stream_copy"] = r["read_gbs"] / result["stream_copy_gbs"]
    result["bloom"] = bloom(opts.smoke, log)
    result["ctr"] = ctr(opts.smoke, log)
    return result
