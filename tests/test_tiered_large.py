"""`benchmarks/tiered_large.py` (the larger-than-memory run): its disk plan, and the whole script at a tiny size."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import tiered_large

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GB = 10**9


def test_the_restore_goes_to_a_second_file_only_when_the_disk_holds_it():
    margin = 2 * GB
    # A 10 GB table: a row file of 12.5 GB (a quarter spare), a checkpoint of 10 GB.
    assert tiered_large.row_file_bytes(10 * GB) == 12.5 * GB
    assert tiered_large.plan_disk(10 * GB, 35 * GB + margin, "auto") == "new"
    assert tiered_large.plan_disk(10 * GB, 35 * GB + margin - 1, "auto") == "same"
    assert tiered_large.plan_disk(10 * GB, 22.5 * GB + margin, "same") == "same"
    assert tiered_large.plan_disk(10 * GB, 35 * GB + margin, "new") == "new"


@pytest.mark.parametrize(
    ("free", "mode", "needed"),
    [(22.5 * GB + 2 * GB - 1, "auto", "24.5"), (22.5 * GB + 2 * GB - 1, "same", "24.5"), (35 * GB, "new", "37.0")],
)
def test_too_little_disk_is_refused_before_anything_is_written(free, mode, needed):
    with pytest.raises(SystemExit) as e:
        tiered_large.plan_disk(10 * GB, free, mode)
    message = str(e.value)
    assert f"needs {needed} GB free" in message
    assert f"has {free / GB:.1f} GB free" in message
    assert "row file 12.5 GB" in message


def test_a_training_only_run_needs_room_for_the_row_file_alone():
    margin = 2 * GB
    assert tiered_large.plan_disk(10 * GB, 12.5 * GB + margin, "auto", train_only=True) == "none"
    with pytest.raises(SystemExit) as e:
        tiered_large.plan_disk(10 * GB, 12.5 * GB + margin - 1, "auto", train_only=True)
    assert "needs 14.5 GB free (row file 12.5 GB and 2 GB of margin)" in str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize("restore_into", ["new", "same"])
def test_the_script_trains_checkpoints_restores_and_cleans_up(tmp_path, restore_into):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    directory = tmp_path / "large"
    cmd = [sys.executable, "-m", "benchmarks.tiered_large", "--directory", str(directory), "--table-gb", "0.002"]
    cmd += ["--cache-gb", "0.0002", "--steps", "4", "--batch", "64", "--chunk-mb", "1", "--restore-into", restore_into]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    phases = {line["phase"]: line for line in lines}
    assert list(phases) == ["init", "train", "checkpoint", "restore", "verify", "cleanup"]
    assert phases["init"]["rows"] == 2 * 10**6 // 516
    assert phases["train"]["steps"] == 4
    assert 0 < phases["train"]["rows_read_per_step"] <= 2 * 64  # a batch, and its prefetched successor
    assert phases["restore"]["into"] == restore_into
    assert phases["verify"]["bitwise_equal"] is True
    assert phases["verify"]["rows_compared"] > 256
    assert all(line["peak_rss_mb"] > 0 for line in lines[:-1])
    assert not directory.exists()  # every file the script made is gone
