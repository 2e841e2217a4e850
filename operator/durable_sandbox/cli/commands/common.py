"""Helpers every command uses: running a coroutine, and finishing with a run's exit code."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any, TypeVar

import click

from durable_sandbox.cli import render
from durable_sandbox.cli.errors import EXIT_WAITING, exit_code_for
from durable_sandbox.cli.session import Settings
from durable_sandbox.engine import RunState

T = TypeVar("T")

pass_settings = click.make_pass_decorator(Settings)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def report_outcome(settings: Settings, state: RunState, *, full: bool = False) -> int:
    """Print a run's outcome (and how to continue a waiting run) and return its exit code."""
    if settings.output != "table" or full:
        render.render_state(settings, state)
    else:
        con = render.console()
        con.print(render.final_line(state), style=_style(state.status), highlight=False)
        if state.result is not None:
            click.echo(json.dumps(state.result, indent=2, ensure_ascii=False, default=str))
    return outcome_code(settings, state)


def outcome_code(settings: Settings, state: RunState) -> int:
    """The exit code for a run; for a waiting run, also tells (on stderr) how to continue it."""
    code = exit_code_for(state)
    if code == EXIT_WAITING:
        for line in render.continue_hint(settings, state):
            click.echo(line, err=True)
    return code


def _style(status: str) -> str:
    return {"succeeded": "green", "failed": "red", "cancelled": "yellow"}.get(status, "cyan")


def worst(codes: list[int]) -> int:
    """One exit code for several runs: any failure wins, then waiting, then success."""
    for code in (1, 3):
        if code in codes:
            return code
    return max(codes, default=0)
