"""Lazy package exports (PEP 562): a package names its public objects and the modules they live
in, and each module is imported on first use. Keeps plain-data users of a package (the
telemetry writer process, the UI, notebooks reading a store) from importing torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(namespace: dict[str, Any], exports: dict[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for a package whose ``exports`` map names to module paths.

    Args:
        namespace: the package's ``globals()``; a loaded name is cached there.
        exports: public name -> the module that defines it.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
