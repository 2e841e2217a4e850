"""The local store's runs for the web view: the engine ``dsb`` opens (``runs.session.open_engine``).

Actions do what the ``dsb`` commands do: a signal is ``dsb signal`` (the engine's ``signal``), a cancel is
``dsb cancel`` (the engine's ``cancel``: a waiting run's sandbox cleanup runs in this process), and a resume
is ``dsb resume`` started in the background, like ``dsb run --detach`` (its stderr goes to
``<store>.detached.log``), so no workflow code runs inside the web server. There is no local suspend:
``spec.suspend`` is a cluster feature.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from durable_sandbox.engine import Event, OperationRecord, RunRecord, RunStatus, Store
from durable_sandbox.engine.children import PARENT_LABEL
from durable_sandbox.engine.owner import describe_owner
from durable_sandbox.kube.spec.plan import WORKFLOW_LABEL
from durable_sandbox.runs.detach import background, log_path
from durable_sandbox.runs.session import Settings
from durable_sandbox.sandbox_engine import Engine
from durable_sandbox.sandboxes.summary import summarize, total_calls
from durable_sandbox.ui.sandboxes import SessionFold
from durable_sandbox.ui.source import (
    Action,
    RunDetail,
    RunHead,
    RunPage,
    RunQuery,
    RunRow,
    SandboxRow,
    caught_up,
    child_runs,
    page_of,
)

__all__ = ["LIST_LIMIT", "SANDBOX_SCAN", "LocalSource", "spawn_resume"]

# The runs list reads at most this many runs of the store (newest first); the page says when there are more.
LIST_LIMIT = 100_000
# The Sandboxes page folds the journals of at most this many runs (newest first), once each.
SANDBOX_SCAN = 1_000
FINISHED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


@dataclass
class RunDigest:
    """What the list and the Sandboxes page need of a run's journal, folded once and then incrementally."""

    total: int | None  # the run's calls, when its input says (a manifest's toolCalls)
    sessions: SessionFold = field(default_factory=SessionFold)
    updated: float = 0.0
    status: RunStatus | None = None


