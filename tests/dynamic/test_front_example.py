"""python -m tf_embed_ops.examples.ctr --dynamic: the open-world CTR example."""

import re
import subprocess
import sys

import numpy as np
import pytest

from tf_embed_ops.examples import ctr, ctr_dynamic


def test_raw_ids_are_distinct_64_bit_values_and_days_are_deterministic():
    index = np.arange(100_000)
    ids = ctr_dynamic.raw_user_id(index)
    assert ids.dtype == np.int64 and np.unique(ids).size == index.size
    assert (ids < 0).any() and (ids > 2**40).any()
    world = ctr_dynamic.World(600, 400)
    a, ya = ctr_dynamic.make_day(world, 1, 500, 300, 200, 2)
    b, yb = ctr_dynamic.make_day(world, 1, 500, 300, 200, 2)
    assert (ya == yb).all() and (a["user"] == b["user"]).all() and (a["item"] == b["item"]).all()
    assert 0.2 < float(ya.mean()) < 0.8
    # Day 1 shows new users that day 0 never did.
    c, _ = ctr_dynamic.make_day(world, 0, 500, 300, 200, 2)
    assert set(a["user"]) - set(c["user"])


def _rows(out: str) -> dict:
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\d+) (user|item)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", line)
        if m:
            rows[(int(m.group(1)), m.group(2))] = [int(m.group(i)) for i in range(3, 8)]
    return rows


@pytest.mark.slow
def test_smoke_run_prints_table_statistics_and_auc(capsys):
    assert ctr.main(["--dynamic", "--smoke", "--quiet", "--max-users", "100", "--item-ttl", "3"]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert set(rows) == {(0, "user"), (0, "item"), (1, "user"), (1, "item")}
    size, inserts, refused, full, evicted = rows[(0, "user")]
    assert inserts > 0 and refused > 0  # admission at the second sighting refuses one-off users
    assert size == 100 and evicted > 0  # LRU keeps max_users rows
    size, inserts, refused, full, evicted = rows[(1, "item")]
    assert inserts > 0 and evicted > 0 and refused == 0  # TTL evicts items unseen for 3 steps
    auc = float(re.search(r"^\s*1 user .*\s(0\.\d+)$", out, re.M).group(1))
    assert 0.0 <= auc <= 1.0


@pytest.mark.slow
def test_module_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "tf_embed_ops.examples.ctr", "--dynamic", "--smoke", "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "AUC before training on the day" in out.stdout and "Nothing was written to disk" in out.stdout
