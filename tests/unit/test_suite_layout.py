"""The test suite's own rules, checked: one ``dsb()`` helper (tests/dsb.py), one ``home`` fixture
(tests/unit/conftest.py), no test module importing another test module (shared code lives in support
modules and conftest files), and the kube unit tests in tests/unit/kube."""

from __future__ import annotations

import ast

from tests.dsb import ROOT

TESTS = ROOT / "tests"


def modules() -> list[tuple[str, ast.Module]]:
    return [(p.relative_to(ROOT).as_posix(), ast.parse(p.read_text())) for p in sorted(TESTS.rglob("*.py"))]


def defined(tree: ast.Module, name: str) -> bool:
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name for n in ast.walk(tree))


def test_one_dsb_helper_and_one_home_fixture() -> None:
    assert [path for path, tree in modules() if defined(tree, "dsb")] == ["tests/dsb.py"]
    assert [path for path, tree in modules() if defined(tree, "home")] == ["tests/unit/conftest.py"]


def test_no_test_module_imports_another() -> None:
    found = []
    for path, tree in modules():
        for node in ast.walk(tree):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path}: {n}" for n in names if n.startswith("tests.") and n.rsplit(".", 1)[-1].startswith("test_")]
    assert not found, "move what is shared into a support module or a conftest:\n" + "\n".join(found)


def test_the_kube_unit_tests_are_in_their_own_folder() -> None:
    kube = {p.name for p in (TESTS / "unit" / "kube").glob("test_*.py")}
    assert {"test_status.py", "test_crds.py", "test_fresh_spec.py"} <= kube
    stray = [p.name for p in (TESTS / "unit").glob("test_kube_*.py")]
    assert stray == []


# "About 80 lines": a function longer than this in kube/ or engine/ says why beside it (a comment right above).
LONGEST = 85
# Not yet explained or split, and why: kube/store.py is issue 20's (the journal's new home), edited by its owner.
PENDING = {"operator/durable_sandbox/kube/store.py:commit"}


def test_long_functions_of_kube_and_engine_say_why() -> None:
    package = ROOT / "operator" / "durable_sandbox"
    unexplained = []
    for path in sorted([*(package / "kube").rglob("*.py"), *(package / "engine").rglob("*.py")]):
        source = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(source))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if (length > LONGEST and not source[first - 2].strip().startswith("#")
                    and f"{path.relative_to(ROOT)}:{node.name}" not in PENDING):
                unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert not unexplained, "split these, or say beside them why not:\n" + "\n".join(unexplained)
