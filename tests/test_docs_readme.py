"""The README's promises to a new user: its commands work on a PEP 668 system Python (they make and use a
virtual environment), CI runs exactly its test command, and its speed paragraph quotes the committed report."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

from benchmarks import readme_speed
from tests import docs_snippets

ROOT = docs_snippets.ROOT


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def _marked_command(marker: str) -> str:
    lines = _readme().splitlines()
    i = lines.index(f"<!-- {marker} -->")
    assert lines[i + 1].startswith("```"), f"{marker}: a code fence must follow the marker"
    return lines[i + 2]


def _steps(command: str) -> list[list[str]]:
    return [shlex.split(step) for step in command.split("&&")]


def test_ci_runs_exactly_the_readme_test_command():
    """.ci/run extracts the line with awk; run that extraction and compare."""
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    awk = re.search(r"test_command=\$\((awk .*? README\.md)\)", ci).group(1)
    extracted = subprocess.run(["bash", "-c", awk], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert extracted.strip() == _marked_command("test-command")
    assert 'bash -c "$test_command"' in ci


def test_both_readme_commands_create_and_use_a_virtual_environment():
    """A Debian/Ubuntu python3 refuses `pip install` outside a venv (PEP 668): the commands must create `.venv`
    first and run pip and python only from it."""
    for marker in ("example-command", "test-command"):
        steps = _steps(_marked_command(marker))
        assert steps[0] == ["python3", "-m", "venv", ".venv"], marker
        for step in steps[1:]:
            assert step[0] in (".venv/bin/pip", ".venv/bin/python"), f"{marker}: {step} runs outside .venv"
        assert any(step[:2] == [".venv/bin/pip", "install"] for step in steps), marker


def test_ci_uses_the_readme_environment_for_bazel_and_the_linters():
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    after_tests = ci[ci.index('bash -c "$test_command"') :]
    setup = after_tests[: after_tests.index(".ci/bazel_test.sh")]
    assert 'PYTHON="$PWD/.venv/bin/python"' in setup and 'PATH="$PWD/.venv/bin:$PATH"' in setup
    assert "python3-venv" in ci[: ci.index('bash -c "$test_command"')]  # Debian's python3 needs it for venv


def test_the_virtual_environment_and_build_directory_are_ignored():
    out = subprocess.run(
        ["git", "check-ignore", ".venv/bin/python", "build/ninja/x/build.ninja"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.stdout.split() == [".venv/bin/python", "build/ninja/x/build.ninja"], out.stdout + out.stderr


def test_speed_paragraph_quotes_the_committed_report():
    """Regenerate with `python -c 'from benchmarks import readme_speed; readme_speed.update_readme()'`."""
    with open(readme_speed.REPORT, encoding="utf-8") as f:
        expected = readme_speed.block(f.read(), readme_speed.committed_headline())
    assert readme_speed.current_block(_readme()) == expected


def test_speed_figures_are_read_from_the_report_tables():
    report = """# report

Run 2026-01-02 03:04:05 UTC on Some CPU (8 logical CPUs, load average at start 0.1), TensorFlow 2.21.0.

## Targets

| target | measured | status | ceiling | how |
|---|---|---|---|---|
| a | 1 | met | 2 | x |
| b | 1 | **missed** | 2 | x |

## W1: 1 table 10 x 4, 3 ids

| optimizer | ours ms | Keras 3 ms (speedup) | raw ops ms (speedup) | FBGEMM ms (speedup) | FBGEMM row-wise ms |
|---|---|---|---|---|---|
| SGD | 1 | 2 (**2x**) | 3 (**3x**) | 0.5 (0.5x) | — |
| Adagrad | 1 | 4 (**4x**) | 5 (**5x**) | 6 (**6x**) | 7 (**7x**) |
| Adam (lazy) | 1 | 250 (**250x**) | 8 (**8x**) | — | — |
| FTRL | 1 | 9 (**9x**) | 10 (**10x**) | — | — |
"""
    f = readme_speed.figures(report)
    assert f["date"] == "2026-01-02 03:04" and f["cpus"] == 8 and (f["targets_met"], f["targets"]) == (1, 2)
    assert f["lazy_adam_vs_keras"] == 250 and f["raw"] == {"FTRL": 10, "Adagrad": 5, "SGD": 3}
    assert f["fbgemm"] == {"Adagrad": 6, "SGD": 0.5}
    assert "SGD 0.5x (FBGEMM is faster)" in readme_speed.paragraph(report)


def test_update_readme_rewrites_only_the_generated_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n\n{readme_speed.BEGIN}\nold numbers\n{readme_speed.END}\n\noutro\n", encoding="utf-8")
    readme_speed.update_readme(str(readme), readme_speed.REPORT)
    text = readme.read_text(encoding="utf-8")
    with open(readme_speed.REPORT, encoding="utf-8") as f:
        assert text == f"intro\n\n{readme_speed.block(f.read(), readme_speed.committed_headline())}\n\noutro\n"
