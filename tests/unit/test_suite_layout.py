"""The test suite's own rules, checked: one ``dsb()`` helper (tests/dsb.py), one ``home`` fixture
(tests/unit/conftest.py), one ``free_port`` (tests/ports.py), one clock (``durable_sandbox.testing.FakeClock``), no
test module importing another test module or a conftest (shared code lives in support modules), and the kube unit
tests in tests/unit/kube."""

from __future__ import annotations

import ast
import functools

from tests.dsb import ROOT

TESTS = ROOT / "tests"


@functools.cache  # parsed once for every rule
def modules() -> list[tuple[str, ast.Module]]:
    return [(p.relative_to(ROOT).as_posix(), ast.parse(p.read_text())) for p in sorted(TESTS.rglob("*.py"))]


def defined(tree: ast.Module, name: str) -> bool:
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name for n in ast.walk(tree))


def test_one_dsb_helper_and_one_home_fixture() -> None:
    assert [path for path, tree in modules() if defined(tree, "dsb")] == ["tests/dsb.py"]
    assert [path for path, tree in modules() if defined(tree, "home")] == ["tests/unit/conftest.py"]


def test_one_free_port_one_clock_and_no_conftest_imported() -> None:
    assert [path for path, tree in modules() if defined(tree, "free_port")] == ["tests/ports.py"]
    clocks = [f"{path}: {n.name}" for path, tree in modules() for n in ast.walk(tree)
              if isinstance(n, ast.ClassDef) and n.name.endswith("Clock")]
    assert clocks == [], "use durable_sandbox.testing.FakeClock:\n" + "\n".join(clocks)
    importing = [path for path, tree in modules() for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and (n.module or "").rsplit(".", 1)[-1] == "conftest"]
    assert importing == [], "a conftest is not a library: import its helpers from a support module"


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

