"""The online example (smoke size): a trainer publishing deltas, a plain-TensorFlow serving process applying them."""

from __future__ import annotations

import argparse
import math

import pytest

from tf_embed_ops.examples import online


@pytest.mark.slow
def test_smoke_run_publishes_deltas_the_server_applies_and_fresh_beats_day_one(tmp_path):
    parser = argparse.ArgumentParser()
    online.add_arguments(parser)
    args = parser.parse_args(["--smoke", "--quiet", "--dir", str(tmp_path)])
    args.days, args.steps_per_day, args.batch_size = 3, 20, 256
    args.users, args.items_per_day, args.eval_size, args.item_ttl = 1000, 600, 4000, 30
    result = online.run(args)
    deltas = [d for d in result["deltas"] if d["kind"] == "delta"]
    assert len(deltas) >= 4
    for d in deltas:
        assert math.isfinite(d["to_servable_s"]) and d["to_servable_s"] >= d["publish_s"] >= 0
        if not d["dense"]:  # keys + rows (+ evicted keys) and a few hundred bytes of header
            assert d["bytes"] <= 1.1 * (d["rows"] * (8 + 4 * args.dim) + 8 * d["evicted"]) + 512
    assert sum(d["evicted"] for d in deltas) > 0  # the TTL evicts old items, and the deltas carry it
    days = result["days"]
    assert days[0]["fresh"] == days[0]["day1"]  # the same version on day 1
    assert days[-1]["fresh"] > days[-1]["day1"] + 0.05
