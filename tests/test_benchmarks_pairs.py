"""The interleaved-pairs method of the benchmarks (benchmarks/pairs.py, workers.py, headline.py), without timing.

The statistics (median of per-pair ratios, quartiles, the 'level' rule, ratios of ratios, agreement of two runs),
the pair schedule (who runs next to whom, in which order), the worker protocol (the serve loop and the client over
a real pipe, with a fake engine and a fake clock) and a headline's evaluation from a synthetic run.
"""

from __future__ import annotations

import gc
import io
import os
import sys
import weakref

import numpy as np
import pytest

from benchmarks import headline, pairs, workers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("n", [1, 2, 5, 8, 21])
def test_quantiles_match_numpy(n):
    xs = list(np.random.default_rng(n).lognormal(size=n))
    for q in (0.0, 0.25, 0.5, 0.75, 1.0):
        assert pairs.quantile(xs, q) == pytest.approx(float(np.percentile(xs, 100 * q)))


def test_pair_stats_median_quartiles_extremes_and_count():
    s = pairs.pair_stats([2.0, 1.5, 3.0, 2.5, 1.0])
    assert s["n"] == 5
    assert s["median"] == 2.0
    assert (s["q1"], s["q3"]) == (1.5, 2.5)
    assert (s["min"], s["max"]) == (1.0, 3.0)
    assert s["level"] is False


@pytest.mark.parametrize(
    "ratios, level",
    [
        ([0.8, 0.9, 1.1, 1.2], True),  # quartiles 0.875 .. 1.125 straddle 1
        ([1.05, 1.1, 1.2, 1.3], False),  # every quartile above 1: the peer is slower
        ([0.5, 0.6, 0.7, 1.4], False),  # one pair above 1 does not make it level: q3 = 0.875
        ([1.0, 1.0, 1.0], True),  # exactly equal is level
        ([0.7, 0.8, 0.9, 1.5, 1.6], True),  # median 0.9 < 1 but q3 1.5: level
    ],
)
def test_level_when_the_interquartile_range_straddles_one(ratios, level):
    assert pairs.pair_stats(ratios)["level"] is level


@pytest.mark.parametrize("bad", [[], [1.0, 0.0], [1.0, -2.0], [float("nan")], [float("inf")]])
def test_pair_stats_refuses_no_pairs_or_non_positive_ratios(bad):
    with pytest.raises(ValueError, match="pair_stats"):
        pairs.pair_stats(bad)


def test_ratio_of_ratios_is_per_round_and_checks_lengths():
    assert pairs.ratio_of_ratios([2.0, 4.0], [1.0, 2.0]) == [2.0, 2.0]
    assert pairs.invert([2.0, 0.5]) == [0.5, 2.0]
    with pytest.raises(ValueError, match="2 and 1 rounds"):
        pairs.ratio_of_ratios([1.0, 2.0], [1.0])


def test_agreement_is_symmetric_max_over_min():
    assert pairs.agreement(1.0, 1.15) == pytest.approx(0.15)
    assert pairs.agreement(1.15, 1.0) == pytest.approx(0.15)
    with pytest.raises(ValueError, match="positive"):
        pairs.agreement(0.0, 1.0)


# ----------------------------------------------------------------------------------------------- the schedule


class _Fake:
    """An engine whose block takes ``per_step`` fake seconds a step, logging each block it runs."""

    def __init__(self, name, per_step, log):
        self.name, self.per_step, self.log = name, per_step, log

    def run(self, steps):
        self.log.append((self.name, steps))
        return self.per_step * steps


