"""tf_embed_ops/optimizers.pyi is what tools/generate_optimizer_stub.py renders from the optimizer schema, and it
declares every optimizer class with the signature the module builds at import."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os

from tf_embed_ops import optimizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _generator():
    path = os.path.join(ROOT, "tools", "generate_optimizer_stub.py")
    spec = importlib.util.spec_from_file_location("generate_optimizer_stub", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stub_tree() -> ast.Module:
    with open(os.path.join(ROOT, "tf_embed_ops", "optimizers.pyi"), encoding="utf-8") as f:
        return ast.parse(f.read())


def test_committed_stub_is_what_the_schema_renders():
    generator = _generator()
    with open(generator.STUB_PATH, encoding="utf-8") as f:
        committed = f.read()
    assert committed == generator.render(), "stale: run python tools/generate_optimizer_stub.py and commit the stub"
    assert generator.main(["--check"]) == 0


def test_stub_declares_every_public_name_with_the_runtime_signature():
    tree = _stub_tree()
    declared = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    (all_node,) = [n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "__all__"]
    assert ast.literal_eval(all_node.value) == optimizers.__all__
    assert set(optimizers.CATALOGUE.values())  # the schema has catalogue entries; the loop below can fail
    for cls in optimizers.CATALOGUE.values():
        assert cls.__name__ in declared, cls.__name__
        (init,) = [f for f in declared[cls.__name__].body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]
        stub_args = init.args.args[1:]
        runtime = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name not in ("self", "kwargs")]
        assert [a.arg for a in stub_args] == [p.name for p in runtime], cls.__name__
        defaults = [ast.literal_eval(d) for d in init.args.defaults]
        expected = [p.default for p in runtime if p.default is not inspect.Parameter.empty]
        assert defaults == expected, cls.__name__
        assert init.args.kwarg is not None and init.args.kwarg.arg == "kwargs"
        assert ast.get_docstring(declared[cls.__name__]).split()[0] == inspect.getdoc(cls).split()[0]


def test_check_mode_fails_on_a_stale_stub(tmp_path, monkeypatch):
    generator = _generator()
    stale = tmp_path / "optimizers.pyi"
    stale.write_text(generator.render().replace("class Momentum(", "class Momentum2("), encoding="utf-8")
    monkeypatch.setattr(generator, "STUB_PATH", str(stale))
    assert generator.main(["--check"]) == 1
