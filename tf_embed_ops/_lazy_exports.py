"""A package face whose names load on first use (PEP 562), so `import tf_embed_ops.dynamic` does not import
TensorFlow or the op library until a name that needs them is asked for."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

# name -> (module, attribute); attribute None: the name is the module itself.
Exports = Mapping[str, "tuple[str, str | None]"]


def lazy_exports(
    package: str, exports: Exports, refusal: Callable[[str], Exception | None] | None = None
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """`__all__`, `__getattr__` and `__dir__` for `package` (its `__name__`): `__getattr__` imports the module a name
    lives in on first use and keeps the value in the package, so it is resolved once. A name the package does not
    have raises `refusal(name)` where that gives an error (a name refused with a reason), else `AttributeError`."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            module_name, attribute = exports[name]
            module = importlib.import_module(module_name)
            value = module if attribute is None else getattr(module, attribute)
            setattr(sys.modules[package], name, value)
            return value
        error = None if refusal is None else refusal(name)
        if error is not None:
            raise error
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return sorted(exports), __getattr__, __dir__
