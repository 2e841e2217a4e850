"""A cluster's runs, as `dsb --kube` and the web view read and steer them (the operator executes them).

:class:`ClusterEngine` offers what the commands call on a local engine (inspect, history, stream, runs,
signal, cancel) for the runs of one namespace. Runs are read from the operator's journal (Journal objects
through ``KubernetesStore``; with ``--store postgresql://...``, the PostgreSQL journal the operator was given
with ``--journal``) with the engine's own ``RunClient``, exactly as the operator writes them, so inspect,
history and logs print what they print locally. What steers a run is the Workflow's spec, as with kubectl: ``signal`` adds a key to
``spec.signals``, ``cancel`` sets ``spec.cancel``; ``apply`` applies a manifest (server-side; `dsb --kube run`
follows the run in ``cli/cluster.py``).
A run is named by its Workflow's name or by its run id (``<name>-<uid[:8]>``); a Sandbox's own session calls
(``dsbx.<uid>.calls``, sessions/journal.py) by ``sandbox/<Sandbox name>`` (no Workflow's name holds a ``/``), so
``dsb --kube inspect|history sandbox/NAME`` and the web view's Sandbox page read them with the same client.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_sandbox.engine import OperationRecord, RunNotFound, RunRecord, RunState, RunStatus
from durable_sandbox.engine.client import RunClient
from durable_sandbox.engine.errors import StoreError
from durable_sandbox.engine.records import ErrorInfo
from durable_sandbox.engine.store import Store
from durable_sandbox.kube.api.client import ApiException, KubeClient
from durable_sandbox.kube.api.resources import SANDBOXES
from durable_sandbox.kube.reporting.status import TERMINAL_PHASES
from durable_sandbox.kube.sandbox.view import calls_run_id
from durable_sandbox.kube.spec.workflows import NoSuchWorkflow, WorkflowClient, run_id_of
from durable_sandbox.kube.store.journals import ApiServerJournal, JournalChoice, PostgresJournal, open_journal
from durable_sandbox.kube.workflow.ignored import RERUN_HINT
from durable_sandbox.runs.errors import CliError
from durable_sandbox.runs.settings import Settings
from durable_sandbox.sandboxes.journal import SandboxJournal
from durable_sandbox.sessions.journal import SESSION_WORKFLOW

# How often a follower reads the run's objects: each read is a GET of the run's head ConfigMap.
POLL_SECONDS = 0.5
SANDBOX_REF = "sandbox/"  # ``sandbox/NAME``: the session calls of the Sandbox NAME


def sandbox_of(ref: str) -> str | None:
    """The Sandbox a ``sandbox/NAME`` reference names (None: ``ref`` names a Workflow or a run)."""
    return ref[len(SANDBOX_REF):] if ref.startswith(SANDBOX_REF) and len(ref) > len(SANDBOX_REF) else None


def default_namespace() -> str:
    """The namespace of the kubeconfig's current context, else ``default`` (as kubectl chooses)."""
    import os

    import yaml

    path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube" / "config")
    with contextlib.suppress(OSError, yaml.YAMLError, AttributeError, TypeError):
        config = yaml.safe_load(Path(path).read_text()) or {}
        current = config.get("current-context")
        for ctx in config.get("contexts") or []:
            if ctx.get("name") == current:
                return str((ctx.get("context") or {}).get("namespace") or "default")
    return "default"


