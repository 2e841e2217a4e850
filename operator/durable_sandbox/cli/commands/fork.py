"""`dsb fork`: new runs whose sandbox workspace is a run's after its call N (sandboxes/fork.py)."""

from __future__ import annotations

from typing import Any

import click

from durable_sandbox.cli import render
from durable_sandbox.cli.commands.common import pass_settings, run_async
from durable_sandbox.cli.targets import is_manifest, plan_entrypoint
from durable_sandbox.engine import RunState
from durable_sandbox.runs.errors import EXIT_OK, CliError
from durable_sandbox.runs.session import open_engine
from durable_sandbox.runs.settings import Settings
from durable_sandbox.sandboxes.fork import ForkDiverged, Forked, ForkRefused


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--after", "after_call", type=click.IntRange(min=0), required=True,
              help="The fork point: the workspace as it was after this many calls of the session.")
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True,
              help="How many forks of that point (one replay for all, when the provider takes snapshots).")
@click.option("--session", default=None, help="The sandbox session to fork (needed when the run has several).")
@click.option("--resume", "then_resume", is_flag=True,
              help="Drive each fork on at once: its calls before N come from RUN's journal, the rest run anew.")
@pass_settings
def fork(settings: Settings, run_id: str, after_call: int, count: int, session: str | None, then_resume: bool) -> None:
    """Fork RUN at its call N: new runs (pending) whose sandbox workspace is RUN's after that call.

    The newest snapshot at or before N is restored and the calls after it are replayed, outcomes checked; a
    diverging call fails the fork (expected vs actual) and nothing is made. `dsb resume FORK` continues a fork
    from call N with its workflow's code (the steps and calls before N come from RUN's journal).
    """

    async def go() -> tuple[Forked, list[str]]:
        async with open_engine(settings) as engine:
            try:
                made = await engine.fork(run_id, after_call=after_call, count=count, session=session)
            except (ForkRefused, ForkDiverged) as exc:
                raise CliError(f"dsb fork {run_id} --after {after_call}: {exc}") from None
            statuses = [(await engine.resume(f)).status if then_resume else "pending" for f in made.run_ids]
            return made, statuses

    made, statuses = run_async(go())
    if settings.output != "table":
        render.emit_data(settings, {"source": made.source, "afterCall": made.after_call, "session": made.session,
                                    "restoredFrom": made.restored_from, "runs": made.run_ids,
                                    "waitingFor": made.waiting_for})
    else:
        for fork_id, status in zip(made.run_ids, statuses, strict=True):
            waits = made.waiting_for.get(fork_id)
            note = f" (replay waits for: {', '.join(waits)})" if waits else ""
            click.echo(f"{fork_id}  fork of {made.source} after call {made.after_call}: {status}{note}")
        if not then_resume:
            click.echo(f"continue one with: {settings.dsb()} resume {made.run_ids[0]}")
    click.get_current_context().exit(EXIT_OK)


def run_fork_of(settings: Settings, target: str, value: Any, given: bool, run_id: str | None, source: str,
                after_call: int | None) -> RunState:
    """`dsb run TARGET --fork-of RUN --after N`: a fork of RUN at call N running TARGET from there (its steps and
    calls before N come from RUN's journal and must be the same, in order; the rest runs anew), driven now."""
    if after_call is None:
        raise CliError("--fork-of needs --after N: the call of RUN's session to fork at")
    if is_manifest(target):
        raise CliError("--fork-of is for module:function targets (a code-first run)")
    plan = plan_entrypoint(target, value, run_id)

    async def go() -> RunState:
        async with open_engine(settings) as engine:
            try:
                made = await engine.fork(source, after_call=after_call, workflow=plan.definition,
                                         input=value if given else None,
                                         run_ids=[run_id] if run_id is not None else None)
            except (ForkRefused, ForkDiverged) as exc:
                raise CliError(f"dsb run --fork-of {source} --after {after_call}: {exc}") from None
            return await engine.resume(made.run_ids[0])

    return run_async(go())
