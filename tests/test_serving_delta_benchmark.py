"""The serving-delta benchmark section at smoke sizes: every point's lookups rest on enough calls, the busy-thread
floor runs beside every point without changing what is served, and the report renders the figures."""

from __future__ import annotations

import types

import pytest

from benchmarks import report_serving, serving_delta_benchmark

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def section():
    return serving_delta_benchmark.run(types.SimpleNamespace(smoke=True), log=lambda *_: None)


def test_every_point_rests_on_enough_calls(section):
    min_calls = section["params"]["min_calls"]
    assert [(p["table"], p["touched_rows"]) for p in section["points"]] == [
        ("static", 100),
        ("static", 1_000),
        ("static", 10_000),
        ("dynamic", 1_000),
    ]
    for p in section["points"]:
        assert 1 <= p["repeats"] <= serving_delta_benchmark.MAX_REPEATS
        assert p["during_calls"] >= min_calls or p["repeats"] == serving_delta_benchmark.MAX_REPEATS, p
        assert p["rest_calls"] > 0 and p["apply_s"] > 0 and p["publish_s"] > 0
        assert p["bytes_ratio"] < 1.1 and p["memory_ratio"] >= 1.0
        assert p["latency_ratio_p99"] > 0


def test_floor_beside_every_point_leaves_the_servable_equal_to_a_full_version(section):
    # The busy thread runs in the live serving process between its deltas.
    assert section["bit_identical"]
    for p in section["points"]:
        assert p["floor_during_calls"] > 0 and p["floor_rest_calls"] > 0 and p["floor_latency_ratio_p99"] > 0
    assert len(section["params"]["warmup_apply_s"]) == 3


def test_report_section_lists_every_point(section):
    lines = report_serving.section({"serving_delta": section})
    rows = [line for line in lines if line.startswith("| static") or line.startswith("| dynamic")]
    assert len(rows) == len(section["points"])
    for line, p in zip(rows, section["points"], strict=True):
        assert line.endswith(f"| {p['floor_latency_ratio_p99']:.2f} |")