@dataclass
class ClusterEngine:
    """The engine as `dsb` commands use it, for the runs of one namespace of a cluster."""

    namespace: str
    api: KubeClient
    store: Store
    workflows: WorkflowClient
    journal: JournalChoice = field(default_factory=ApiServerJournal)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, settings: Settings) -> AsyncIterator[ClusterEngine]:
        ns = settings.namespace or default_namespace()
        choice = journal_of(settings)
        try:
            api = await KubeClient.connect()
        except RuntimeError as exc:
            raise CliError(str(exc)) from None
        try:
            try:
                stores = await open_journal(choice, api)
            except StoreError as exc:
                raise CliError(f"the operator's journal ({choice}): {exc}") from None
            try:
                yield cls(ns, api, stores.store_for(ns), WorkflowClient(api, ns), choice)
            finally:
                await stores.aclose()
        finally:
            await api.close()

    @property
    def client(self) -> RunClient:
        return RunClient(self.store, reader=SandboxJournal())

    # ------------------------------------------------------------------ naming

    async def workflow(self, ref: str) -> dict[str, Any]:
        try:
            return await self.workflows.find(ref)
        except NoSuchWorkflow as exc:
            raise CliError(str(exc)) from None

    async def sandbox(self, name: str) -> dict[str, Any]:
        """The Sandbox ``name`` of the namespace, read with the caller's credentials (its uid names its calls' run:
        a Sandbox re-created under the same name is another one, with another journal)."""
        try:
            obj = await self.workflows.objects.get(SANDBOXES, self.namespace, name)
        except ApiException as exc:
            raise CliError(f"cannot read Sandbox {self.namespace}/{name}: the API server answered {exc.status} "
                           f"({exc.reason}); `kubectl auth can-i get sandboxes -n {self.namespace}` tells") from None
        if obj is None:
            raise CliError(f"no Sandbox {self.namespace}/{name}: `kubectl get dsbx -n {self.namespace}` lists them")
        return obj

    async def run_id(self, ref: str) -> str:
        """The run id of the Workflow named ``ref`` (or whose run id ``ref`` is), or of ``sandbox/NAME``'s calls."""
        name = sandbox_of(ref)
        if name is not None:
            return calls_run_id((await self.sandbox(name))["metadata"]["uid"])
        return run_id_of(await self.workflow(ref))

    async def _existing_run(self, ref: str) -> str:
        rid = await self.run_id(ref)
        if await self.store.get_run(rid) is None:
            if (box := sandbox_of(ref)) is not None:
                raise RunNotFound(f"Sandbox {self.namespace}/{box} has had no session call yet (run id {rid})")
            raise RunNotFound(
                f"Workflow {self.namespace}/{ref} has no run in {self.journal} yet (run id {rid}): is an operator "
                f"running? `kubectl describe workflow {ref} -n {self.namespace}` shows its conditions"
                + ("; if the operator keeps its journal in PostgreSQL (--journal), give its URL: "
                   "`dsb --kube --store postgresql://user@host/db ...`" if isinstance(self.journal, ApiServerJournal)
                   else "")
            )
        return rid

    # ------------------------------------------------------------------ what the commands call

    async def inspect(self, ref: str) -> RunState:
        name = sandbox_of(ref)
        if name is not None:
            box = await self.sandbox(name)
            rid = calls_run_id(box["metadata"]["uid"])
            if await self.store.get_run(rid) is None:
                return no_calls_state(rid, box)
            return await self.client.inspect(rid)
        obj = await self.workflow(ref)
        rid = run_id_of(obj)
        if await self.store.get_run(rid) is None:
            return not_started_state(rid, obj)  # pending, or refused (its Failed condition says why)
        return await self.client.inspect(rid)

    async def history(self, ref: str) -> list[OperationRecord]:
        return await self.client.history(await self._existing_run(ref))

    async def stream(self, ref: str, *, follow: bool = True) -> AsyncIterator[dict[str, Any]]:
        rid = await self._existing_run(ref)
        async for event in self.client.stream(rid, follow=follow, poll_interval=POLL_SECONDS):
            yield event

    async def runs(
        self, *, status: Sequence[RunStatus] | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        """One run per Workflow, newest first: its run as the operator recorded it, or a pending one
        for a Workflow the operator has not started yet."""
        objects = await self.workflows.list()
        recorded = {r.run_id: r for r in await self.store.list_runs(limit=100_000)}
        out: list[RunRecord] = []
        for obj in objects:
            rid = run_id_of(obj)
            run = recorded.get(rid) or _not_started(rid, obj)
            if (not status or run.status in status) and (workflow is None or run.workflow == workflow):
                out.append(run)
        return sorted(out, key=lambda r: r.created_at, reverse=True)[:limit]

    async def sandboxes(self) -> list[dict[str, Any]]:
        """The namespace's Sandbox resources, oldest first (as kubectl lists them: by name within a second)."""
        rows = [sandbox_summary(obj) for obj in await self.workflows.objects.list(SANDBOXES, self.namespace)]
        return sorted(rows, key=lambda r: r["name"])

    async def signal(self, ref: str, callback_id: str, value: Any = None) -> bool:
        obj = await self.workflow(ref)
        return await self.workflows.signal(obj["metadata"]["name"], callback_id, value)

    async def cancel(self, ref: str, reason: str) -> RunState:
        """Set spec.cancel; the operator cancels the run and cleans up. Returns the run as it is now."""
        obj = await self.workflow(ref)
        await self.workflows.cancel(obj["metadata"]["name"])
        rid = await self.run_id(ref)
        if await self.store.get_run(rid) is None:
            return not_started_state(rid, obj)
        return await self.client.inspect(rid)

    async def resume(self, ref: str, **_: Any) -> RunState:
        try:
            obj: dict[str, Any] | None = await self.workflow(ref)
        except CliError:
            obj = None  # no such Workflow: the answer below holds for it too
        phase = ((obj or {}).get("status") or {}).get("phase")
        if obj is not None and phase in TERMINAL_PHASES:
            name = obj["metadata"]["name"]
            retry = json.dumps({"spec": {"retry": {"maxAttempts": 2}}}, separators=(",", ":"))
            raise CliError(
                f"Workflow {name} is {phase.lower()}: a Workflow is one run, and a finished one is not run "
                f"again; {RERUN_HINT} (`kubectl patch workflow {name} -n {self.namespace} --type merge "
                f"-p '{retry}'`)"
            )
        raise CliError(
            f"in a cluster the operator continues runs by itself (after a signal, a timer, a crash); "
            f"`dsb --kube -n {self.namespace} logs -f {ref}` follows it"
        )

    # ------------------------------------------------------------------ run: apply

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return await self.workflows.apply(manifest)


def journal_of(settings: Settings) -> JournalChoice:
    """Where `dsb --kube` reads runs: the API server's Journal objects, or, given ``--store postgresql://...``,
    the operator's PostgreSQL journal (the URL its --journal got; each namespace has its schema under it)."""
    if not settings.store_given:
        return ApiServerJournal()  # not $DSB_STORE: that names the local store of `dsb` without --kube
    if not settings.postgres:
        raise CliError(f"--store {settings.store_label}: with --kube, --store names the operator's PostgreSQL "
                       f"journal (postgresql://user@host/db, as given to `dsb operator --journal`); a run in a "
                       f"cluster is never in a local file")
    return PostgresJournal(dsn=settings.location, pool_size=2)


def _created_at(obj: dict[str, Any]) -> float:
    import datetime as dt

    stamp = obj["metadata"].get("creationTimestamp")
    if not stamp:
        return time.time()
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def sandbox_summary(obj: dict[str, Any]) -> dict[str, Any]:
    """One Sandbox as `dsb --kube sandboxes` shows it (the columns of `kubectl get dsbx`, and who holds it)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    return {
        "name": obj["metadata"]["name"],
        "phase": status.get("phase") or "Pending",
        # Display only: the provider the operator pinned (its default when the spec names none), else the spec's.
        "provider": status.get("provider") or spec.get("provider") or "-",
        "ready": (ready or {}).get("status") or "Unknown",
        "reason": (ready or {}).get("reason"),
        "holder": status.get("holder"),  # the Workflow running in it (spec.sandboxRef)
        "suspend": bool(spec.get("suspend")),
        "providerId": status.get("providerId"),
        "snapshots": list(status.get("snapshots") or []),
        "createdAt": obj["metadata"].get("creationTimestamp"),
        "created": _created_at(obj),
    }


def _workflow_name(obj: dict[str, Any]) -> str:
    spec = obj.get("spec") or {}
    return str(spec.get("entrypoint") or "sandbox-agent")


def _not_started(rid: str, obj: dict[str, Any]) -> RunRecord:
    """A Workflow the operator has not started (or has refused): its status says why."""
    status = obj.get("status") or {}
    failed = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Failed" and c.get("status") == "True"), None
    )
    created = _created_at(obj)
    if failed is not None:
        error = ErrorInfo(type=str(failed.get("reason") or "Failed"), message=str(failed.get("message") or ""))
        return RunRecord(rid, _workflow_name(obj), RunStatus.FAILED, error=error, created_at=created, updated_at=created)
    return RunRecord(rid, _workflow_name(obj), RunStatus.PENDING, created_at=created, updated_at=created)


def no_calls_state(rid: str, box: dict[str, Any]) -> RunState:
    """A Sandbox that has had no session call yet: its calls' run does not exist."""
    created = _created_at(box)
    return RunState(run_id=rid, workflow=SESSION_WORKFLOW, status=RunStatus.PENDING.value, created_at=created,
                    updated_at=created, labels={"durable-sandbox.dev/sandbox": box["metadata"]["name"]})


def not_started_state(rid: str, obj: dict[str, Any]) -> RunState:
    run = _not_started(rid, obj)
    return RunState(
        run_id=run.run_id, workflow=run.workflow, status=run.status.value,
        error=run.error.to_json() if run.error else None, created_at=run.created_at, updated_at=run.updated_at,
    )  # fmt: skip
