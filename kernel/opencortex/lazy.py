"""Package exports that load their module on first use (PEP 562)."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for PACKAGE: NAMES maps an exported name to the submodule
    that defines it; the submodule is imported on first use and the value kept."""
    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        setattr(importlib.import_module(package), name, value)
        return value
    return __getattr__
