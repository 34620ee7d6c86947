"""A package's names re-exported on first use (PEP 562 `__getattr__`), so that importing the package for one
light name (a config class) does not import what its other modules need (torch)."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_getattr(package: str, exports: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The `__getattr__` of `package`: name -> `package.<exports[name]>.<name>`, imported on first use and
    then kept in `namespace` (the package's globals), so each is imported once."""

    def __getattr__(name: str) -> Any:
        mod = exports.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{mod}"), name)
        namespace[name] = value
        return value

    return __getattr__
