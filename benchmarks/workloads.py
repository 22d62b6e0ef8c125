"""Workload generators: the tables and the ids of one training step, as plain numpy.

Every engine (ours, the TensorFlow-native peers, FBGEMM in its own interpreter) consumes the same arrays, so a
comparison is on identical ids. Ids follow a bounded Zipf law over the vocabulary, then pass through a fixed random
permutation of the vocabulary: hot ids are scattered over the table as in a real hashed vocabulary, instead of
sitting in the first rows where they would share cache lines and flatter every engine.

Workloads (``--smoke`` shrinks every size, keeping the shape of the workload):

* W1 — one table 1M x 64 fp32, 16,384 Zipf(1.05) ids per step, one id per sample (the headline).
* W2 — multi-hot bags of 8 ids per sample (4,096 samples, 32,768 ids), mean combiner.
* W3 — a sequence feature, L = 20 ids per sample (1,024 samples, 20,480 ids), output [B, L, D].
* W4 — 8 tables of mixed sizes and dims sharing a batch of 4,096 samples (a DLRM-like step), sum combiner.
* Sweeps — W1 with one knob moved: vocabulary, batch, dim, Zipf exponent (threads are run by the suite).

Example:
    >>> wl = w1(smoke=True)
    >>> wl.features[0].ids.shape
    (256,)
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

SEED = 1234


@dataclasses.dataclass(frozen=True)
class Table:
    """One embedding table: ``vocab`` rows of ``dim`` float32."""

    name: str
    vocab: int
    dim: int


@dataclasses.dataclass
class Feature:
    """One feature's ids for one step.

    ``row_splits`` is None for one id per sample (ids has one entry per sample), else CSR splits of length
    ``batch + 1``. ``sequence_length`` > 0 marks a sequence feature (each sample has exactly that many ids and the
    activation is [batch, L, dim]).
    """

    name: str
    table: int
    ids: np.ndarray
    row_splits: np.ndarray | None = None
    sequence_length: int = 0

    @property
    def batch(self) -> int:
        return self.ids.shape[0] if self.row_splits is None else self.row_splits.shape[0] - 1

    @property
    def kind(self) -> str:
        if self.sequence_length:
            return "sequence"
        return "single" if self.row_splits is None else "bag"


@dataclasses.dataclass
class Workload:
    """Tables, the features of one step and the combiner (one for all tables, as the peers need)."""

    name: str
    description: str
    tables: list[Table]
    features: list[Feature]
    combiner: str = "sum"
    params: dict = dataclasses.field(default_factory=dict)

    @property
    def batch(self) -> int:
        return self.features[0].batch

    @property
    def num_ids(self) -> int:
        return int(sum(f.ids.shape[0] for f in self.features))

    def unique_rows(self) -> list[int]:
        """Distinct ids per table in this step: the rows a lazy optimizer reads and writes."""
        out = []
        for t in range(len(self.tables)):
            ids = [f.ids for f in self.features if f.table == t]
            out.append(int(np.unique(np.concatenate(ids)).shape[0]) if ids else 0)
        return out

    def activation_elements(self) -> int:
        """Floats in all activations (= in all upstream gradients) of one step."""
        total = 0
        for f in self.features:
            rows = f.batch * (f.sequence_length or 1)
            total += rows * self.tables[f.table].dim
        return total

    def summary(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "tables": [dataclasses.asdict(t) for t in self.tables],
            "features": [
                {
                    "name": f.name,
                    "table": f.table,
                    "kind": f.kind,
                    "ids": int(f.ids.shape[0]),
                    "batch": f.batch,
                    "sequence_length": f.sequence_length,
                }
                for f in self.features
            ],
            "combiner": self.combiner,
            "batch": self.batch,
            "num_ids": self.num_ids,
            "unique_rows": self.unique_rows(),
            "params": self.params,
        }


@functools.lru_cache(maxsize=8)
def _zipf_table(vocab: int, s: float) -> tuple[np.ndarray, np.ndarray]:
    """CDF of a Zipf(s) law over ranks 1..vocab, and the fixed rank -> id permutation."""
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** (-s))
    cdf /= cdf[-1]
    perm = np.random.default_rng(SEED ^ vocab).permutation(vocab).astype(np.int64)
    return cdf, perm


def zipf_ids(rng: np.random.Generator, vocab: int, n: int, s: float) -> np.ndarray:
    """Draws ``n`` int64 ids in [0, vocab) whose frequencies follow Zipf(s) (inverse-CDF sampling).

    Args:
        rng: the generator (seeded by the caller, so a workload is reproducible).
        vocab: vocabulary size (rows of the table).
        n: number of ids.
        s: Zipf exponent (> 0; s = 1.05 is typical of recommender id features).

    Returns:
        int64 array of shape [n].
    """
    cdf, perm = _zipf_table(int(vocab), float(s))
    ranks = np.searchsorted(cdf, rng.random(n), side="right")
    return perm[np.minimum(ranks, vocab - 1)]


def w1(
    smoke: bool = False,
    vocab: int = 1_000_000,
    batch: int = 16_384,
    dim: int = 64,
    zipf: float = 1.05,
    name: str = "W1",
) -> Workload:
    """One table, one Zipf id per sample (the headline workload, and the base of every sweep)."""
    if smoke:
        vocab, batch, dim = min(vocab, 1000), min(batch, 256), min(dim, 16)
    rng = np.random.default_rng(SEED)
    ids = zipf_ids(rng, vocab, batch, zipf)
    return Workload(
        name,
        f"1 table {vocab:,} x {dim}, {batch:,} Zipf({zipf}) ids, one per sample",
        [Table("t0", vocab, dim)],
        [Feature("f0", 0, ids)],
        "sum",
        {"vocab": vocab, "batch": batch, "dim": dim, "zipf": zipf},
    )


def fixed_bags(seed: int, vocab: int, batch: int, size: int, zipf: float) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` bags of ``size`` Zipf ids each, drawn with ``seed``: the ids and their row splits."""
    ids = zipf_ids(np.random.default_rng(seed), vocab, batch * size, zipf)
    return ids, np.arange(0, batch * size + 1, size, dtype=np.int64)


