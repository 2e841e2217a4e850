"""The engine's extension points are typed (engine/extensions.py): a misspelt one is a type error where it is
written and where it is read, found by mypy, never a hook that silently does not run.

mypy is run on small programs that use the extension points as the operator and `dsb` do: the correct one
passes; each misspelt or mistyped one fails, naming what is wrong."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from durable_sandbox.engine.extensions import Extensions
from durable_sandbox.sandboxes.session import SandboxServices
from durable_sandbox.workflows.sandbox_agent import AgentServices

ROOT = Path(__file__).resolve().parents[2]

HEADER = """\
from collections.abc import Mapping
import durable_sandbox
from durable_sandbox.sandboxes.session import SandboxServices
from durable_sandbox.workflows.sandbox_agent import AgentServices

def owner(run_id: str) -> str | None:
    return f"team/{run_id}"

def env(run_id: str) -> Mapping[str, str] | None:
    return {"0.env.TOKEN": "x"}
"""

PROGRAMS = {
    "correct": """
        engine = durable_sandbox.Engine(extensions=[SandboxServices(owner=owner, labels={"a": "b"}),
                                                    AgentServices(env_values=env)])
        def read(ctx: durable_sandbox.Context) -> None:
            values = AgentServices.of(ctx).env_values
            if values is not None:
                values(ctx.run_id)
            found = ctx.operations.extensions.get(SandboxServices)
            labels: Mapping[str, str] = found.labels if found is not None else {}
        """,
    "misspelt_writer": """
        durable_sandbox.Engine(extensions=[SandboxServices(ownr=owner)])
        """,
    "misspelt_reader": """
        def read(ctx: durable_sandbox.Context) -> None:
            AgentServices.of(ctx).env_value
        """,
    "mistyped_value": """
        durable_sandbox.Engine(extensions=[SandboxServices(labels=["not", "a", "mapping"])])
        """,
    "misspelt_engine_keyword": """
        durable_sandbox.Engine(extension=[AgentServices(env_values=env)])
        """,
}

EXPECTED = {
    "misspelt_writer": r'Unexpected keyword argument "ownr" for "SandboxServices"',
    "misspelt_reader": r'"AgentServices" has no attribute "env_value"',
    "mistyped_value": r'Argument "labels" to "SandboxServices" has incompatible type',
    "misspelt_engine_keyword": r'Unexpected keyword argument "extension" for "Engine"',
}


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    where = tmp_path_factory.mktemp("extension_programs")
    for name, body in PROGRAMS.items():
        (where / f"{name}.py").write_text(HEADER + textwrap.dedent(body))
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--no-error-summary",
         "--cache-dir", str(ROOT / ".mypy_cache"), *(str(where / f"{n}.py") for n in PROGRAMS)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1: type errors found (what the misspelt programs are for)
    return proc.stdout


def errors_of(output: str, program: str) -> list[str]:
    return [line for line in output.splitlines() if f"{program}.py:" in line and ": error:" in line]


def test_the_correct_use_of_the_extension_points_type_checks(mypy_output: str) -> None:
    assert errors_of(mypy_output, "correct") == [], mypy_output


@pytest.mark.parametrize("program", sorted(EXPECTED))
def test_mypy_fails_on_a_misspelt_extension_point(mypy_output: str, program: str) -> None:
    errors = errors_of(mypy_output, program)
    assert any(re.search(EXPECTED[program], e) for e in errors), f"{program}: {errors or mypy_output}"


def test_one_value_per_type_read_back_by_its_type() -> None:
    services = SandboxServices(labels={"a": "b"})
    extensions = Extensions([services, AgentServices()])
    assert extensions.get(SandboxServices) is services
    assert Extensions().get(SandboxServices) is None
    with pytest.raises(ValueError, match="two extension values of type SandboxServices"):
        Extensions([services, SandboxServices()])