def test_run_pairs_puts_a_base_block_next_to_every_peer_block_alternating_order():
    log = []
    base = _Fake("base", 0.001, log)
    others = {"a": _Fake("a", 0.002, log), "b": _Fake("b", 0.0005, log)}
    res = pairs.run_pairs(base, others, {"base": 10, "a": 5, "b": 20}, rounds=4)
    # Every block of a peer has a block of the base right before or after it (a pair), so 2 blocks per pair.
    assert len(log) == 4 * 2 * 2
    blocks = [log[i : i + 2] for i in range(0, len(log), 2)]
    for pair in blocks:
        assert {n for n, _ in pair} in ({"base", "a"}, {"base", "b"})
    # Which of the two goes first alternates, for each peer.
    for peer in ("a", "b"):
        firsts = [pair[0][0] for pair in blocks if peer in {n for n, _ in pair}]
        assert firsts.count("base") == 2 and firsts.count(peer) == 2
    # Per-step times, so different block lengths do not bias the ratio.
    assert res["a"]["ratios"] == pytest.approx([2.0] * 4)
    assert res["b"]["ratios"] == pytest.approx([0.5] * 4)
    assert res["a"]["ms"] == pytest.approx([2.0] * 4) and res["a"]["base_ms"] == pytest.approx([1.0] * 4)
    assert [s for n, s in log if n == "a"] == [5] * 4


def test_rounds_timed_in_several_calls_alternate_as_one_series():
    def order(calls):
        log = []
        base, others = _Fake("base", 0.001, log), {"a": _Fake("a", 0.002, log), "b": _Fake("b", 0.001, log)}
        for first, rounds in calls:
            pairs.run_pairs(base, others, {"base": 1, "a": 1, "b": 1}, rounds=rounds, first=first)
        return [n for n, _ in log]

    assert order([(0, 3), (3, 4)]) == order([(0, 7)])
    assert order([(0, 3), (0, 4)]) != order([(0, 7)])  # restarting the series repeats its first rounds' order


def test_warm_steps_run_untimed_right_before_each_timed_block():
    """An engine that starts slow after idling (its first 3 steps after another engine ran cost 10x): warm steps
    take the transient, and only the timed block's steps count."""
    log = []
    state = {"last": None}

    class ColdStart:
        def __init__(self, name, per_step):
            self.name, self.per_step = name, per_step

        def run(self, steps):
            log.append((self.name, steps))
            cold = 0 if state["last"] == self.name else 3
            state["last"] = self.name
            return self.per_step * (steps + 9 * min(cold, steps))

    base, peer = ColdStart("base", 1.0), ColdStart("peer", 2.0)
    cold = pairs.run_pairs(base, {"peer": peer}, {"base": 10, "peer": 10}, rounds=4)
    # Without warm steps a block starts cold whenever the other engine ran last: the pairs are biased.
    assert cold["peer"]["ms"] == pytest.approx([2e3 * 3.7, 2e3, 2e3 * 3.7, 2e3])
    assert cold["peer"]["ratios"] != pytest.approx([2.0] * 4)
    log.clear()
    warm = pairs.run_pairs(base, {"peer": peer}, {"base": 10, "peer": 10}, rounds=4, warm={"base": 3, "peer": 5})
    assert warm["peer"]["ratios"] == pytest.approx([2.0] * 4)
    assert warm["peer"]["ms"] == pytest.approx([2e3] * 4) and warm["peer"]["base_ms"] == pytest.approx([1e3] * 4)
    # Each engine's warm steps come right before its timed block, every time.
    assert log[:4] == [("base", 3), ("base", 10), ("peer", 5), ("peer", 10)]
    assert [s for n, s in log if n == "peer"] == [5, 10] * 4


def test_warm_steps_are_a_share_of_each_block():
    assert pairs.warm_steps({"base": 60, "peer": 20}, block_s=0.06, warm_s=0.15) == {"base": 150, "peer": 50}
    assert pairs.warm_steps({"base": 1}, block_s=0.06, warm_s=0.001) == {"base": 1}
    assert pairs.warm_steps({"base": 60}, block_s=0.06, warm_s=0.0) == {}
    with pytest.raises(ValueError, match="block_s"):
        pairs.warm_steps({"base": 60}, block_s=0.0)


def test_a_slow_phase_of_the_machine_cancels_in_pair_ratios():
    """The machine gets 3x slower half-way: block medians of a separate timing move, pair ratios do not."""
    clock = {"t": 0.0, "blocks": 0}

    class Slowing:
        def __init__(self, per_step):
            self.per_step = per_step

        def run(self, steps):
            clock["blocks"] += 1
            factor = 3.0 if clock["blocks"] > 20 else 1.0
            return self.per_step * steps * factor

    res = pairs.run_pairs(Slowing(1.0), {"peer": Slowing(1.5)}, {"base": 1, "peer": 1}, rounds=20)
    s = pairs.pair_stats(res["peer"]["ratios"])
    assert s["median"] == pytest.approx(1.5) and s["q1"] == pytest.approx(1.5) and s["q3"] == pytest.approx(1.5)
    assert max(res["peer"]["ms"]) / min(res["peer"]["ms"]) == pytest.approx(3.0)


