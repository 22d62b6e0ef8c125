"""The report's targets: a thread-count target whose two runs saw different machine states is not comparable."""

from benchmarks import report_targets


def _threads_runs(ours_1: float, ours_2: float, kernel_1: float, kernel_2: float) -> list[dict]:
    runs = []
    for engine, one, two in (("ours", ours_1, ours_2), ("speed_of_light", kernel_1, kernel_2)):
        for threads, ms in ((1, one), (2, two)):
            runs.append(
                {
                    "section": "threads",
                    "workload": "W1",
                    "optimizer": "adagrad",
                    "engine": engine,
                    "threads": threads,
                    "median_ms": ms,
                    "iqr_ms": 0.0,
                }
            )
    return runs


def _w1_adagrad_threads(runs: list[dict]) -> dict:
    rows = report_targets.targets({"runs": runs})
    return next(r for r in rows if r["target"] == "W1 Adagrad: 2 threads >= 1.6x 1 thread")


def test_a_kernel_faster_than_its_thread_count_makes_the_target_not_comparable():
    row = _w1_adagrad_threads(_threads_runs(2.2, 0.85, 1.01, 0.444))  # the kernel: 2.27x on 2 threads
    assert row["measured"] > 1.6
    assert row["ceiling"] > 2
    assert row["status"] == report_targets.NOT_COMPARABLE


def test_a_plausible_kernel_speedup_keeps_met_and_missed():
    assert _w1_adagrad_threads(_threads_runs(2.0, 1.2, 1.0, 0.6))["status"] == "met"  # 1.67x, kernel 1.67x
    assert _w1_adagrad_threads(_threads_runs(1.0, 1.0, 1.0, 0.9))["status"] == "missed"
    assert _w1_adagrad_threads(_threads_runs(2.0, 1.0, 1.0, 0.5))["status"] == "met"  # the kernel at exactly 2x


def test_other_targets_are_never_not_comparable():
    runs = [
        {"section": "W1", "workload": "W1", "optimizer": "sgd", "engine": "ours", "median_ms": 1.0, "iqr_ms": 0.0},
        {"section": "W1", "workload": "W1", "optimizer": "sgd", "engine": "fbgemm", "median_ms": 9.0, "iqr_ms": 0.0},
        {
            "section": "W1",
            "workload": "W1",
            "optimizer": "sgd",
            "engine": "speed_of_light",
            "median_ms": 0.1,
            "iqr_ms": 0.0,
        },
    ]
    rows = {r["target"]: r for r in report_targets.targets({"runs": runs})}
    assert rows["W1 SGD: >= 1.3x FBGEMM EXACT_SGD"]["status"] == "met"
    assert rows["W1 SGD: >= 1.3x FBGEMM EXACT_SGD"]["ceiling"] == 90.0


def test_a_bandwidth_fraction_target_is_evaluated_beside_them():
    rec = {"section": "W1", "workload": "W1", "optimizer": "adam_nonlazy", "engine": "ours", "median_ms": 1.0}
    rows = {r["target"]: r for r in report_targets.targets({"runs": [{**rec, "fraction_of_bound": 0.7}]})}
    assert rows["W1 Adam (non-lazy): within 2x of the bandwidth bound"]["status"] == "met"
