"""Issue 21: no function in kube/ or engine/ over about 80 lines without a reason written beside it (a
``# Long on purpose:`` comment right above its ``def``), so a long function is a decision, not a drift."""

from __future__ import annotations

import ast
from pathlib import Path

import durable_sandbox

LIMIT = 80
PACKAGE = Path(durable_sandbox.__file__).parent
REASON = "# Long on purpose:"


def long_functions_without_reason(root: Path) -> list[str]:
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.end_lineno is None:
                continue
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if node.end_lineno - node.lineno + 1 <= LIMIT:
                continue
            above = [line.strip() for line in lines[max(0, first - 4):first - 1]]
            if not any(line.startswith(REASON) for line in above):
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} "
                             f"({node.end_lineno - node.lineno + 1} lines)")
    return found


def test_long_functions_in_kube_and_engine_say_why() -> None:
    for wing in ("kube", "engine"):
        assert long_functions_without_reason(PACKAGE / wing) == []


def test_the_check_finds_a_long_function_without_a_reason(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT + 1))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n")
    assert [f.split(" ")[1] for f in long_functions_without_reason(tmp_path)] == ["long"]
    (tmp_path / "m.py").write_text(f"{REASON} test.\ndef long():\n{body}\n")
    assert long_functions_without_reason(tmp_path) == []
