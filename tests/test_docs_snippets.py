"""Every code block of README.md and docs/*.md runs (or parses) as written, at the small sizes the docs use.

Python blocks of a page run in order in one namespace (tests/docs_snippets.py); pages whose blocks start an
in-process cluster run in their own process, in the slow tier.  JSON blocks must parse.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import docs_snippets

PYTHON_PAGES = [d for d in docs_snippets.DOCUMENTS if any(b.language == "python" for b in docs_snippets.blocks(d))]
LOCAL_PAGES = [d for d in PYTHON_PAGES if not docs_snippets.needs_cluster(d)]
CLUSTER_PAGES = [d for d in PYTHON_PAGES if docs_snippets.needs_cluster(d)]
KNOWN_LANGUAGES = {"python", "json", "sh", "bash", ""}


@pytest.mark.filterwarnings("error::UserWarning")  # e.g. Keras' warnings about inputs it cannot match by name
@pytest.mark.parametrize("document", LOCAL_PAGES)
def test_python_blocks_run_as_written(document, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # whatever a block writes lands in a scratch directory
    program = docs_snippets.python_program(document)
    exec(compile(program, document, "exec"), {"__name__": "__docs__"})


@pytest.mark.slow
@pytest.mark.parametrize("document", CLUSTER_PAGES)
def test_cluster_blocks_run_as_written(document, tmp_path):
    script = tmp_path / "page.py"
    script.write_text(docs_snippets.python_program(document), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=docs_snippets.ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, f"{document}:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"


def test_the_pages_have_python_blocks_and_cluster_pages_are_marked():
    assert "README.md" in LOCAL_PAGES and "docs/distributed.md" in CLUSTER_PAGES
    for block in docs_snippets.all_blocks():
        if block.language == "python" and "create_local_cluster(" in block.code:
            assert block.marker == "cluster", f"{block.where} starts a cluster: mark it <!-- snippet: cluster -->"


@pytest.mark.parametrize("block", [b for b in docs_snippets.all_blocks()], ids=lambda b: b.where)
def test_every_block_is_complete(block):
    """No elided code: a Python block with a bare `...` line would run, but not as the reader needs it."""
    assert block.language in KNOWN_LANGUAGES, f"{block.where}: unknown fence language {block.language!r}"
    if block.language == "python":
        assert not [line for line in block.code.splitlines() if line.strip() == "..."], block.where
        compile(block.code, block.where, "exec")
    if block.language == "json":
        json.loads(block.code)


def test_building_doc_quotes_the_readme_test_command():
    readme = docs_snippets.blocks("README.md")
    test_command = next(b for b in readme if b.code.strip().endswith("pytest -q")).code.strip()
    building = [b.code.strip() for b in docs_snippets.blocks("docs/building.md")]
    assert any(code.startswith(test_command) for code in building), test_command
