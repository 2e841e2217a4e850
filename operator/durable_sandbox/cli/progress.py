"""Live display of a run's operations: a rich progress bar on a terminal, plain lines otherwise.

The display reads the store (journal rows plus run events) rather than hooking into the engine, so
`dsb logs -f` in another terminal sees exactly what `dsb run` shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final, Protocol

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from durable_sandbox.cli.render import op_detail, op_label, short_id
from durable_sandbox.engine import Store
from durable_sandbox.engine.events import tail
from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.sandboxes.journal import SandboxJournal

# Shown while a run is driven: the outcome of each operation, not its start.
_QUIET_SUFFIXES = (".started",)
_QUIET_TYPES = frozenset({"run.started", "run.resumed", "run.succeeded", "run.failed", "run.cancelled", "run.waiting"})

_STYLE: Final[Mapping[str, str]] = {"completed": "green", "failed": "red", "retrying": "yellow", "waiting": "cyan", "lost": "red"}


def event_line(ev: dict[str, Any], *, wide: bool = False) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(float(ev.get("ts") or time.time())))
    etype = str(ev.get("type", "?"))
    if etype == "progress":
        text = str(ev.get("message", ""))
        if ev.get("percent") is not None:
            text += f" ({float(ev['percent']):.0f}%)"
    elif "opId" in ev:
        text = f"{label_of(ev)} [{short_id(str(ev['opId']), wide)}]"
        if ev.get("exitCode") is not None:
            text += f" exit {ev['exitCode']}"
        if int(ev.get("attempt") or 1) > 1:
            text += f" (attempt {ev['attempt']})"
        if ev.get("error"):
            text += f": {ev['error']}"
        elif ev.get("detail"):
            text += f" {ev['detail']}"
    else:
        skip = {"eventSeq", "runId", "type", "ts"}
        text = " ".join(f"{k}={v}" for k, v in ev.items() if k not in skip and v is not None)
    return f"{stamp}  {etype:<26} {text}".rstrip()


def label_of(ev: dict[str, Any]) -> str:
    return op_label(str(ev.get("name", "")), ev.get("target"))


def output_lines(ev: dict[str, Any]) -> list[str]:
    """A completed call's stdout and stderr as the journal kept them, indented under its line."""
    return [
        f"    {stream} | {line}"
        for stream in ("stdout", "stderr")
        for line in str(ev.get(stream) or "").splitlines()
    ]


def interesting(ev: dict[str, Any]) -> bool:
    etype = str(ev.get("type", ""))
    if etype.startswith("sandbox.") and "opId" not in ev:
        return False  # the session's notice duplicates the journal row shown for the same operation
    return etype not in _QUIET_TYPES and not etype.endswith(_QUIET_SUFFIXES)


async def positions(store: Store, run_id: str) -> tuple[int, int]:
    """The newest journal and event sequence numbers of a run: where a display of new activity starts."""
    rows = await store.journal_since(run_id, 0)
    op_seq = max((r.seq for r in rows), default=0)
    ev_seq = 0
    while batch := await store.read_events(run_id, ev_seq):
        ev_seq = max(e.seq for e in batch)
    return op_seq, ev_seq


async def poll_events(
    store: Store,
    run_id: str,
    stop: asyncio.Event,
    *,
    after: tuple[int, int] = (0, 0),
    interval: float = 0.1,
    wide: bool = False,
) -> AsyncIterator[dict[str, Any]]:
    """Journal rows and run events in time order until ``stop`` is set (then one last drain)."""

    async def done() -> bool:
        return stop.is_set()

    async def pause() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)

    def add_detail(row: OperationRecord, event: dict[str, Any]) -> None:
        if row.status != "started":
            detail = op_detail(row.kind, row.status, row.result, None, row.meta, wide=wide)
            if detail and "exitCode" not in event:
                event["detail"] = detail

    async for event in tail(store, run_id, done=done, pause=pause, after=after, on_row=add_detail,
                            reader=SandboxJournal()):
        yield event


class Display(Protocol):
    def event(self, ev: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class PlainDisplay:
    def __init__(self, *, everything: bool = False, wide: bool = False, call_output: bool = False) -> None:
        self.everything, self.wide, self.call_output = everything, wide, call_output

    def event(self, ev: dict[str, Any]) -> None:
        if self.everything or interesting(ev):
            click.echo(event_line(ev, wide=self.wide))
            if self.call_output:
                for line in output_lines(ev):
                    click.echo(line)

    def close(self) -> None:
        pass


class RichDisplay:
    """A progress bar (percent from progress events, else a spinner) with operation lines above it.

    The bar's text is the operation in flight (the newest started and not yet finished), after the
    workflow's newest progress message; with nothing in flight, the message (or the title) alone."""

    def __init__(
        self, console: Console, title: str, *, everything: bool = False, wide: bool = False, call_output: bool = False
    ) -> None:
        self.everything, self.wide, self.call_output = everything, wide, call_output
        self.base = title
        self.inflight: dict[str, str] = {}  # op id -> what it is, in start order
        self.progress = Progress(
            SpinnerColumn(),
            # The description is a run id, a ctx.progress message or a command: plain text, never markup.
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task: TaskID = self.progress.add_task(title, total=None)
        self.progress.start()

    def event(self, ev: dict[str, Any]) -> None:
        etype = str(ev.get("type", ""))
        if etype == "progress":
            if ev.get("percent") is not None:
                self.progress.update(self.task, total=100, completed=float(ev["percent"]))
            if ev.get("message"):
                self.base = str(ev["message"])
        elif "opId" in ev:
            op_id = str(ev["opId"])
            if etype.endswith(".started"):
                self.inflight[op_id] = f"{ev.get('kind', '')} {label_of(ev)}".strip()
            else:
                self.inflight.pop(op_id, None)
        current = next(reversed(self.inflight.values()), None)
        self.progress.update(self.task, description=f"{self.base}: {current}" if current else self.base)
        if self.everything or interesting(ev):
            style = _STYLE.get(etype.rsplit(".", 1)[-1], "")
            self.progress.console.print(Text(event_line(ev, wide=self.wide), style=style))
            if self.call_output:
                for line in output_lines(ev):
                    self.progress.console.print(Text(line))

    def close(self) -> None:
        self.progress.stop()


def make_display(
    title: str,
    *,
    tty: bool,
    console: Console | None = None,
    everything: bool = False,
    wide: bool = False,
    call_output: bool = False,
) -> Display:
    if tty and console is not None:
        return RichDisplay(console, title, everything=everything, wide=wide, call_output=call_output)
    return PlainDisplay(everything=everything, wide=wide, call_output=call_output)


async def watch(
    store: Store,
    run_id: str,
    display: Display,
    stop: asyncio.Event,
    *,
    after: tuple[int, int] = (0, 0),
    wide: bool = False,
) -> None:
    try:
        async for ev in poll_events(store, run_id, stop, after=after, wide=wide):
            display.event(ev)
    finally:
        display.close()
