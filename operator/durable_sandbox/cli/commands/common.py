"""Helpers every command uses: running a coroutine, and finishing with a run's exit code."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

import click

from durable_sandbox.cli import render
from durable_sandbox.engine import RunState
from durable_sandbox.runs.errors import EXIT_WAITING, Interrupted, exit_code_for
from durable_sandbox.runs.settings import Settings

T = TypeVar("T")

pass_settings = click.make_pass_decorator(Settings)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine. SIGINT and SIGTERM cancel it (so a run being driven stops at a call
    boundary and stays resumable) and end the command with :class:`Interrupted`; a second signal exits
    at once (a run is crash-safe; the processes of its calls die with this process)."""
    received: list[int] = []

    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()

        def on_signal(signum: int) -> None:
            if received:
                click.echo(f"error: interrupted again ({signal.Signals(signum).name}); stopping now", err=True)
                os._exit(128 + signum)
            received.append(signum)
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await coro
        except asyncio.CancelledError:
            if received:
                raise Interrupted(None, received[0]) from None
            raise
        except Interrupted as exc:
            if received:
                exc.signum = received[0]
            raise

    return asyncio.run(main())


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
