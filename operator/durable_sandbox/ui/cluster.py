"""A cluster's runs for the web view (``dsb --kube ui``): the Workflows of one namespace.

Everything goes through ``runs.cluster.ClusterEngine``, the client ``dsb --kube`` uses, with the caller's
kubeconfig: the list is the Workflows' status (what ``kubectl get dwf`` shows; one LIST), a run's journal
and events are read through ``KubernetesStore`` exactly as the operator writes them, and the Workflow's
own Kubernetes Events are added to its timeline. The view steers a run only through the Workflow's spec,
as ``kubectl`` would: a signal adds a key to ``spec.signals``, cancel sets ``spec.cancel``, suspend and
resume set ``spec.suspend``. It never writes the journal or status.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final, Literal

from durable_sandbox.engine import Event, OperationRecord, RunStatus, Store
from durable_sandbox.kube.api.client import ApiException
from durable_sandbox.kube.spec.workflows import run_id_of
from durable_sandbox.runs.cluster import SANDBOX_REF, ClusterEngine, sandbox_of
from durable_sandbox.sandboxes.summary import summarize
from durable_sandbox.ui.kube_events import object_events, parse_time
from durable_sandbox.ui.sandbox_session import SandboxSessions
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

__all__ = ["ClusterSource"]

PHASE_STATUS: Final[Mapping[str, RunStatus]] = {
    "Pending": RunStatus.PENDING, "Running": RunStatus.RUNNING, "Waiting": RunStatus.WAITING,
    "Suspended": RunStatus.SUSPENDED, "Succeeded": RunStatus.SUCCEEDED, "Failed": RunStatus.FAILED,
    "Cancelled": RunStatus.CANCELLED,
}  # fmt: skip
TERMINAL = frozenset({"Succeeded", "Failed", "Cancelled"})
# Event reasons the timeline already shows from the journal (kube/reporting/events.py derives them from it).
JOURNAL_REASONS = frozenset({"Provisioned", "SnapshotTaken", "SnapshotDeleted", "SandboxLost", "Recovered",
                             "WaitingForSignal", "Succeeded", "Failed", "Cancelled"})  # fmt: skip


def row_of(obj: dict[str, Any]) -> RunRow:
    """A Workflow as the runs list shows it, from its status alone (the operator's projection)."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    calls = status.get("calls") or {}
    created = parse_time(meta.get("creationTimestamp")) or time.time()
    finished = parse_time(status.get("finishedAt"))
    total = calls.get("total")
    if total is None and isinstance(spec.get("toolCalls"), list):
        total = len(spec["toolCalls"])
    error = status.get("error") or {}
    return RunRow(
        ref=meta["name"], run_id=run_id_of(obj), status=PHASE_STATUS.get(phase, RunStatus.PENDING).value,
        workflow=str(spec.get("entrypoint") or "sandbox-agent"), name=meta["name"], labels=dict(meta.get("labels") or {}),
        attempt=int(status.get("attempt") or 1), calls_done=calls.get("completed") if total else None,
        calls_total=total or None,
        created=parse_time(status.get("startedAt")) or created, updated=finished or created, finished=finished,
        waiting_on=[str(p.get("id")) for p in status.get("pendingCallbacks") or [] if isinstance(p, dict)],
        error=error.get("message") if isinstance(error, dict) else None,
    )  # fmt: skip


class ClusterSource:
    mode: Literal["cluster"] = "cluster"
    poll_seconds = 1.0  # each look is a GET of the Workflow and of the run's head object

    def __init__(self, cluster: ClusterEngine) -> None:
        self.cluster = cluster
        self.sessions = SandboxSessions(cluster)  # ``sandbox/NAME``: a Sandbox's own session calls

    @property
    def store(self) -> Store:
        return self.cluster.store

    def where(self) -> str:
        host = getattr(self.cluster.api.api_client.configuration, "host", "the cluster")
        return f"cluster {host}, namespace {self.cluster.namespace}"

    async def list_runs(self, query: RunQuery) -> RunPage:
        rows = [row_of(obj) for obj in await self.cluster.workflows.list()]
        matching = [r for r in rows if query.matches(status=r.status, workflow=r.workflow, name=r.name, labels=r.labels)]
        matching.sort(key=lambda r: r.created, reverse=True)
        return RunPage(page_of(matching, query), len(matching), query)

    async def head(self, ref: str) -> RunHead:
        if (box := sandbox_of(ref)) is not None:
            return await self.sessions.head(box)
        obj = await self.cluster.workflow(ref)  # CliError (not found) names the namespace
        row = row_of(obj)
        run = await self.store.get_run(row.run_id)
        if run is None:
            phase = str((obj.get("status") or {}).get("phase") or "Pending")
            return RunHead(None, row.created, row.status, phase in TERMINAL)
        return RunHead(run.run_id, run.created_at, run.status.value, run.status.terminal,
                       live=run.status == RunStatus.RUNNING and not run.stale)

    async def detail(self, ref: str, journal: list[OperationRecord] | None = None) -> RunDetail:
        if (box := sandbox_of(ref)) is not None:
            return await self.sessions.detail(ref, box, journal)
        obj = await self.cluster.workflow(ref)  # CliError (not found) names the namespace
        name = obj["metadata"]["name"]
        row = row_of(obj)
        run = await self.store.get_run(row.run_id)  # read before the rows (see RunSource.detail)
        calls_done, calls_total = row.calls_done, row.calls_total
        links = [("parent", str(r["name"])) for r in obj["metadata"].get("ownerReferences") or []
                 if r.get("controller") and r.get("kind") == "Workflow" and r.get("name")]
        if run is None:
            state = await self.cluster.inspect(name)  # not started: its status says why
        else:
            # The summary `dsb --kube inspect` and the Workflow's status count with (sandboxes/summary.py).
            rows = await caught_up(self.store, run.run_id, journal)
            summary = summarize(run, rows)
            state, calls_done, calls_total = summary.state, summary.calls_done, summary.calls_total
            # A child's run id is its Workflow's: `<name>-<uid[:8]>` (kube/workflow/children.py).
            links += [("child", child[:-9]) for child in child_runs(rows) if len(child) > 9]
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        phase = str(status.get("phase") or "Pending")
        facts = [("Workflow", f"{self.cluster.namespace}/{name}"), ("phase", phase)]
        for cond in status.get("conditions") or []:
            if cond.get("status") == "True" and cond.get("type") != "Ready":
                facts.append((f"condition {cond.get('type')}", f"{cond.get('reason')}: {cond.get('message')}"))
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        if ready is not None:
            facts.append(("Ready", f"{ready.get('status')} ({ready.get('reason')}): {ready.get('message')}"))
        for flag in ("suspend", "cancel"):
            if spec.get(flag):
                facts.append((f"spec.{flag}", "true"))
        if status.get("observedGeneration") not in (None, obj["metadata"].get("generation")):
            facts.append(("observedGeneration", f"{status.get('observedGeneration')} of {obj['metadata'].get('generation')}: "
                                                "the operator has not acted on the newest spec yet"))
        started = run is not None
        return RunDetail(
            ref=name, run_id=row.run_id, state=state, name=name, attempt=row.attempt, calls_done=calls_done,
            calls_total=calls_total, started=started, terminal=phase in TERMINAL, actions=self.actions(obj),
            facts=facts, links=links,
        )  # fmt: skip

    def actions(self, obj: dict[str, Any]) -> list[Action]:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        name = obj["metadata"]["name"]
        done = str(status.get("phase") or "Pending") in TERMINAL
        finished = "the run has finished" if done else None
        patch = f"`kubectl patch workflow {name} -n {self.cluster.namespace} --type merge -p"
        return [
            Action("signal", "Signal", "Adds the callback's value to the Workflow's spec.signals (a JSON Patch, as "
                   "`dsb --kube signal` does; a signalled callback cannot be given another value); the operator "
                   "delivers it and continues the run.", enabled=not done, why_not=finished),
            Action("cancel", "Cancel", f"Sets spec.cancel: true ({patch} '{{\"spec\":{{\"cancel\":true}}}}'`), which "
                   f"cannot be undone; the operator cancels the run and deletes its sandbox and snapshots.",
                   enabled=not done and not spec.get("cancel"),
                   why_not=finished or ("spec.cancel is already true" if spec.get("cancel") else None)),
            Action("suspend", "Suspend", f"Sets spec.suspend: true ({patch} '{{\"spec\":{{\"suspend\":true}}}}'`); the "
                   f"operator stops the run at its next call boundary and hibernates its sandbox (snapshot, then "
                   f"destroy).", enabled=not done and not spec.get("suspend"),
                   why_not=finished or ("spec.suspend is already true" if spec.get("suspend") else None)),
            Action("resume", "Resume", f"Sets spec.suspend: false ({patch} '{{\"spec\":{{\"suspend\":false}}}}'`); the "
                   f"operator restores the sandbox from its snapshot and continues the run.",
                   enabled=not done and bool(spec.get("suspend")),
                   why_not=finished or (None if spec.get("suspend") else
                                        "spec.suspend is not set (the operator continues runs by itself)")),
        ]  # fmt: skip

    async def version(self, ref: str) -> Any:
        if (box := sandbox_of(ref)) is not None:
            return await self.sessions.version(box)
        obj = await self.cluster.workflow(ref)
        run = await self.store.get_run(run_id_of(obj))
        return obj["metadata"].get("resourceVersion"), None if run is None else (run.status, run.updated_at)

    async def journal(self, run_id: str) -> list[OperationRecord]:
        return await self.store.load_journal(run_id)

    async def events(self, run_id: str, after: int) -> list[Event]:
        return await self.store.read_events(run_id, after, limit=100_000)

    async def object_events(self, ref: str) -> list[dict[str, Any]]:
        """The Workflow's Kubernetes Events that the journal does not already say (suspend, resume, cleanup,
        the operator's refusals), or the Sandbox's (``sandbox/NAME``: its journal says only its calls); [] when the
        kubeconfig may not list Events."""
        if (box := sandbox_of(ref)) is not None:
            return await self.sessions.object_events(box)
        return await object_events(self.cluster, "Workflow", await self.cluster.workflow(ref), JOURNAL_REASONS)

    async def sandboxes(self) -> tuple[list[SandboxRow], str | None]:
        workflows = await self.cluster.workflows.list()
        users: dict[str, list[tuple[str, str]]] = {}
        out: list[SandboxRow] = []
        for obj in workflows:
            name = obj["metadata"]["name"]
            spec, status = obj.get("spec") or {}, obj.get("status") or {}
            phase = str(status.get("phase") or "Pending")
            ref = (spec.get("sandboxRef") or {}).get("name")
            if isinstance(ref, str):
                users.setdefault(ref, []).append((name, f"{name} ({phase})"))
            box = status.get("sandbox")
            if isinstance(box, dict) and not isinstance(ref, str):
                provider_id = box.get("providerId")
                snapshot = status.get("latestSnapshot")
                state = ("live" if provider_id else "finalized" if phase in TERMINAL
                         else "hibernated" if snapshot else "none")  # fmt: skip
                out.append(SandboxRow(
                    name=f"{name}/{box.get('name')}", kind="session", state=state, provider=box.get("provider"),
                    sandbox_id=provider_id, snapshots=[snapshot] if snapshot else [], runs=[(name, f"{name} ({phase})")],
                    detail=f"Workflow {name}'s own sandbox (spec.sandbox)",
                ))  # fmt: skip
        for res in await self.cluster.sandboxes():
            holder = res.get("holder")
            runs = users.get(res["name"], [])
            if holder and all(r != holder for r, _ in runs):
                runs.insert(0, (holder, f"{holder} (holds it)"))
            state = str(res.get("phase") or "Pending") + (" (spec.suspend)" if res.get("suspend") else "")
            out.append(SandboxRow(
                name=res["name"], kind="resource", state=state, provider=res.get("provider"),
                sandbox_id=res.get("providerId"), snapshots=list(res.get("snapshots") or []), runs=runs,
                detail=f"Sandbox resource; Ready {res.get('ready')}" + (f" ({res['reason']})" if res.get("reason") else ""),
                session_ref=SANDBOX_REF + res["name"],
            ))  # fmt: skip
        return out, None

    # ------------------------------------------------------------------ actions: spec writes only

    @contextlib.asynccontextmanager
    async def _patching(self, name: str) -> AsyncIterator[None]:
        """A patch the API server refuses (RBAC, admission) is the page's message, not an error page."""
        try:
            yield
        except ApiException as exc:
            try:
                why = json.loads(exc.body or "{}").get("message") or exc.reason
            except (ValueError, AttributeError):
                why = exc.reason
            raise ValueError(f"the API server refused to patch Workflow {self.cluster.namespace}/{name} "
                             f"({exc.status}): {why}") from None

    async def _name(self, ref: str, what: str) -> str:
        obj = await self.cluster.workflow(ref)
        phase = str((obj.get("status") or {}).get("phase") or "Pending")
        if phase in TERMINAL:
            raise ValueError(f"Workflow {self.cluster.namespace}/{ref} has {phase.lower()}; it no longer takes a {what}")
        return str(obj["metadata"]["name"])

    async def signal(self, ref: str, callback_id: str, value: Any, *, resume: bool) -> str:
        name = await self._name(ref, "signal")
        async with self._patching(name):
            new = await self.cluster.workflows.signal(name, callback_id, value)
        done = f"spec.signals.{callback_id} of Workflow {name} set" if new else \
            f"spec.signals.{callback_id} of Workflow {name} already had this value"
        return f"{done}; the operator continues the run"

    async def cancel(self, ref: str, reason: str) -> str:
        name = await self._name(ref, "cancel")
        async with self._patching(name):
            await self.cluster.workflows.cancel(name)
        return f"spec.cancel of Workflow {name} set to true; the operator cancels the run and cleans up"

    async def suspend(self, ref: str) -> str:
        name = await self._name(ref, "suspend")
        async with self._patching(name):
            await self.cluster.workflows.suspend(name, True)
        return f"spec.suspend of Workflow {name} set to true; the operator stops the run at its next call boundary"

    async def resume(self, ref: str) -> str:
        name = await self._name(ref, "resume")
        async with self._patching(name):
            await self.cluster.workflows.suspend(name, False)
        return f"spec.suspend of Workflow {name} set to false; the operator continues the run"