def w2(
    smoke: bool = False, vocab: int = 1_000_000, batch: int = 4_096, dim: int = 64, bag: int = 8, zipf: float = 1.05
) -> Workload:
    """Multi-hot bags of ``bag`` ids per sample, mean combiner."""
    if smoke:
        vocab, batch, dim = 1000, 64, 16
    ids, splits = fixed_bags(SEED + 2, vocab, batch, bag, zipf)
    return Workload(
        "W2",
        f"1 table {vocab:,} x {dim}, {batch:,} bags of {bag} Zipf({zipf}) ids, mean combiner",
        [Table("t0", vocab, dim)],
        [Feature("f0", 0, ids, splits)],
        "mean",
        {"vocab": vocab, "batch": batch, "dim": dim, "bag": bag, "zipf": zipf},
    )


def w3(
    smoke: bool = False, vocab: int = 1_000_000, batch: int = 1_024, dim: int = 64, length: int = 20, zipf: float = 1.05
) -> Workload:
    """A sequence feature: ``length`` ids per sample, activation [batch, length, dim]."""
    if smoke:
        vocab, batch, dim, length = 1000, 32, 16, 5
    ids, splits = fixed_bags(SEED + 3, vocab, batch, length, zipf)
    return Workload(
        "W3",
        f"1 table {vocab:,} x {dim}, sequence feature L={length}, {batch:,} samples",
        [Table("t0", vocab, dim)],
        [Feature("f0", 0, ids, splits, sequence_length=length)],
        "sum",
        {"vocab": vocab, "batch": batch, "dim": dim, "length": length, "zipf": zipf},
    )


# DLRM-like: a few huge id tables, some mid-sized categorical ones, a few tiny ones; dims vary. Bags of 1..4.
_W4_TABLES = [
    (2_000_000, 64, 1),
    (1_000_000, 64, 1),
    (500_000, 32, 2),
    (100_000, 32, 4),
    (50_000, 16, 2),
    (10_000, 16, 1),
    (1_000, 8, 1),
    (100, 8, 1),
]


def w4(smoke: bool = False, batch: int = 4_096, zipf: float = 1.05) -> Workload:
    """Eight tables of mixed vocabulary, dim and bag size sharing one batch (a DLRM-like sparse step), sum."""
    specs = _W4_TABLES
    if smoke:
        batch = 64
        specs = [(max(10, v // 2000), max(4, d // 4), b) for v, d, b in specs]
    rng = np.random.default_rng(SEED + 4)
    tables, features = [], []
    for t, (vocab, dim, bag) in enumerate(specs):
        tables.append(Table(f"t{t}", vocab, dim))
        ids = zipf_ids(rng, vocab, batch * bag, zipf)
        splits = None if bag == 1 else np.arange(0, batch * bag + 1, bag, dtype=np.int64)
        features.append(Feature(f"f{t}", t, ids, splits))
    total = sum(v * d for v, d, _ in specs)
    return Workload(
        "W4",
        f"8 tables (mixed sizes/dims, {total * 4 / 2**20:,.0f} MiB), batch {batch:,}, bags of 1-4, sum combiner",
        tables,
        features,
        "sum",
        {"batch": batch, "zipf": zipf},
    )


def sweeps(smoke: bool = False) -> dict[str, list[Workload]]:
    """W1 with one knob moved at a time: name -> workloads in increasing order of the knob."""
    if smoke:
        return {
            "vocab": [w1(True, vocab=v, name=f"vocab={v}") for v in (100, 1000)],
            "batch": [w1(True, batch=b, name=f"batch={b}") for b in (64, 256)],
        }
    return {
        # dim 32 here: at 1e7 rows a 64-wide table is 2.5 GB per array, and ours and the raw-op peer each hold
        # table + slots at once, which does not fit beside other work in 24 GB.
        "vocab": [w1(vocab=v, dim=32, name=f"vocab={v:.0e}") for v in (10_000, 100_000, 1_000_000, 10_000_000)],
        "batch": [w1(batch=b, name=f"batch={b // 1024}K") for b in (1_024, 4_096, 16_384, 65_536)],
        "dim": [w1(dim=d, name=f"dim={d}") for d in (8, 32, 64, 128, 256)],
        "zipf": [w1(zipf=s, name=f"zipf={s}") for s in (0.8, 1.05, 1.2, 1.4)],
    }


WORKLOADS = {"W1": w1, "W2": w2, "W3": w3, "W4": w4}
