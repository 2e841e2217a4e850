"""0 module globals that change after import, anywhere in ``operator/`` (issue 34): what the operator process holds
is its application object's (kube/process/application.py), what a store or an engine holds is that object's, so a test
starts one on fakes and two in one process share nothing.

Checked on the source: no ``global`` statement; no module-level name bound to a list, dict or set (a display, a
comprehension, or list()/dict()/set()/defaultdict()/... ) unless typed ``Final`` and read-only (``Mapping``,
``Sequence``, ``AbstractSet``, ``tuple``, ``frozenset``: mypy then refuses any write or rebinding); no
module-level ``None`` placeholder; no module-level object made by a call, except by the callables below, which
make values that do not change (loggers, patterns, frozensets, strings, paths, type variables, sentinels, the
functions of a decorator factory), by a class whose instances are frozen (checked on the values themselves, below),
or by a function of the module itself. ``__all__`` is a list by convention and names, not state.

The exceptions, each with why, are in ``EXCEPTED``: state that belongs to the process as such (what it imported,
what its environment armed), not to any object of it. The list only shrinks: an exception that is gone fails too.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import durable_sandbox

PACKAGE = Path(durable_sandbox.__file__).parent
MUTABLE_CALLS = frozenset({"list", "dict", "set", "defaultdict", "OrderedDict", "deque", "Counter", "bytearray"})
IMMUTABLE_MAKERS = frozenset({
    "logging.getLogger", "re.compile", "frozenset", "tuple", "TypeVar", "ParamSpec", "object", "MappingProxyType",
    "types.MappingProxyType", "Path", "struct.Struct",
    # A context variable's value is per task (set and reset by its owner); the variable itself never changes.
    "contextvars.ContextVar", "ContextVar",
    # Functions: a decorator (click's), a package's PEP 562 __getattr__ and __dir__ (lazy_names.py).
    "click.make_pass_decorator", "lazy_names",
})
# Classes whose instances cannot change (frozen dataclasses or pydantic models, or no attributes at all):
# test_the_frozen_makers_made_frozen_values checks every such module-level value.
FROZEN_MAKERS = frozenset({"RetryPolicy", "ProviderCapabilities", "SandboxServices", "_GenericJournal", "AccessRight"})
READ_ONLY_TYPES = ("Mapping", "Sequence", "AbstractSet", "Collection", "tuple", "frozenset")
MUTABLE_NODES = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)

# Module state of the process as such, each with why it is not an object's (path::name -> why).
EXCEPTED = {
    "engine/workflow.py::_REGISTRY": "the @workflow decorator registers a function when its module is imported: "
                                     "the catalogue is the process's imported modules, as sys.modules is",
    "engine/step_calls.py::_observed": "what the process learnt of each step function's code object (quick enough "
                                    "to run inline or not), keyed by code objects that are the process's own; "
                                    "it chooses where a step runs, never what it records",
    "engine/faults.py::_counts": "fault points armed by the process's environment (DURABLE_SANDBOX_FAULT) for crash "
                                 "tests: how often each was reached in this process",
    "engine/faults.py::_paused": "pause points armed by the process's environment (DURABLE_SANDBOX_PAUSE): held once "
                                 "per process",
    "providers/registry.py::_cache": "one scan of the installed distributions' entry points per process (and per "
                                     "search path): what is installed is the process's environment",
}


def _read_only_final(annotation: ast.expr | None) -> bool:
    text = ast.unparse(annotation) if annotation is not None else ""
    return text.startswith("Final[") and text[len("Final["):].startswith(READ_ONLY_TYPES)


def _makes_a_string(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr in ("join", "format")
            and isinstance(func.value, ast.Constant) and isinstance(func.value.value, str))


def _problem(node: ast.Assign | ast.AnnAssign, local_functions: set[str]) -> str | None:
    value = node.value
    annotation = node.annotation if isinstance(node, ast.AnnAssign) else None
    if value is None:
        return None
    if isinstance(value, ast.Constant) and value.value is None:
        return "a None placeholder (set later?): the application object owns what the process sets"
    mutable = isinstance(value, MUTABLE_NODES) or (
        isinstance(value, ast.Call) and ast.unparse(value.func).rsplit(".", 1)[-1] in MUTABLE_CALLS)
    if mutable:
        return None if _read_only_final(annotation) else "a mutable container: type it Final[Mapping/Sequence/...]"
    if isinstance(value, ast.Call) and not _makes_a_string(value):
        callee = ast.unparse(value.func)
        if callee not in IMMUTABLE_MAKERS | FROZEN_MAKERS and callee not in local_functions:
            return f"an object made by {callee}(): process state belongs to the application object"
    return None


def _assignments(tree: ast.Module) -> list[tuple[ast.Assign | ast.AnnAssign, list[str]]]:
    found: list[tuple[ast.Assign | ast.AnnAssign, list[str]]] = []
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            found.append((node, [ast.unparse(t) for t in (node.targets if isinstance(node, ast.Assign)
                                                          else [node.target])]))
    return found


def module_globals_that_change(root: Path, excepted: dict[str, str] | None = None) -> list[str]:
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        where = path.relative_to(root).as_posix()
        found += [f"{where}:{n.lineno} global {', '.join(n.names)}" for n in ast.walk(tree) if isinstance(n, ast.Global)]
        local_functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        for node, names in _assignments(tree):
            if names == ["__all__"] or any(f"{where}::{name}" in (excepted or {}) for name in names):
                continue
            problem = _problem(node, local_functions)
            if problem is not None:
                found.append(f"{where}:{node.lineno} {', '.join(names)}: {problem}")
    return found


def _frozen(value: Any) -> bool:
    if isinstance(value, BaseModel):
        return bool(value.model_config.get("frozen"))
    if dataclasses.is_dataclass(value):
        return bool(type(value).__dataclass_params__.frozen)  # type: ignore[attr-defined]
    return not hasattr(value, "__dict__") and getattr(type(value), "__slots__", None) == ()


def test_no_module_global_changes_after_import() -> None:
    found = module_globals_that_change(PACKAGE, EXCEPTED)
    assert not found, "\n".join(found)


def test_the_exceptions_are_still_module_state() -> None:
    names = {f"{path.relative_to(PACKAGE).as_posix()}::{name}"
             for path in PACKAGE.rglob("*.py") for _, names in _assignments(ast.parse(path.read_text()))
             for name in names}
    assert set(EXCEPTED) <= names, f"strike off EXCEPTED what is gone: {sorted(set(EXCEPTED) - names)}"


def test_the_frozen_makers_made_frozen_values() -> None:
    checked = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        for node, names in _assignments(ast.parse(path.read_text())):
            if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) in FROZEN_MAKERS:
                module = importlib.import_module("durable_sandbox." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
                for name in names:
                    assert _frozen(getattr(module, name)), f"{path.relative_to(PACKAGE)}:{node.lineno} {name} can change"
                    checked += 1
    assert checked >= len(FROZEN_MAKERS)


def test_the_check_finds_each_kind(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from typing import Final, Mapping\nimport logging\n"
        "HOOKS = []\nconfig = Config()\n_current = None\nTABLE = {'a': 1}\nSEEN = set()\n"
        "def touch():\n    global _current\n    _current = 1\n"
        "def make():\n    return 1\n"
        "OK: Final[Mapping[str, int]] = {'a': 1}\nlog = logging.getLogger(__name__)\nMADE = make()\n"
        "__all__ = ['touch']\nNUMBER = 3\nJOINED = ', '.join(['a', 'b'])\nKEPT = {}\n")
    found = module_globals_that_change(tmp_path, {"m.py::KEPT": "why"})
    assert [line.split(" ", 1)[1].split(":")[0] for line in found] == [
        "global _current", "HOOKS", "config", "_current", "TABLE", "SEEN"]


def test_frozen_tells_a_frozen_value_from_one_that_can_change() -> None:
    @dataclasses.dataclass(frozen=True)
    class Frozen:
        x: int = 1

    @dataclasses.dataclass
    class Loose:
        x: int = 1

    class Stateless:
        __slots__ = ()

    assert _frozen(Frozen()) and _frozen(Stateless()) and not _frozen(Loose()) and not _frozen(object.__new__(Loose))