def test_local_engine_times_steps_back_to_back_with_its_clock():
    calls = []
    ticks = iter([10.0, 10.25])
    eng = pairs.LocalEngine(lambda: calls.append(1), clock=lambda: next(ticks))
    assert eng.run(7) == pytest.approx(0.25)
    assert len(calls) == 7


def test_size_blocks_warms_then_sizes_to_the_block_length():
    log = []
    eng = _Fake("e", 0.004, log)
    assert pairs.size_blocks(eng, block_s=0.06, warmup=2) == 15
    assert log == [("e", 1)] * 5
    assert pairs.steps_for(0.0, 0.06) == 500 and pairs.steps_for(10.0, 0.06) == 1


# ----------------------------------------------------------------------------------------------- the protocol


def _serve(script: str, make, ticks=None) -> list[str]:
    out = io.StringIO()
    it = iter(ticks or [0.0, 1.0] * 10)
    workers.serve(io.StringIO(script), out, make, clock=lambda: next(it))
    return out.getvalue().splitlines()


def test_serve_prepares_times_drops_and_quits():
    made, stepped = [], []

    def make(name, params):
        made.append((name, params))
        return lambda: stepped.append(name)

    lines = _serve(
        "prepare e optimizer=sgd storage=bf16\n\ntime e 4\ndrop e\ntime e 1\nquit\ntime e 1\n", make, [2.0, 2.5]
    )
    assert made == [("e", {"optimizer": "sgd", "storage": "bf16"})]
    assert stepped == ["e"] * 4
    assert lines[0] == "ok"
    assert lines[1] == "seconds 0.500000000"
    assert lines[2] == "ok"
    assert lines[3].startswith("error KeyError: \"engine 'e' is not prepared")
    assert len(lines) == 4  # nothing after quit


@pytest.mark.parametrize(
    "request_line, message",
    [
        ("prepare e bad", "parameter 'bad' is not key=value"),
        ("time e 0", "steps must be >= 1"),
        ("time e x", "invalid literal"),
        ("frobnicate", "unknown request 'frobnicate'"),
        ("prepare boom", "RuntimeError: cannot build boom"),
    ],
)
def test_serve_answers_errors_and_keeps_serving(request_line, message):
    def make(name, params):
        if name == "boom":
            raise RuntimeError("cannot build boom")
        return lambda: None

    lines = _serve(f"prepare e\n{request_line}\ntime e 1\n", make)
    assert lines[0] == "ok"
    assert lines[1].startswith("error ") and message in lines[1]
    assert lines[2].startswith("seconds ")


def test_serve_frees_an_engine_it_replaces_or_drops_reference_cycles_included():
    class Step:  # like a tf.function's step, it sits in a reference cycle: only a collection frees it
        def __init__(self):
            self.me = self

        def __call__(self):
            pass

    made, alive_when_made = [], []

    def make(name, params):
        alive_when_made.append([r() is not None for r in made])
        step = Step()
        made.append(weakref.ref(step))
        return step

    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection: only serve's own may free them
    try:
        lines = _serve("prepare e\nprepare e\ntime e 1\ndrop e\n", make)
        alive_after = [r() is not None for r in made]
    finally:
        if was_enabled:
            gc.enable()
    assert lines[:2] == ["ok", "ok"] and lines[3] == "ok"
    assert alive_when_made == [[], [False]]  # the replaced engine was gone before its successor was built
    assert alive_after == [False, False]


_FAKE_WORKER = """
import sys
from benchmarks import workers
clock = iter(float(i) * 0.125 for i in range(1000))
def make(name, params):
    if params.get("fail") == "1":
        raise ValueError("engine " + name + " refused")
    return lambda: None
workers.serve(sys.stdin, sys.stdout, make, clock=lambda: next(clock))
"""


