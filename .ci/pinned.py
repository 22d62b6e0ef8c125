"""Prints the requirement strings of pyproject.toml's optional extra EXTRA whose names are given.

Usage: python3 .ci/pinned.py EXTRA NAME [NAME ...]   e.g. `pinned.py test ruff clang-format` -> ruff==0.17.6 ...
so that CI installs the linters with the one pin pyproject.toml holds.
"""

import re
import sys

import tomllib


def main(argv: list[str]) -> int:
    extra, names = argv[1], argv[2:]
    with open("pyproject.toml", "rb") as f:
        requirements = tomllib.load(f)["project"]["optional-dependencies"][extra]
    found = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower(): r for r in requirements}
    missing = [n for n in names if n.lower() not in found]
    if missing:
        print(f"pyproject.toml's `{extra}` extra lists no {missing}", file=sys.stderr)
        return 1
    print(" ".join(found[n.lower()] for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
