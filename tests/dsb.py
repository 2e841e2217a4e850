"""`dsb` as every tier of the tests runs it: one helper.

In process by default, through click's CliRunner: the same command code, at a fraction of a process start.
As the installed console script in a child process (``process=True``) when the test needs a process of its
own: a fault point that kills it (``fault``), a store or a cluster another process shares, what a shell sees.
Either way the answer is a :class:`Ran` (``exit_code``, also as ``returncode``; ``stdout``, ``stderr``).

``home`` is the DURABLE_SANDBOX_HOME the command sees (default: the test's, see tests/unit/conftest.py),
``store`` is prepended as ``--store``, ``env`` adds variables; a fault spec is never inherited by accident.
``cwd`` runs it in another directory (in a child process: which modules import depends on it; default: the
repository root).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DSB = str(Path(sys.executable).parent / "dsb")  # the console script of the environment running the tests
FAULT = "DURABLE_SANDBOX_FAULT"

__all__ = ["DSB", "ROOT", "Ran", "dsb", "lines"]


@dataclass(frozen=True)
class Ran:
    exit_code: int
    stdout: str
    stderr: str
    output: str  # what a terminal shows: both streams

    @property
    def returncode(self) -> int:
        return self.exit_code


def dsb(*args: str, input: str | None = None, home: Path | None = None, store: Path | None = None,
        env: Mapping[str, str] | None = None, fault: str | None = None, process: bool = False,
        timeout: float = 180, cwd: Path | None = None) -> Ran:
    argv = [*(["--store", str(store)] if store is not None else []), *args]
    overrides = {**({"DURABLE_SANDBOX_HOME": str(home)} if home is not None else {}), **(env or {})}
    if not process and fault is None and cwd is None:
        return _in_process(argv, input, overrides)
    environ = {**os.environ, **overrides}
    environ.pop(FAULT, None)
    if fault is not None:
        environ[FAULT] = fault
    proc = subprocess.run([DSB, *argv], cwd=cwd or ROOT, env=environ, input=input, capture_output=True, text=True,
                          timeout=timeout, check=False)
    return Ran(proc.returncode, proc.stdout, proc.stderr, proc.stdout + proc.stderr)


def _in_process(argv: list[str], input: str | None, env: Mapping[str, str]) -> Ran:
    from click.testing import CliRunner

    from durable_sandbox.cli.main import cli

    result = CliRunner().invoke(cli, argv, input=input, env=dict(env), catch_exceptions=False)
    return Ran(result.exit_code, result.stdout, result.stderr, result.output)


def lines(text: str) -> list[str]:
    """An output's lines, without the padding tables leave at their ends."""
    return [line.rstrip() for line in text.splitlines()]