@pytest.fixture()
def fake_worker():
    env = dict(os.environ, PYTHONPATH=ROOT)
    w = workers.Worker([sys.executable, "-c", _FAKE_WORKER], env=env, cwd=ROOT, label="fake")
    yield w
    w.close()


def test_worker_client_over_a_pipe(fake_worker):
    fake_worker.prepare("a", optimizer="sgd")
    assert fake_worker.time("a", 3) == pytest.approx(0.125)
    eng = fake_worker.engine("a")
    assert eng.run(2) == pytest.approx(0.125)
    with pytest.raises(workers.WorkerError, match="fake: ValueError: engine b refused"):
        fake_worker.prepare("b", fail=1)
    with pytest.raises(workers.WorkerError, match="not prepared"):
        fake_worker.time("b", 1)
    fake_worker.drop("a")
    with pytest.raises(workers.WorkerError, match="not prepared"):
        fake_worker.time("a", 1)
    with pytest.raises(ValueError, match="single words"):
        fake_worker.prepare("a", optimizer="two words")


def test_worker_client_reports_a_dead_worker():
    w = workers.Worker([sys.executable, "-c", "import sys; sys.stderr.write('died here\\n')"], label="dead")
    try:
        w.proc.wait(timeout=60)
        with pytest.raises(workers.WorkerError, match="dead: worker exited .*died here"):
            w.time("a", 1)
    finally:
        w.close()


# ----------------------------------------------------------------------------------------------- headlines


def _group(**ratios):
    return {"rounds": 4, "engines": {name: {"ratios": list(r)} for name, r in ratios.items()}}


def test_headline_ratio_ceiling_and_status_from_pair_ratios():
    h = headline.Headline("k", "W1 SGD: FBGEMM / ours", "W1:sgd", "fbgemm*", "base", ">=", 1.3, ("fbgemm*", "sol"))
    run = {
        "groups": {
            # FBGEMM with huge pages is the faster setting: the figure uses it, not the slower one.
            "W1:sgd": _group(fbgemm=[2.0] * 4, fbgemm_hp=[1.2, 1.1, 1.2, 1.0], sol=[0.5, 0.5, 0.4, 0.5]),
        }
    }
    rec = headline.evaluate(h, run)
    assert rec["engines"] == ["fbgemm_hp", "base"]
    assert rec["median"] == pytest.approx(1.15) and rec["n"] == 4
    assert rec["status"] == "missed"
    assert rec["ceiling"]["median"] == pytest.approx(2.3)  # fbgemm_hp / sol per round: 2.4, 2.2, 3.0, 2.0
    assert rec["above_ceiling"] is False


def test_headline_ours_over_kernel_inverts_and_a_missing_engine_is_not_measured():
    h = headline.Headline("k", "ours / kernel", "W1:sgd", "base", "sol", "<=", 1.25, 1.0)
    rec = headline.evaluate(h, {"groups": {"W1:sgd": _group(sol=[0.5, 0.8, 0.8, 1.0])}})
    assert rec["median"] == pytest.approx(1.25) and rec["status"] == "met"
    assert rec["level"] is False and rec["ceiling"] == {"median": 1.0}
    run = {"groups": {"W1:sgd": {"rounds": 4, "engines": {"sol": {"error": "no compiler"}}}}}
    rec = headline.evaluate(h, run)
    assert rec["status"] == "not measured" and rec["why"] == "no compiler"


