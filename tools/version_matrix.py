#!/usr/bin/env python3
"""Builds tf_embed_ops' wheel against each supported TensorFlow minor and runs the fast test tier from the installed
wheel, each minor in its own virtual environment; writes the results into docs/building.md's version matrix.

For each minor (default: all of configure.SUPPORTED_TF_MINORS, each at its latest patch release in LATEST_PATCH):

1. a virtual environment ROOT/tf<major><minor> with only that TensorFlow (`tensorflow-cpu==X.Y.Z`, or
   `--distribution tensorflow`) and the Keras it installs;
2. `pip wheel --no-deps` of this checkout with that environment's pip: the build reads the environment's TensorFlow
   (no second one is downloaded) and names the wheel after its minor (tf_embed_ops-0.1.0+tf216-...whl);
3. the wheel installed with the `test` extra, the environment's TensorFlow and Keras held where they are (a
   constraint); a test dependency that needs another Keras (keras-rs) is left out, and its tests skip;
4. the fast tier (`pytest -m "not slow" -n JOBS`), run in a copy of the checkout whose `tf_embed_ops/` is the
   installed package (so the tests import the wheel's files and libraries, never the source tree's), with no
   compiler on PATH;
5. one row of the table: the versions, the wheel, the build time, the counts pytest reported, the date.

Rows of minors not run keep what an earlier run measured (with its date). A minor whose step fails gets a row that
says which step failed. Usage:

    python3 tools/version_matrix.py                       # every supported minor (about 10 minutes each, 2 cores)
    python3 tools/version_matrix.py --minors 2.16 2.21    # what CI runs (.ci/run)
    python3 tools/version_matrix.py --minors 2.18 --no-table   # build and test only
    python3 tools/version_matrix.py --wheel dist/tf_embed_ops-0.1.0+tf221-cp311-cp311-linux_x86_64.whl --no-table
                                                          # a wheel built elsewhere, in a new environment
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import configure  # noqa: E402

# The latest patch release of each supported minor on PyPI (both distributions publish the same patches).
LATEST_PATCH = {
    (2, 16): "2.16.2",
    (2, 17): "2.17.1",
    (2, 18): "2.18.1",
    (2, 19): "2.19.1",
    (2, 20): "2.20.0",
    (2, 21): "2.21.0",
}
TABLE_BEGIN = "<!-- version-matrix: written by tools/version_matrix.py -->"
TABLE_END = "<!-- /version-matrix -->"
HEADER = [
    "| TensorFlow | Keras | wheel | build | fast tier (from the installed wheel) | date (UTC) |",
    "|---|---|---|---|---|---|",
]
COMPILERS = re.compile(r"^(cc|c\+\+|cpp|gcc|g\+\+|clang|clang\+\+|x86_64-linux-gnu-.*|.*-g\+\+.*|.*-gcc.*|.*clang.*)$")


def supported_minors() -> list[tuple[int, int]]:
    low, high = configure.SUPPORTED_TF_MINORS
    return [(low[0], m) for m in range(low[1], high[1] + 1)]


def run(cmd: list[str], log, **kwargs) -> subprocess.CompletedProcess:
    log.write(f"\n$ {' '.join(cmd)}\n")
    log.flush()
    return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, **kwargs)


def pip_version(python: str, name: str) -> str | None:
    code = f"from importlib import metadata\ntry: print(metadata.version({name!r}))\nexcept Exception: print('')"
    out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return out or None


def compiler_free_path(directory: str, venv: str) -> str:
    """A PATH of links to everything on the current PATH except C/C++ compilers, the venv's bin first."""
    os.makedirs(directory, exist_ok=True)
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            link = os.path.join(directory, name)
            if COMPILERS.match(name) or os.path.lexists(link):
                continue
            os.symlink(os.path.join(d, name), link)
    return os.pathsep.join([os.path.join(venv, "bin"), directory])


