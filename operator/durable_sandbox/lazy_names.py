"""Public names a package re-exports without importing their modules up front (PEP 562).

A package's ``__init__`` names each public name's defining module; the name is imported on first use. So
importing one submodule (``durable_sandbox.providers.contract``) does not load everything the package
re-exports (the engine), and a kit's names load only what the kit in use needs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, namespace: dict[str, Any],
               origin: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package`` (whose globals are ``namespace``), resolving each
    name of ``origin`` (public name -> defining module) on first use."""

    def getattr_(name: str) -> Any:
        module = origin.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}; its public names are {sorted(origin)}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # resolved once: later lookups do not come back here
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *origin})

    return getattr_, dir_