def test_ours_over_the_kernel_has_the_kernel_run_by_tensorflow_in_halves_as_its_ceiling():
    # The ceiling is (kernel as two ops) / kernel, both in this process, per round: 0.6 / 0.5 is 1.2 a round. The
    # kernel as one op (sol_tf, the lookup's ceiling) is not what a training step can be.
    h = next(x for x in headline.HEADLINES if x.key == "W1_sgd_sol")
    assert h.ceiling == ("sol_tf_halves", "sol_local")
    run = {
        "groups": {
            "W1:sgd": _group(
                sol=[0.5, 0.5, 0.25, 0.5],
                sol_local=[0.5, 0.4, 0.25, 0.5],
                sol_tf=[0.55, 0.44, 0.275, 0.55],
                sol_tf_halves=[0.6, 0.48, 0.3, 0.6],
            )
        }
    }
    rec = headline.evaluate(h, run)
    # The kernel is the faster of its two runs: here the one in this process (median 0.45 against the worker's 0.5).
    assert rec["engines"] == ["base", "sol_local"]
    assert rec["median"] == pytest.approx(2.25) and rec["status"] == "missed"
    assert rec["ceiling"]["engines"] == ["sol_tf_halves", "sol_local"]
    assert rec["ceiling"]["median"] == pytest.approx(1.2) and rec["above_ceiling"] is False
    assert {"sol", "sol_local", "sol_tf_halves"} <= set(headline.engines_of("W1:sgd"))
    # The lookup's ceiling keeps the one op: a lookup is the forward half alone.
    assert headline.HEADLINES[[x.key for x in headline.HEADLINES].index("W1_lookup_tf")].ceiling == (
        "tf_lookup",
        "sol_tf",
    )
    # Without the call's engine, the ceiling is left out rather than taken from the kernel alone.
    rec = headline.evaluate(h, {"groups": {"W1:sgd": _group(sol=[0.5] * 4, sol_local=[0.5] * 4)}})
    assert rec["status"] == "missed" and "ceiling" not in rec


def test_ours_over_the_kernel_takes_the_faster_of_the_kernels_worker_and_its_in_process_call():
    h = next(x for x in headline.HEADLINES if x.key == "W4_adam_sol")
    assert h.den == "sol*" and headline.BEST_OF["sol*"] == ("sol", "sol_local")
    # The worker faster: it is the kernel.
    rec = headline.evaluate(h, {"groups": {"W4:adam": _group(sol=[0.8] * 4, sol_local=[0.9] * 4)}})
    assert rec["engines"] == ["base", "sol"] and rec["median"] == pytest.approx(1.25) and rec["status"] == "met"
    # Only one of the two measured: that one.
    rec = headline.evaluate(h, {"groups": {"W4:adam": _group(sol_local=[0.5] * 4)}})
    assert rec["engines"] == ["base", "sol_local"] and rec["median"] == pytest.approx(2.0)
    # Neither: not measured, with the worker's error.
    run = {"groups": {"W4:adam": {"rounds": 4, "engines": {"sol": {"error": "no compiler"}}}}}
    rec = headline.evaluate(h, run)
    assert rec["status"] == "not measured" and rec["why"] == "no compiler"


def test_every_one_thread_kernel_engine_is_the_faster_of_its_worker_and_its_in_process_call():
    # Figures and ceilings alike: a worker's slow first-built tables must not set a ceiling against the other's.
    for h in headline.HEADLINES:
        ceiling = h.ceiling if isinstance(h.ceiling, tuple) and "sol_2t" not in h.ceiling else ()
        for e in (h.num, h.den, *ceiling):
            assert e not in ("sol", "sol_bf16", "sol_dynamic"), (h.key, e)
    dyn = next(x for x in headline.HEADLINES if x.key == "W1_sgd_dynamic")
    assert dyn.ceiling == ("sol_dynamic*", "sol*")
    assert {"sol_dynamic", "sol_dynamic_local", "sol", "sol_local"} <= set(headline.engines_of("W1:sgd"))
    # The worker's static tables slow (0.8 against 0.6 in this process), its keyed ones not: the ceiling divides
    # the faster keyed run by the faster static one, 0.66 / 0.6 = 1.1 a round (0.66 / 0.8 = 0.825 before).
    engines = {"dynamic": 1.4, "sol": 0.8, "sol_local": 0.6, "sol_dynamic": 0.66, "sol_dynamic_local": 0.7}
    run = {"groups": {"W1:sgd": _group(**{e: [r] * 4 for e, r in engines.items()})}}
    rec = headline.evaluate(dyn, run)
    assert rec["ceiling"]["engines"] == ["sol_dynamic", "sol_local"]
    assert rec["ceiling"]["median"] == pytest.approx(1.1)
    bf16 = next(x for x in headline.HEADLINES if x.key == "W1_adam_bf16")
    assert bf16.ceiling == ("sol_bf16*", "sol*") and "sol_bf16_local" in headline.engines_of("W1:adam")
    # The two-thread kernel runs in its worker only: its ceiling divides the two worker engines.
    threads = next(x for x in headline.HEADLINES if x.key == "W1_sgd_threads")
    assert threads.ceiling == ("sol", "sol_2t")


