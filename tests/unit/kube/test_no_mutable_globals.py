"""0 module globals in kube/ that change after import (issue 34): what the operator process holds is its application
object's (kube/process/application.py), so a test starts one on fakes and two in one process share nothing.

Checked on the source: no ``global`` statement; no module-level name bound to a list, dict or set (a display, a
comprehension, or list()/dict()/set()/defaultdict()/... ) unless typed ``Final`` and read-only (``Mapping``,
``Sequence``, ``AbstractSet``, ``tuple``, ``frozenset``: mypy then refuses any write or rebinding); no
module-level ``None`` placeholder; no module-level object made by a call, except by the callables below, which
make values that do not change (loggers, patterns, frozensets, type variables, sentinels) or by a function of
the module itself. ``__all__`` is a list by convention and names, not state.
"""

from __future__ import annotations

import ast
from pathlib import Path

import durable_sandbox

KUBE = Path(durable_sandbox.__file__).parent / "kube"
MUTABLE_CALLS = frozenset({"list", "dict", "set", "defaultdict", "OrderedDict", "deque", "Counter", "bytearray"})
IMMUTABLE_MAKERS = frozenset({"logging.getLogger", "re.compile", "frozenset", "tuple", "TypeVar", "object",
                              "MappingProxyType", "types.MappingProxyType"})
READ_ONLY_TYPES = ("Mapping", "Sequence", "AbstractSet", "Collection", "tuple", "frozenset")
MUTABLE_NODES = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)


def _read_only_final(annotation: ast.expr | None) -> bool:
    text = ast.unparse(annotation) if annotation is not None else ""
    return text.startswith("Final[") and text[len("Final["):].startswith(READ_ONLY_TYPES)


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
    if isinstance(value, ast.Call):
        callee = ast.unparse(value.func)
        if callee not in IMMUTABLE_MAKERS and callee not in local_functions:
            return f"an object made by {callee}(): process state belongs to the application object"
    return None


def module_globals_that_change(root: Path) -> list[str]:
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        where = path.relative_to(root).as_posix()
        found += [f"{where}:{n.lineno} global {', '.join(n.names)}" for n in ast.walk(tree) if isinstance(n, ast.Global)]
        local_functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        for node in tree.body:
            if not isinstance(node, ast.Assign | ast.AnnAssign):
                continue
            names = [ast.unparse(t) for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
            problem = None if names == ["__all__"] else _problem(node, local_functions)
            if problem is not None:
                found.append(f"{where}:{node.lineno} {', '.join(names)}: {problem}")
    return found


def test_kube_has_no_module_global_that_changes_after_import() -> None:
    found = module_globals_that_change(KUBE)
    assert not found, "\n".join(found)


def test_the_check_finds_each_kind(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from typing import Final, Mapping\nimport logging\n"
        "HOOKS = []\nconfig = Config()\n_current = None\nTABLE = {'a': 1}\nSEEN = set()\n"
        "def touch():\n    global _current\n    _current = 1\n"
        "def make():\n    return 1\n"
        "OK: Final[Mapping[str, int]] = {'a': 1}\nlog = logging.getLogger(__name__)\nMADE = make()\n"
        "__all__ = ['touch']\nNUMBER = 3\n")
    found = module_globals_that_change(tmp_path)
    assert [line.split(" ", 1)[1].split(":")[0] for line in found] == [
        "global _current", "HOOKS", "config", "_current", "TABLE", "SEEN"]
