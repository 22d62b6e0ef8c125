"""Which store a tiered table should sit on: the row file, a log, RocksDB, on the I/O of W1 (docs/design_notes.md).

`tiered_store_probe.cc` replays the disk I/O a tiered table makes on W1 (1M x 64 Adagrad rows: 516-byte records;
16,384 Zipf(1.05) ids per step; a CLOCK cache of a tenth of the rows; every touched row dirty, so each miss
reads a record and writes a victim's back) against each store, one process per engine, the engines alternating
round by round. It times the stores alone (no TensorFlow, no optimizer), so the figures are what each store adds
to a step, and checks that every record read back is the one last written.

RocksDB needs its development package (`benchmarks/peers/setup_rocksdb.sh`, Debian's librocksdb-dev; without it
the probe runs the other two engines); the probe is not part of the suite (`python -m benchmarks`), and the
product does not link RocksDB.

    python -m benchmarks.tiered_store_probe --out benchmarks/results/tiered_store.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks import bandwidth
from benchmarks import workloads as wls

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiered_store_probe.cc")
ENGINES = ("rowfile", "log", "rocksdb")
RECORD_BYTES = 2 * 64 * 4 + 4  # W1 with Adagrad: the row and its accumulator in float32, the CRC
CACHE_FRACTION = 0.1


def have_rocksdb() -> bool:
    """Whether RocksDB's development files are installed where the compiler looks (setup_rocksdb.sh)."""
    return any(os.path.exists(os.path.join(d, "rocksdb", "db.h")) for d in ("/usr/include", "/usr/local/include"))


def build() -> str:
    """Compiles the probe once (linking librocksdb where it is installed); returns the binary's path.

    Raises:
      RuntimeError: no compiler, or the compile failed.
    """
    if have_rocksdb():
        return bandwidth.native_binary(_SOURCE, "tiered_store_probe", ["-pthread"], libs=["-lrocksdb"])
    return bandwidth.native_binary(_SOURCE, "tiered_store_probe", ["-pthread", "-DTIERED_STORE_PROBE_NO_ROCKSDB"])


def available_engines() -> tuple[str, ...]:
    """The engines this machine can run (rocksdb only with its development package)."""
    return ENGINES if have_rocksdb() else tuple(e for e in ENGINES if e != "rocksdb")


def _ids(path: str, steps: int, vocab: int, batch: int) -> None:
    """`steps` fresh W1 batches (the suite's Zipf law and id permutation), written as int64."""
    rng = np.random.default_rng(wls.SEED)
    np.concatenate([wls.zipf_ids(rng, vocab, batch, 1.05) for _ in range(steps)]).astype(np.int64).tofile(path)


def run(
    rounds: int = 2,
    steps: int = 400,
    warmup: int = 200,
    vocab: int = 1_000_000,
    batch: int = 16_384,
    engines: tuple[str, ...] | None = None,
    block_cache_mib: int = 8,
    memtable_mib: int = 32,
    directory: str | None = None,
) -> dict:
    """Runs every engine `rounds` times, alternating; returns the per-run JSON and a summary per engine.

    `directory`: where the stores' files go (default: a new directory under the system's temporary directory;
    removed afterwards). The warm-up steps fill the cache (a cache of a tenth of W1's rows fills in about 60
    steps) and bring the stores to their steady state before the timed steps.
    """
    engines = engines or available_engines()
    binary = build()
    capacity = int(vocab * CACHE_FRACTION)
    scratch = tempfile.mkdtemp(prefix="tiered_store_probe_", dir=directory)
    try:
        ids = os.path.join(scratch, "ids.bin")
        _ids(ids, steps, vocab, batch)
        runs = []
        for r in range(rounds):
            for engine in engines:
                cmd = [binary, engine, scratch, ids, str(steps), str(batch), str(vocab), str(RECORD_BYTES)]
                cmd += [str(capacity), str(warmup), str(block_cache_mib), str(memtable_mib)]
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    raise RuntimeError(f"{engine}: {proc.stderr.strip() or proc.stdout.strip()}")
                res = json.loads(proc.stdout)
                res["round"] = r
                res["load_average"] = os.getloadavg()[0]
                runs.append(res)
                print(json.dumps(res), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = {}
    for engine in engines:
        mine = [x for x in runs if x["engine"] == engine]
        summary[engine] = {
            "median_ms": min(x["median_ms"] for x in mine),
            "cpu_ms_per_step": statistics.median(x["cpu_ms_per_step"] for x in mine),
            "reads_per_step": mine[0]["reads_per_step"],
            "writes_per_step": mine[0]["writes_per_step"],
            "rss_store_mib": max(x["rss_store_mib"] for x in mine),
            "disk_mib": max(x["disk_bytes"] for x in mine) / 2**20,
        }
    settings = {
        "engines": list(engines),
        "vocab": vocab,
        "batch": batch,
        "record_bytes": RECORD_BYTES,
        "cache_rows": capacity,
    }
    settings |= {"steps": steps, "warmup": warmup, "block_cache_mib": block_cache_mib, "memtable_mib": memtable_mib}
    return {"settings": settings, "runs": runs, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tiered_store_probe", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--engine", action="append", choices=ENGINES, help="repeatable; default: all")
    parser.add_argument("--block-cache-mib", type=int, default=8)
    parser.add_argument("--memtable-mib", type=int, default=32)
    parser.add_argument("--dir", help="where the stores' files go (default: the temporary directory)")
    parser.add_argument("--out", help="write the JSON here")
    args = parser.parse_args(argv)
    result = run(
        rounds=args.rounds,
        steps=args.steps,
        warmup=args.warmup,
        engines=tuple(args.engine) if args.engine else None,
        block_cache_mib=args.block_cache_mib,
        memtable_mib=args.memtable_mib,
        directory=args.dir,
    )
    print(json.dumps(result["summary"], indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