def test_every_headline_names_engines_its_group_builds():
    for h in headline.HEADLINES:
        built = headline.engines_of(h.group)
        for e in (h.num, h.den):
            assert e == "base" or set(headline.BEST_OF.get(e, (e,))) <= set(built), (h.key, e)
    assert len({h.key for h in headline.HEADLINES}) == len(headline.HEADLINES)


@pytest.mark.parametrize(
    "pairs_per_ratio, passes, split", [(21, 3, [7, 7, 7]), (22, 3, [8, 7, 7]), (2, 3, [1, 1]), (5, 1, [5])]
)
def test_pass_rounds_split_the_pairs_evenly(pairs_per_ratio, passes, split):
    assert headline.pass_rounds(pairs_per_ratio, passes) == split


@pytest.mark.parametrize("pairs_per_ratio, passes", [(0, 3), (21, 0)])
def test_pass_rounds_refuses_no_pair_or_no_pass(pairs_per_ratio, passes):
    with pytest.raises(ValueError, match="pass_rounds"):
        headline.pass_rounds(pairs_per_ratio, passes)


def _pass(rounds, seconds=1.0, **engines):
    recs = {}
    for name, r in engines.items():
        recs[name] = {"error": r} if isinstance(r, str) else {"ratios": r, "ms": r, "base_ms": [1.0] * rounds}
        recs[name]["steps"] = 3
    return {"workload": "W1", "optimizer": "sgd", "rounds": rounds, "engines": recs, "seconds": seconds}


def test_passes_merge_into_one_series_of_pairs():
    merged = headline.merge_passes([_pass(2, sol=[0.5, 0.6], fbgemm=[2.0, 2.1]), _pass(1, sol=[0.7], fbgemm=[2.2])])
    assert merged["rounds"] == 3 and merged["seconds"] == 2.0
    assert merged["engines"]["sol"]["ratios"] == [0.5, 0.6, 0.7]
    assert merged["engines"]["fbgemm"]["ms"] == [2.0, 2.1, 2.2] and merged["engines"]["sol"]["base_ms"] == [1.0] * 3
    assert [p["rounds"] for p in merged["passes"]] == [2, 1]
    h = headline.Headline("k", "ours / kernel", "W1:sgd", "base", "sol", "<=", 1.25)
    rec = headline.evaluate(h, {"groups": {"W1:sgd": merged}})
    assert rec["n"] == 3 and rec["median"] == pytest.approx(1 / 0.6)


def test_an_engine_that_failed_in_one_pass_has_no_pairs_and_a_failed_pass_adds_none():
    merged = headline.merge_passes(
        [
            _pass(2, sol=[0.5, 0.6], fbgemm=[2.0, 2.1]),
            {"workload": "W1", "optimizer": "sgd", "error": "ours: MemoryError", "engines": {}},
            _pass(1, sol=[0.7], fbgemm="RuntimeError: worker died"),
        ]
    )
    assert merged["rounds"] == 3 and merged["engines"]["sol"]["ratios"] == [0.5, 0.6, 0.7]
    assert merged["engines"]["fbgemm"] == {"error": "pass 3: RuntimeError: worker died"}
    assert merged["passes"][1]["error"] == "ours: MemoryError"
    h = headline.Headline("k", "FBGEMM / ours", "W1:sgd", "fbgemm", "base", ">=", 1.3)
    rec = headline.evaluate(h, {"groups": {"W1:sgd": merged}})
    assert rec["status"] == "not measured" and rec["why"] == "pass 3: RuntimeError: worker died"
    failed = {"workload": "W1", "optimizer": "sgd", "error": "ours: MemoryError", "engines": {}}
    assert headline.merge_passes([failed, dict(failed)])["error"] == "ours: MemoryError"


@pytest.mark.parametrize("passes, words", [(3, "from 3 passes over all the figures"), (1, "in one stretch")])
def test_the_method_sentence_says_how_many_passes(passes, words):
    text = headline.markdown(
        {"meta": {"passes": passes, "block_ms": 60, "warm_ms": 150}, "headlines": [], "groups": {}}
    )
    assert words in text