class LocalSource:
    mode: Literal["local"] = "local"
    poll_seconds = 0.25

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self._digests: dict[str, RunDigest] = {}
        self._resumes: list[subprocess.Popen[bytes]] = []

    @property
    def store(self) -> Store:
        return self.engine.store

    def where(self) -> str:
        return f"local store {self.settings.store_label}"

    # ------------------------------------------------------------------ reading

    async def digest(self, run: RunRecord) -> RunDigest:
        d = self._digests.get(run.run_id)
        if d is None:
            d = self._digests[run.run_id] = RunDigest(total_calls(run.input))
        elif d.status in FINISHED and run.status == d.status and run.updated_at == d.updated:
            return d  # a finished run journals nothing more until it is retried (which updates it)
        d.sessions.feed(await self.store.journal_since(run.run_id, d.sessions.last_seq))
        d.updated, d.status = run.updated_at, run.status
        return d

    async def row(self, run: RunRecord) -> RunRow:
        digest = await self.digest(run)
        done, total = digest.sessions.calls(digest.total)
        return RunRow(
            ref=run.run_id, run_id=run.run_id, status=run.status.value, workflow=run.workflow,
            name=run.labels.get(WORKFLOW_LABEL), labels=dict(run.labels), attempt=run.epoch + 1,
            calls_done=done, calls_total=total, created=run.created_at, updated=run.updated_at, finished=run.updated_at if run.status.terminal else None,
            waiting_on=list(run.pending_callbacks) if run.status == RunStatus.WAITING else [],
            stale=run.stale, error=run.error.message if run.error else None,
        )  # fmt: skip

    async def list_runs(self, query: RunQuery) -> RunPage:
        statuses = [RunStatus(s) for s in query.statuses] or None
        runs = await self.engine.runs(status=statuses, limit=LIST_LIMIT)
        matching = [
            r for r in runs
            if query.matches(status=r.status.value, workflow=r.workflow, name=r.labels.get(WORKFLOW_LABEL), labels=r.labels)
        ]  # fmt: skip
        rows = [await self.row(r) for r in page_of(matching, query)]
        return RunPage(rows, len(matching), query, truncated=len(runs) >= LIST_LIMIT)

    async def head(self, ref: str) -> RunHead:
        run = await self.engine.client.get(ref)  # RunNotFound
        return RunHead(run.run_id, run.created_at, run.status.value, run.status.terminal,
                       live=run.status == RunStatus.RUNNING and not run.stale)

    async def detail(self, ref: str, journal: list[OperationRecord] | None = None) -> RunDetail:
        run = await self.engine.client.get(ref)  # RunNotFound; read before the rows (see RunSource.detail)
        rows = await caught_up(self.store, ref, journal)
        summary = summarize(run, rows)
        facts: list[tuple[str, str]] = [("store", self.settings.store_label)]
        parent = run.labels.get(PARENT_LABEL)
        links = [("parent", parent)] if parent else []
        links += [("child", child) for child in child_runs(rows)]
        if run.status == RunStatus.RUNNING and run.lease_owner:
            facts.append(("executed by", describe_owner(run.lease_owner)))
        if run.cancel_requested:
            facts.append(("cancel requested", run.cancel_requested))
        if run.workflow_ref:
            facts.append(("workflow code", run.workflow_ref))
        return RunDetail(
            ref=ref, run_id=run.run_id, state=summary.state, name=run.labels.get(WORKFLOW_LABEL), attempt=run.epoch + 1,
            calls_done=summary.calls_done, calls_total=summary.calls_total, started=True,
            terminal=run.status.terminal, actions=self.actions(run), facts=facts, stale=run.stale, links=links,
        )  # fmt: skip

    def actions(self, run: RunRecord) -> list[Action]:
        dsb = self.settings.dsb()
        rid = shlex.quote(run.run_id)
        status = run.status
        live = status == RunStatus.RUNNING and not run.stale
        out = [
            Action("signal", "Signal", f"Stores the value as the callback's signal, as `{dsb} signal {rid} CALLBACK "
                   f"VALUE` does; with “then resume”, starts `{dsb} resume {rid}` in the background, which continues "
                   f"the run on this machine (as `{dsb} signal --resume`).",
                   enabled=not status.terminal, why_not="the run has finished" if status.terminal else None),
            Action("cancel", "Cancel", f"Does what `{dsb} cancel {rid}` does: the running step stops (a run executing "
                   f"in another process is asked to stop), its sandboxes are cleaned up, and its status becomes "
                   f"cancelled.", enabled=not status.terminal,
                   why_not="the run has finished" if status.terminal else None),
            Action("resume", "Resume", f"Starts `{dsb} resume {rid}` in the background (its errors go to "
                   f"{log_path(self.settings)}): it continues a pending or signalled run, takes over one whose "
                   f"worker died, or retries a failed one.",
                   enabled=status not in (RunStatus.SUCCEEDED, RunStatus.CANCELLED) and not live,
                   why_not=("the run has finished" if status in (RunStatus.SUCCEEDED, RunStatus.CANCELLED)
                            else "a live worker executes it" if live else None)),
            Action("suspend", "Suspend", "Suspending is a cluster feature (a Workflow's spec.suspend); locally, "
                   "stop the process that drives the run (Ctrl-C in `dsb run`): it stays resumable.",
                   enabled=False, why_not="only in a cluster"),
        ]  # fmt: skip
        return out

    async def version(self, ref: str) -> Any:
        run = await self.store.get_run(ref)
        if run is None:
            return None
        return (run.status, run.updated_at, tuple(run.pending_callbacks), run.cancel_requested, run.lease_owner)

    async def journal(self, run_id: str) -> list[OperationRecord]:
        return await self.store.load_journal(run_id)

    async def events(self, run_id: str, after: int) -> list[Event]:
        out: list[Event] = []
        while True:
            batch = await self.store.read_events(run_id, after)
            out.extend(batch)
            if len(batch) < 1000:
                return out
            after = batch[-1].seq

    async def object_events(self, ref: str) -> list[dict[str, Any]]:
        return []

    async def sandboxes(self) -> tuple[list[SandboxRow], str | None]:
        runs = await self.engine.runs(limit=SANDBOX_SCAN + 1)
        note = None
        if len(runs) > SANDBOX_SCAN:
            runs = runs[:SANDBOX_SCAN]
            note = f"only the newest {SANDBOX_SCAN} runs' journals are read"
        out: list[SandboxRow] = []
        for run in runs:
            digest = await self.digest(run)
            label = run.labels.get(WORKFLOW_LABEL) or run.workflow
            for s in digest.sessions.sessions.values():
                out.append(SandboxRow(
                    name=s.id, kind="session", state=s.state, provider=s.provider, sandbox_id=s.sandbox_id,
                    snapshots=list(s.snapshots), runs=[(run.run_id, f"{run.run_id} ({label}, {run.status.value})")],
                    retained=s.retained, detail=f"{len(s.sandboxes)} sandbox(es), {s.recoveries} recovery(ies)",
                ))  # fmt: skip
        return out, note

    # ------------------------------------------------------------------ actions (as the dsb commands)

    async def _unfinished(self, ref: str, what: str) -> RunRecord:
        run = await self.engine.client.get(ref)
        if run.status.terminal:
            raise ValueError(f"run {ref} has {run.status.value}; it no longer takes a {what}")
        return run

    async def signal(self, ref: str, callback_id: str, value: Any, *, resume: bool) -> str:
        await self._unfinished(ref, "signal")
        new = await self.engine.signal(ref, callback_id, value)
        done = f"signalled {callback_id} of run {ref}" + ("" if new else " (it already had this value)")
        if resume:
            return f"{done}; {await self.resume(ref)}"
        return f"{done}; continue it with `{self.settings.dsb()} resume {ref}` (or Resume here)"

    async def cancel(self, ref: str, reason: str) -> str:
        await self._unfinished(ref, "cancel")
        state = await self.engine.cancel(ref, reason)
        if state.status == "cancelled":
            return f"run {ref} cancelled: {reason}"
        return f"run {ref}: cancellation requested; the worker executing it will stop it"

    async def suspend(self, ref: str) -> str:
        raise ValueError("suspend is a cluster feature (spec.suspend); a local run has none")

    async def resume(self, ref: str) -> str:
        run = await self.engine.client.get(ref)
        if run.status in (RunStatus.SUCCEEDED, RunStatus.CANCELLED):
            raise ValueError(f"run {ref} has {run.status.value}; there is nothing to resume")
        if run.status == RunStatus.RUNNING and not run.stale:
            raise ValueError(f"run {ref} is executed by {describe_owner(run.lease_owner or '?')}; it goes on there")
        # Reap the resumes that have ended (they are our children until then).
        self._resumes = [p for p in self._resumes if p.poll() is None]
        proc = spawn_resume(self.settings, ref)
        self._resumes.append(proc)
        return f"started `{self.settings.dsb()} resume {ref}` in the background (process {proc.pid})"


def spawn_resume(settings: Settings, run_id: str) -> subprocess.Popen[bytes]:
    """`dsb resume RUN` in the background, as `dsb run --detach` starts its run (its stderr to the detach log)."""
    return background(settings, [sys.executable, "-m", "durable_sandbox.cli.main", "-o", "json", "resume", run_id])
