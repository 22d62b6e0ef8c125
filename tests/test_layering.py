"""The import rules of the code base, checked from the source (no module is imported):

1. Floors: every module of tf_embed_ops/ and benchmarks/ stands on a declared floor (`FLOORS`, ground first) and
   imports only modules of its own floor or lower ones, lazy imports inside functions included, and so are
   `importlib.import_module("...")` / `__import__("...")` calls with a literal name. No two modules import each
   other, directly or around a cycle (lazily or not): a module that needs a part of another that needs it gets
   that part moved down into a module of its own.
2. Private names stay home: no module imports another module's `_private` function, class or constant, and a
   `_private` module is imported only from inside the package that holds it (tf_embed_ops/_loader.py by the
   library, never by benchmarks/). Private *attribute* access (`module._name`, `obj._name`) is ruff's SLF rule
   (pyproject.toml), which CI runs with the lint stage.
3. Tests: no test module imports another test module; shared helpers live in support modules.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("tf_embed_ops", "benchmarks")

# Ground first. An entry names a module or a package (then every module under it); the longest entry that
# matches a module gives its floor. A module may import its own floor or a lower one.
FLOORS: tuple[tuple[str, ...], ...] = (
    # What everything stands on: TensorFlow's internals, the loader, table options, the feature nest.
    (
        "tf_embed_ops._tf_compat",
        # The package faces' names loaded on first use (standard library only).
        "tf_embed_ops._lazy_exports",
        "tf_embed_ops._xla",
        "tf_embed_ops._loader",
        # The compiled config view (pybind11), which the loader imports.
        "tf_embed_ops._config",
        "tf_embed_ops.table_config",
        "tf_embed_ops.low_precision",
        "tf_embed_ops._optimizer_schema",
        "tf_embed_ops.features",
        "tf_embed_ops.update_trigger",
        # The one atomic write of every file and directory other processes read (standard library only), and how a
        # checkpoint delta stores 16-bit values (numpy + stock TF).
        "tf_embed_ops.formats",
        # Serving rows: encodings, pruning, export metadata, a static table's serving form (numpy + stock TF).
        "tf_embed_ops.serving.quantization",
        "tf_embed_ops.serving.prune",
        "tf_embed_ops.serving.metadata",
        "tf_embed_ops.serving.tables",
        # A tiered table's serving form and the writer of its rows into a SavedModel (stock TF; the tables it reads
        # come from above, duck-typed).
        "tf_embed_ops.serving.streamed",
        # The delta file (numpy + stock TF).
        "tf_embed_ops.serving.delta_format",
        # The tiered storage option (`te.Tiered`), which every table config takes.
        "tf_embed_ops.tiered.config",
        # The table backend protocol, the walk of one lookup and one update across groups, the serving form's base,
        # a numbered-row table's part of an incremental checkpoint chain and its tracker's view (numpy + stock TF).
        "tf_embed_ops.backends",
    ),
    # The op wrappers and the SparseCore layout.
    ("tf_embed_ops.embedding_ops", "tf_embed_ops.sparse_accumulator", "tf_embed_ops.sparse_core"),
    # Optimizers: the schema's classes and the Keras mapping onto them.
    ("tf_embed_ops.optimizers", "tf_embed_ops.optimizer_mapping"),
    # The configuration proto and its loader.
    ("tf_embed_ops.config",),
    # Dynamic and tiered tables (their ops, tables and the groups the mid-level classes hand them to).
    ("tf_embed_ops.dynamic", "tf_embed_ops.tiered"),
    # The parts every front end composes, and the in-memory tables' backend (over the mid-level's variables).
    ("tf_embed_ops.engine", "tf_embed_ops.backends.static"),
    # The mid-level API.
    ("tf_embed_ops.tpu_embedding",),
    # Front ends built on it.
    # (`tf_embed_ops.serving`: the servable and the publisher build on the exporter and the tracker, which reads
    # the mid-level tables; the incremental checkpoints build on the tracker.)
    (
        "tf_embed_ops.tpu_embedding_v2",
        "tf_embed_ops.keras",
        "tf_embed_ops.serving",
        "tf_embed_ops.tracking",
        "tf_embed_ops.checkpoint",
    ),
    ("tf_embed_ops.distribute",),
    # TFRA's `dynamic_embedding` API over the dynamic tables and their Keras training (`de = tf_embed_ops.tfra`).
    ("tf_embed_ops.tfra",),
    # Programs and the package's face.
    ("tf_embed_ops.examples", "tf_embed_ops.__main__", "tf_embed_ops"),
    ("benchmarks",),
)
# Entries that name exactly one module, not the package below it (the package's __init__ is its face).
EXACT = {"tf_embed_ops"}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _is_private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def floor_of(module: str) -> int | None:
    best, floor = -1, None
    for index, entries in enumerate(FLOORS):
        for entry in entries:
            matches = module == entry or (entry not in EXACT and module.startswith(entry + "."))
            if matches and len(entry) > best:
                best, floor = len(entry), index
    return floor


def _dynamic_import(node: ast.AST) -> str | None:
    """The module `importlib.import_module("a.b")`, `import_module("a.b")` or `__import__("a.b")` names, else None."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    value = node.args[0].value
    if name in ("import_module", "__import__") and isinstance(value, str) and not value.startswith("."):
        return value
    return None


