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

