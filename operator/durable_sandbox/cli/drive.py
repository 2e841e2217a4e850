"""Driving runs from the CLI: the run driver (engine/driver.py: timeout, retries) under the live display."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol

import click

from durable_sandbox.cli import render
from durable_sandbox.cli.progress import make_display, positions, watch
from durable_sandbox.cli.targets import RunPlan
from durable_sandbox.engine import Engine, LeaseHeld, RunRecord, RunState, RunStatus, Store
from durable_sandbox.engine.driver import LocalDriver, RunPolicy
from durable_sandbox.engine.owner import describe_owner
from durable_sandbox.runs.envfiles import LocalEnvValues
from durable_sandbox.runs.errors import Interrupted
from durable_sandbox.runs.settings import Settings
from durable_sandbox.workflows.sandbox_agent import AgentServices

# Finished for good: running the same manifest again reports these instead of running anything.
# (A failed run is retried from its journal instead.)
FINISHED = (RunStatus.SUCCEEDED, RunStatus.CANCELLED)


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


class _Watchable(Protocol):
    """An engine, or the cluster's runs (`dsb --kube`): anything whose store a display can poll."""

    @property
    def store(self) -> Store: ...


async def with_display(
    engine: _Watchable, settings: Settings, run_id: str, title: str, drive: Callable[[], Awaitable[RunState]]
) -> RunState:
    """Run ``drive`` while showing the run's operations as they complete (table output only: with
    -o json/yaml stdout carries just the final document)."""
    if settings.output != "table":
        return await drive()
    # Only what happens from now on: a resumed run's earlier operations are in `dsb history`.
    after = await positions(engine.store, run_id)
    tty = render.is_tty()
    display = make_display(title, tty=tty, console=render.console() if tty else None, wide=settings.wide)
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(engine.store, run_id, display, stop, after=after, wide=settings.wide))
    try:
        return await drive()
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await watcher


async def submit(engine: Engine, plan: RunPlan, *, thread_id: str | None) -> RunRecord:
    """Create the plan's run (or find it) and hand it its signals; a finished run is left as it is. The run's
    policy (timeout, retry) is recorded with it, for `dsb resume` and `dsb worker` (engine/driver.py)."""
    for message in plan.warnings:
        warn(message)
    labels = {**plan.labels, **plan.policy.to_labels()}
    run = await engine.create(plan.definition, plan.input, run_id=plan.run_id, thread_id=thread_id, labels=labels)
    if run.status in FINISHED:
        return run
    env_files = (engine.extensions.get(AgentServices) or AgentServices()).env_values
    if plan.env_values and isinstance(env_files, LocalEnvValues):
        # After create: a values file always belongs to a run that exists (see LocalEnvValues.forget_settled).
        env_files.save(run.run_id, plan.env_values)
    for callback_id, value in plan.signals.items():
        await engine.signal(run.run_id, callback_id, value)
    return run


def driver(engine: Engine, settings: Settings, run_id: str, title: str) -> LocalDriver:
    """The run driver of `dsb run` and `dsb resume`: every execution under the live display, every retry said."""

    def on_retry(run: RunRecord, attempt: int, delay: float) -> None:
        policy = RunPolicy.of(run)
        warn(f"run {run.run_id} failed; retrying (attempt {attempt}/{policy.max_attempts}) in {delay:g}s (spec.retry)")

    return LocalDriver(engine, around=lambda execute: with_display(engine, settings, run_id, title, execute),
                       on_retry=on_retry)


async def run_plan(engine: Engine, settings: Settings, plan: RunPlan, *, thread_id: str | None) -> RunState:
    run = await submit(engine, plan, thread_id=thread_id)
    run_id = run.run_id
    if run.status in FINISHED:
        # The same manifest (same program and input) was run to the end before: report it, run nothing.
        if settings.output == "table":
            click.echo(
                f"run {run_id} ({plan.label}) already {run.status.value} at {render.fmt_time(run.updated_at)}; "
                f"nothing was run again (`{settings.dsb()} delete {run_id}` to run it afresh)"
            )
        return await engine.inspect(run_id)
    if plan.cancel:
        return await engine.cancel(run_id, "spec.cancel is true")
    if settings.output == "table":
        click.echo(f"run {run_id} ({plan.label})")
    with interruption_names(run_id):
        # The manifest's policy, not the one recorded at creation: the file is what the user runs now.
        return await driver(engine, settings, run_id, plan.label).drive(run_id, plan.policy, definition=plan.definition)


@contextlib.contextmanager
def interruption_names(run_id: str) -> Iterator[None]:
    """A signal that stops the run being driven ends the command naming that run (to resume it)."""
    try:
        yield
    except asyncio.CancelledError:
        raise Interrupted(run_id) from None


async def resume_run(engine: Engine, settings: Settings, run_id: str, *, wait: bool = False) -> RunState:
    state = await engine.inspect(run_id)
    if state.status in ("succeeded", "cancelled"):
        return state
    if settings.output == "table":
        click.echo(f"resuming run {run_id} ({state.workflow})")
    told = False
    with interruption_names(run_id):
        while True:
            try:
                run = await engine.client.get(run_id)
                return await driver(engine, settings, run_id, run_id).drive(run_id, RunPolicy.of(run))
            except LeaseHeld as held:
                if not wait:
                    raise
                if not told:
                    click.echo(f"run {run_id} is being executed by {describe_owner(held.owner)}; waiting for it "
                               f"(Ctrl-C stops waiting)", err=True)
                    told = True
                # Polling the lease: the holder may be another process, which can tell us nothing.
                await asyncio.sleep(min(1.0, max(0.05, held.remaining)))