def imports_of(module: str, source: str) -> list[tuple[int, str, str | None]]:
    """`[(line, imported module, imported non-module name or None)]` of the project's own imports, the literal
    `importlib.import_module` / `__import__` calls included."""
    out = []
    for node in ast.walk(ast.parse(source)):
        dynamic = _dynamic_import(node)
        if dynamic is not None and dynamic.split(".")[0] in PACKAGES:
            out.append((node.lineno, dynamic, None))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] in PACKAGES]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, `level - 1` packages up
                is_package = (ROOT.joinpath(*module.split(".")) / "__init__.py").is_file()
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.append((node.lineno, full, None) if _is_module(full) else (node.lineno, base, alias.name))
    return out


def violations(module: str, source: str) -> list[str]:
    """Every import of `module` (its source given) that breaks rule 1 or 2."""
    found = []
    own_floor = floor_of(module)
    if own_floor is None:
        return [f"{module}: no floor declared for it in FLOORS"]
    for line, target, name in imports_of(module, source):
        where = f"{module}:{line}"
        target_floor = floor_of(target)
        if target_floor is None:
            found.append(f"{where}: {target} has no floor declared in FLOORS")
        elif target_floor > own_floor:
            found.append(f"{where}: imports {target} (floor {target_floor + 1}) from floor {own_floor + 1}")
        if name is not None and _is_private(name):
            found.append(f"{where}: imports the private name {name} of {target}")
        parts = target.split(".")
        for i, part in enumerate(parts):
            owner = ".".join(parts[:i])
            if _is_private(part) and not (module == owner or module.startswith(owner + ".")):
                found.append(f"{where}: imports {target}, private to {owner}")
                break
    return found


def _sources(*roots: str) -> list[pathlib.Path]:
    return sorted(p for root in roots for p in (ROOT / root).rglob("*.py"))


def test_every_import_stands_on_its_floor_and_keeps_private_names_home():
    modules = _sources(*PACKAGES)
    assert len(modules) > 50  # the walk found the code base
    found = []
    for path in modules:
        found += violations(_module_name(path), path.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules of each import cycle in `graph` ({module: modules it imports}), each cycle sorted (Tarjan's
    strongly connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_no_two_modules_import_each_other():
    graph = {}
    for path in _sources(*PACKAGES):
        module = _module_name(path)
        graph[module] = {t for _, t, _ in imports_of(module, path.read_text(encoding="utf-8")) if t != module}
    cycles = import_cycles(graph)
    assert not cycles, "import cycles (lazy imports included):\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_cycles_through_lazy_and_importlib_imports():
    sources = {
        "tf_embed_ops.keras.a": "def f():\n    import tf_embed_ops.keras.b",
        "tf_embed_ops.keras.b": "import importlib\nM = importlib.import_module('tf_embed_ops.keras.c')",
        "tf_embed_ops.keras.c": "__import__('tf_embed_ops.keras.a')",
        "tf_embed_ops.keras.d": "import tf_embed_ops.keras.a",
    }
    graph = {m: {t for _, t, _ in imports_of(m, src)} for m, src in sources.items()}
    assert import_cycles(graph) == [["tf_embed_ops.keras.a", "tf_embed_ops.keras.b", "tf_embed_ops.keras.c"]]


def test_no_test_module_imports_another():
    found = []
    for path in _sources("tests"):
        module = _module_name(path)
        for line, target, _ in imports_of(module, path.read_text(encoding="utf-8")):
            if target.split(".")[0] == "tests" and target.split(".")[-1].startswith("test_"):
                found.append(
                    f"{module}:{line}: imports the test module {target} (move what it shares to a support module)"
                )
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "module, source, expected",
    [
        # An upward import, eager or lazy.
        ("tf_embed_ops.dynamic.engine", "from tf_embed_ops.distribute import partition", "floor 9) from floor 5"),
        ("tf_embed_ops.tpu_embedding", "def f():\n    from tf_embed_ops.keras import layer", "floor 8) from floor 7"),
        # ... also through importlib or __import__ with a literal name.
        (
            "tf_embed_ops.engine.lookup",
            "import importlib\nimportlib.import_module('tf_embed_ops.keras')",
            "floor 8) from",
        ),
        ("tf_embed_ops.features", "def f():\n    return __import__('tf_embed_ops.config')", "floor 4) from floor 1"),
        # A private function of another module, and a private module of another package.
        ("tf_embed_ops.dynamic.ops", "from tf_embed_ops.embedding_ops import _combiners", "private name _combiners"),
        ("benchmarks.ours", "from tf_embed_ops import _optimizer_schema", "private to tf_embed_ops"),
        ("tf_embed_ops.keras.layer", "import tf_embed_ops.config._resolve", "private to tf_embed_ops.config"),
        ("tf_embed_ops.nothing_here", "", "no floor declared"),
    ],
)
def test_the_checker_finds_what_the_rules_forbid(module, source, expected):
    assert any(expected in v for v in violations(module, source)), violations(module, source)


@pytest.mark.parametrize(
    "module, source",
    [
        ("tf_embed_ops.distribute.sharded_embedding", "from tf_embed_ops.dynamic import engine"),
        ("tf_embed_ops.config._inverse", "from tf_embed_ops.config import _view"),  # its own package's private
        ("tf_embed_ops.dynamic.table", "from . import checkpoint_check"),
        ("tf_embed_ops.config._build", "from tf_embed_ops.config._resolve import resolve_tables"),
        ("benchmarks.ours", "from tf_embed_ops import config"),
    ],
)
def test_the_checker_allows_what_the_rules_allow(module, source):
    assert violations(module, source) == []
