"""Code blocks of README.md and docs/*.md, for tests/test_docs_snippets.py.

A block is a fenced code block; its language is the word after the opening fence.  An HTML comment on the line
before the fence may mark it:

* ``<!-- snippet: cluster -->``: the block starts an in-process cluster; the file's Python blocks then run in a
  process of their own, in the slow tier (a process cannot leave a cluster it joined).
* ``<!-- snippet: shell -->``: a command line, not Python (the README's install commands run in CI itself).

Python blocks of one file run in order in one namespace: a page reads top to bottom, and a later block may use
what an earlier one defined.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*snippet:\s*([\w-]+)\s*-->\s*$")


@dataclasses.dataclass
class Block:
    document: str  # path relative to the repository root
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}"


def blocks(document: str) -> list[Block]:
    with open(os.path.join(ROOT, document), encoding="utf-8") as f:
        lines = f.read().splitlines()
    out, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, language, start = match.group(1), match.group(2), i
        body = []
        i += 1
        while i < len(lines) and not _FENCE.match(lines[i]):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        marker = _MARKER.match(lines[start - 1]) if start > 0 else None
        out.append(Block(document, start + 1, language, "\n".join(body) + "\n", marker.group(1) if marker else None))
        i += 1
    return out


def all_blocks() -> list[Block]:
    return [b for d in DOCUMENTS for b in blocks(d)]


def python_program(document: str) -> str:
    """The document's Python blocks as one program, each preceded by a comment naming where it comes from."""
    return "\n".join(f"# --- {b.where}\n{b.code}" for b in blocks(document) if b.language == "python")


def needs_cluster(document: str) -> bool:
    return any(b.marker == "cluster" for b in blocks(document))
