"""Running `dsb` in-process for the CLI tests, against a store of the test's own."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from durable_sandbox.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]


def isolate(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default store under ``home``; the repository root as the current directory, so
    module:function references (tests.unit.cli_flows:...) resolve."""
    monkeypatch.setenv("DURABLE_SANDBOX_HOME", str(home))
    monkeypatch.chdir(ROOT)
    return home


def dsb(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]