def test_tree(directory: str, installed_package: str) -> str:
    """A copy of the checkout's tracked files whose tf_embed_ops/ is a link to the installed package (a git
    repository, for the tests that ask git about the checkout)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for rel in filter(None, files.split("\0")):
        if rel.startswith("tf_embed_ops/") or not os.path.isfile(os.path.join(ROOT, rel)):
            continue
        target = os.path.join(directory, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), target)
    os.symlink(installed_package, os.path.join(directory, "tf_embed_ops"))
    # A repository of its own (no commit needed): tests ask git what the checkout's .gitignore ignores.
    subprocess.run(["git", "init", "-q", directory], check=True)
    return directory


def junit_counts(path: str) -> dict:
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    # JUnit has no expected-failure outcome: pytest writes an xfailed test as skipped, with type "pytest.xfail".
    counts["xfailed"] = sum(1 for s in suite.iter("skipped") if s.get("type") == "pytest.xfail")
    counts["seconds"] = float(suite.get("time", 0))
    return counts


def run_minor(minor: tuple[int, int], args, log) -> dict:
    version = LATEST_PATCH[minor]
    tag = f"tf{minor[0]}{minor[1]}"
    venv = os.path.join(args.venv_root, tag)
    python = os.path.join(venv, "bin", "python")
    result = {"minor": f"{minor[0]}.{minor[1]}", "tensorflow": f"{args.distribution} {version}"}
    if args.wheel:
        venv += "-wheel"
        python = os.path.join(venv, "bin", "python")
        shutil.rmtree(venv, ignore_errors=True)  # a new environment: only TensorFlow, then the wheel
    if not os.path.exists(python):
        run([sys.executable, "-m", "venv", venv], log, check=True)
    if run([python, "-m", "pip", "install", "-q", f"{args.distribution}=={version}"], log).returncode:
        return {**result, "failed": f"`pip install {args.distribution}=={version}` failed"}
    result["keras"] = pip_version(python, "keras") or "none"

    if args.wheel:
        wheel = args.wheel  # built elsewhere: this environment only installs and tests it
        result["build_seconds"] = None
    else:
        wheels = os.path.join(args.venv_root, "wheels")
        os.makedirs(wheels, exist_ok=True)
        for old in os.listdir(wheels):
            if f"+{tag}-" in old:
                os.remove(os.path.join(wheels, old))
        start = time.monotonic()
        build = run([python, "-m", "pip", "wheel", "--no-deps", "-w", wheels, ROOT], log, env=dict(os.environ))
        result["build_seconds"] = round(time.monotonic() - start)
        built = [w for w in os.listdir(wheels) if f"+{tag}-" in w]
        if build.returncode or len(built) != 1:
            return {**result, "failed": "the wheel build failed"}
        wheel = os.path.join(wheels, built[0])
    result["wheel"] = os.path.basename(wheel)
    # Installing needs no compiler (the wheel has the libraries), so none is on PATH from here on.
    env = dict(os.environ, PATH=compiler_free_path(os.path.join(args.venv_root, f"nocc-{tag}"), venv))
    env.pop("CXX", None)
    env.pop("CC", None)
    held = os.path.join(args.venv_root, f"constraints-{tag}.txt")
    with open(held, "w", encoding="utf-8") as f:
        f.write(f"{args.distribution}=={version}\nkeras=={result['keras']}\n")
    install = [python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", wheel]
    if run(install, log, env=env).returncode:
        return {**result, "failed": "installing the wheel failed"}
    test_deps = [f"{wheel}[test]"]
    if run([python, "-m", "pip", "install", "-q", "-c", held, *test_deps], log, env=env).returncode:
        # keras-rs 0.4.0 needs a newer Keras than some minors install: the rest of the extra, without it.
        extra = subprocess.run(
            [
                sys.executable,
                os.path.join(ROOT, ".ci", "pinned.py"),
                "test",
                "pytest",
                "pytest-xdist",
                "matplotlib",
                "tensorboard",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        if run([python, "-m", "pip", "install", "-q", "-c", held, *extra], log, env=env).returncode:
            return {**result, "failed": "installing the test dependencies failed"}
        result["left_out"] = "keras-rs"
    result["keras"] = pip_version(python, "keras") or "none"
    site = subprocess.run(
        [
            python,
            "-I",
            "-c",
            "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('tf_embed_ops').origin))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=args.venv_root,
    ).stdout.strip()
    tree = test_tree(tempfile.mkdtemp(prefix=f"matrix-{tag}-", dir=args.venv_root), site)
    junit = os.path.join(tree, "junit.xml")
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", f"--junitxml={junit}"]
    if args.jobs > 1:
        pytest += ["-n", str(args.jobs)]
    start = time.monotonic()
    tests = run(pytest + args.pytest_args, log, env=dict(env, TF_CPP_MIN_LOG_LEVEL="2"), cwd=tree)
    result["test_wall_seconds"] = round(time.monotonic() - start)
    if not os.path.exists(junit):
        return {**result, "failed": f"pytest exited {tests.returncode} without a report"}
    result.update(junit_counts(junit))
    result["status"] = "pass" if tests.returncode == 0 else f"fail (pytest exit {tests.returncode})"
    if not args.keep:
        shutil.rmtree(tree, ignore_errors=True)
    return result


def row(result: dict) -> str:
    date = result["date"]
    tf = result["tensorflow"]
    if "failed" in result:
        return f"| {tf} | {result.get('keras', '')} | — | — | **{result['failed']}** | {date} |"
    skipped = result["skipped"] - result.get("xfailed", 0)
    counts = f"{result['passed']} passed, {result['failures'] + result['errors']} failed, {skipped} skipped"
    if result.get("xfailed"):
        counts += f", {result['xfailed']} xfailed"
    if result.get("left_out"):
        counts += f" ({result['left_out']} not installable: its tests skipped)"
    status = "pass" if result["status"] == "pass" else f"**{result['status']}**"
    build = "given (--wheel)" if result["build_seconds"] is None else f"{result['build_seconds']} s"
    return (
        f"| {tf} | {result['keras']} | `{result['wheel']}` | {build} | {status}: {counts}, "
        f"{result['test_wall_seconds']} s (-n {result['jobs']}) | {date} |"
    )


def write_table(doc: str, rows: dict[str, str]) -> None:
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    begin, end = text.index(TABLE_BEGIN), text.index(TABLE_END)
    old = text[begin + len(TABLE_BEGIN) : end]
    kept = {}
    for line in old.splitlines():
        m = re.match(r"^\| (?:tensorflow|tensorflow-cpu) (\d+\.\d+)\.", line)
        if m:
            kept[m.group(1)] = line
    kept.update(rows)
    ordered = [kept[k] for k in sorted(kept, key=lambda v: tuple(map(int, v.split("."))))]
    body = "\n".join(["", *HEADER, *ordered, ""])
    with open(doc, "w", encoding="utf-8") as f:
        f.write(text[: begin + len(TABLE_BEGIN)] + body + text[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minors", nargs="*", help="e.g. 2.16 2.21 (default: every supported minor)")
    parser.add_argument("--distribution", default="tensorflow-cpu", choices=["tensorflow-cpu", "tensorflow"])
    parser.add_argument("--venv-root", default=os.path.join(tempfile.gettempdir(), "tf_embed_ops_matrix"))
    parser.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers for the fast tier (default 2)")
    parser.add_argument("--no-table", action="store_true", help="do not write docs/building.md")
    parser.add_argument("--keep", action="store_true", help="keep each minor's test tree")
    parser.add_argument("--json", help="also write the results as JSON to this file")
    parser.add_argument(
        "--wheel",
        help="install and test this wheel (its minor, from its +tf<major><minor> label) in a new virtual environment "
        "instead of building one",
    )
    parser.add_argument("pytest_args", nargs="*", default=[], help="after --: more pytest arguments")
    args = parser.parse_args(argv)
    minors = supported_minors()
    if args.minors:
        minors = [configure.minor(m + ".0") for m in args.minors]
        unknown = [m for m in minors if m not in LATEST_PATCH]
        if unknown:
            parser.error(f"--minors: {unknown} are not supported minors ({sorted(LATEST_PATCH)})")
    if args.wheel:
        label = re.search(r"\+tf(\d)(\d+)-", os.path.basename(args.wheel))
        if not label:
            parser.error(f"--wheel: {args.wheel} has no +tf<major><minor> label")
        minors = [(int(label.group(1)), int(label.group(2)))]
        args.wheel = os.path.abspath(args.wheel)
    args.venv_root = os.path.abspath(args.venv_root)
    os.makedirs(args.venv_root, exist_ok=True)
    results, rows = [], {}
    for minor in minors:
        log_path = os.path.join(args.venv_root, f"tf{minor[0]}{minor[1]}.log")
        print(f"TensorFlow {minor[0]}.{minor[1]}: log {log_path}", flush=True)
        with open(log_path, "w", encoding="utf-8") as log:
            result = run_minor(minor, args, log)
        result["jobs"] = args.jobs
        result["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
        results.append(result)
        rows[result["minor"]] = row(result)
        print(rows[result["minor"]], flush=True)
        if "failed" in result or result.get("status") != "pass":
            with open(log_path, encoding="utf-8", errors="replace") as log:
                tail = log.read().splitlines()[-80:]
            print(f"  the end of {log_path}:", *tail, sep="\n  ", flush=True)
        # After each minor, so that an interrupted run keeps the rows it measured.
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(results, f, indent=1)
        if not args.no_table:
            write_table(os.path.join(ROOT, "docs", "building.md"), {result["minor"]: rows[result["minor"]]})
    return 0 if all(r.get("status") == "pass" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