def test_two_runs_agree_within_fifteen_percent():
    a = {"headlines": [{"key": "x", "label": "x", "median": 1.0}, {"key": "y", "label": "y", "median": 2.0}]}
    b = {"headlines": [{"key": "x", "label": "x", "median": 1.14}, {"key": "y", "label": "y", "median": 2.4}]}
    rows = {r["key"]: r for r in headline.compare(a, b)}
    assert rows["x"]["agree"] is True
    assert rows["y"]["agree"] is False and rows["y"]["apart"] == pytest.approx(0.2)
    assert "**no**" in headline.compare_markdown(list(rows.values()))


def test_compare_gives_each_runs_step_times_of_the_two_engines():
    def run(ours_ms, sol_ms):
        group = {"rounds": 2, "engines": {"sol": {"ratios": [sol_ms / ours_ms] * 2, "ms": [sol_ms] * 2}}}
        group["engines"]["sol"]["base_ms"] = [ours_ms] * 2
        result = {"groups": {"W1:sgd": group}}
        result["headlines"] = [headline.evaluate(h, result) for h in headline.HEADLINES if h.key == "W1_sgd_sol"]
        return result

    a, b = run(1.0, 0.8), run(2.0, 1.0)
    assert headline.step_ms(a, "W1_sgd_sol") == {"ours": 1.0, "sol": 0.8}
    (row,) = headline.compare(a, b)
    assert row["agree"] is False and row["ms_b"] == {"ours": 2.0, "sol": 1.0}
    assert "ours 1 / 2; sol 0.8 / 1" in headline.compare_markdown([row])
    # A run without per-block times (or a headline no longer defined) gives none, not an error.
    del a["groups"]["W1:sgd"]["engines"]["sol"]["ms"]
    assert headline.step_ms(a, "W1_sgd_sol") == {} and headline.step_ms(a, "no such key") == {}
    assert "| — |" in headline.compare_markdown(headline.compare(a, b))


def test_readme_sentence_quotes_the_headline_run_and_is_absent_without_one(tmp_path):
    from benchmarks import readme_speed

    run = {
        "meta": {"date_utc": "2026-12-03 23:00:00"},
        "headlines": [
            {"key": "W1_sgd_sol", "median": 2.5, "n": 21, "status": "missed"},
            {"key": "W1_adagrad_sol", "median": 1.2, "n": 21, "status": "met"},
            {"key": "W1_sgd_fbgemm", "median": 1.45, "n": 19, "status": "met"},
            {"key": "W1_adam_sol", "status": "not measured"},
            {"key": "W1_rowwise_fbgemm", "median": 0.9, "n": 21, "status": "missed"},
        ],
    }
    text = readme_speed.headline_sentence(run)
    assert "run 2026-12-03 23:00 UTC, 19 pairs a figure" in text
    assert "2.5x (SGD), 1.2x (Adagrad) and not measured (lazy Adam)" in text
    assert "FBGEMM's SGD takes 1.45x ours on W1 and its row-wise Adagrad 0.9x; 2 of its 4 targets are met." in text
    one_met = dict(run, headlines=run["headlines"][:1] + [dict(run["headlines"][1], status="missed")])
    assert "1 of its 2 targets is met" not in readme_speed.headline_sentence(one_met)
    one_met["headlines"][0] = dict(one_met["headlines"][0], status="met")
    assert "1 of its 2 targets is met." in readme_speed.headline_sentence(one_met)
    assert readme_speed.committed_headline(str(tmp_path / "headline.json")) is None


def test_compare_writes_the_agreement_table(tmp_path, capsys):
    import json

    for name, median in (("a", 1.0), ("b", 1.3)):
        (tmp_path / f"{name}.json").write_text(
            json.dumps({"meta": {"date_utc": name}, "headlines": [{"key": "x", "label": "x", "median": median}]})
        )
    code = headline.main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path)])
    assert code == 1  # 30% apart: the runs disagree
    text = (tmp_path / "AGREEMENT.md").read_text()
    assert "a UTC and b UTC" in text and "| x | 1 | 1.3 | 30.0% | **no** |" in text
