"""Which workflow code the operator may import: an entrypoint ``module:attr.path`` names a module of the
operator's allowed modules (``dsb operator --workflows``), and every name on the attribute path is looked up
only in what those modules define.

Looking a name up runs code of whatever holds it (a module's ``__getattr__``, a class's descriptors): so the
path is walked one step at a time and stops, before the lookup, at anything defined elsewhere. An allowed module
that imports another (``import other``) does not make ``allowed:other.workflow`` reachable; the workflow itself
must be defined in an allowed module too (checked by kube/spec/plan.py once it is resolved).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["defined_in", "entrypoint_allowed", "foreign_step", "module_allowed"]


def module_allowed(module: str, allowed_modules: Sequence[str]) -> bool:
    """``pkg.flows`` is allowed by ``pkg.flows`` (and by ``pkg``: a package allows its submodules)."""
    return any(module == m or module.startswith(m + ".") for m in allowed_modules)


def entrypoint_allowed(entrypoint: str, allowed_modules: Sequence[str]) -> bool:
    return module_allowed(entrypoint.partition(":")[0], allowed_modules)


def defined_in(obj: Any) -> str:
    """The module ``obj`` comes from: a module's own name, else its ``__module__`` (a class's, a function's, an
    instance's class's), else its type's."""
    if isinstance(obj, ModuleType):
        return obj.__name__
    return str(getattr(obj, "__module__", None) or type(obj).__module__)


def foreign_step(entrypoint: str, allowed_modules: Sequence[str]) -> tuple[str, str] | None:
    """The first name on ``entrypoint``'s attribute path whose holder is defined outside the allowed modules, and
    that module: ``("other", "pkg.other")``; None when every step stays inside (or the path cannot be followed:
    resolving it then says what is missing). Imports the entrypoint's module, which must be allowed."""
    module_name, _, attrs = entrypoint.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError:
        return None
    walked: list[str] = []
    for part in attrs.split(".")[:-1]:
        obj = getattr(obj, part, None)
        walked.append(part)
        if obj is None:
            return None
        source = defined_in(obj)
        if not module_allowed(source, allowed_modules):
            return f"{module_name}:{'.'.join(walked)}", source
    return None
