"""A Sandbox's own session calls for the web view (``dsb --kube ui``): the page ``/run?id=sandbox/NAME``.

The calls run (``dsbx.<uid>.calls``, sessions/journal.py) is read like a Workflow's run: through ``KubernetesStore``
with the viewer's kubeconfig, its header from the one run summary (``sandboxes/summary.py``, which
``dsb --kube inspect sandbox/NAME`` prints too), its timeline from its journal (calls with the caller's operation
ids, snapshots, the rebuilds that replayed calls into a replacement sandbox) and the Sandbox's Kubernetes Events
(the controller's loss, recovery, suspend and resume, which the calls journal does not hold). The Sandbox is read
by name, and its calls by the uid the API server gives: a Sandbox deleted and made again under the same name
shows its own calls only. There are no actions: a Sandbox is steered through its spec (``kubectl``) and called
through the call API.
"""

from __future__ import annotations

from typing import Any

from durable_sandbox.engine import OperationRecord
from durable_sandbox.kube.sandbox.view import calls_run_id
from durable_sandbox.runs.cluster import ClusterEngine, no_calls_state
from durable_sandbox.sandboxes.summary import summarize
from durable_sandbox.ui.kube_events import object_events, parse_time
from durable_sandbox.ui.source import RunDetail, RunHead, caught_up

__all__ = ["SandboxSessions"]


class SandboxSessions:
    """The ``sandbox/NAME`` pages of one namespace."""

    def __init__(self, cluster: ClusterEngine) -> None:
        self.cluster = cluster

    async def head(self, name: str) -> RunHead:
        box = await self.cluster.sandbox(name)  # CliError (no such Sandbox, not allowed) names the namespace
        created = parse_time(box["metadata"].get("creationTimestamp")) or 0.0
        run = await self.cluster.store.get_run(calls_run_id(box["metadata"]["uid"]))
        if run is None:
            return RunHead(None, created, "pending", False, session=True)
        # Live while a call holds the calls run's lease; between calls the session is open, not stopped.
        return RunHead(run.run_id, min(created, run.created_at) if created else run.created_at, run.status.value,
                       False, live=not run.stale, session=True)

    async def detail(self, ref: str, name: str, journal: list[OperationRecord] | None = None) -> RunDetail:
        box = await self.cluster.sandbox(name)
        rid = calls_run_id(box["metadata"]["uid"])
        run = await self.cluster.store.get_run(rid)  # read before the rows (see RunSource.detail)
        if run is None:
            state, done, total = no_calls_state(rid, box), None, None
        else:
            summary = summarize(run, await caught_up(self.cluster.store, rid, journal))
            state, done, total = summary.state, summary.calls_done, summary.calls_total
        return RunDetail(ref=ref, run_id=rid, state=state, name=None, attempt=1, calls_done=done,
                         calls_total=total, started=run is not None, terminal=False, actions=[],
                         facts=self.facts(box), not_started=f"Sandbox {self.cluster.namespace}/{name} has had no "
                         "session call yet: its calls have no journal.")  # fmt: skip

    def facts(self, box: dict[str, Any]) -> list[tuple[str, str]]:
        """What ``kubectl describe dsbx`` shows of it: phase, provider, the live sandbox, snapshots, holder, Ready."""
        spec, status = box.get("spec") or {}, box.get("status") or {}
        facts = [("Sandbox", f"{self.cluster.namespace}/{box['metadata']['name']}"),
                 ("phase", str(status.get("phase") or "Pending"))]
        for label, value in (("provider", status.get("provider") or spec.get("provider")),
                             ("live sandbox", status.get("providerId")), ("held by", status.get("holder")),
                             ("status.snapshots", ", ".join(status.get("snapshots") or []) or None),
                             ("spec.snapshotEveryNCalls", spec.get("snapshotEveryNCalls")),
                             ("spec.idleSuspendAfterSeconds", spec.get("idleSuspendAfterSeconds"))):
            if value not in (None, "", 0):
                facts.append((label, str(value)))
        if spec.get("suspend"):
            facts.append(("spec.suspend", "true"))
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        if ready is not None:
            facts.append(("Ready", f"{ready.get('status')} ({ready.get('reason')}): {ready.get('message')}"))
        return facts

    async def version(self, name: str) -> Any:
        box = await self.cluster.sandbox(name)
        run = await self.cluster.store.get_run(calls_run_id(box["metadata"]["uid"]))
        return box["metadata"].get("resourceVersion"), None if run is None else (run.status, run.updated_at)

    async def object_events(self, name: str) -> list[dict[str, Any]]:
        """Every Event of the Sandbox: its calls' journal records none of the controller's steps."""
        return await object_events(self.cluster, "Sandbox", await self.cluster.sandbox(name))
