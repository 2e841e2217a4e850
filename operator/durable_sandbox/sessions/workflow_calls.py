"""Queries and updates of a cluster's Workflows through the call API (engine/updates.py, served by sessions/http.py).

``POST /v1/namespaces/<ns>/workflows/<name>/queries/<query>`` with ``{"arg": ...}`` and ``POST .../updates/<update>``
with ``{"input": ..., "updateId": "..."}``, ``Authorization: Bearer <Kubernetes token>``. The caller's own rights
decide (a TokenReview, then a SubjectAccessReview): a query needs ``get`` on the Workflow, an update ``update``, so
whoever may edit the Workflow's spec may update its run and nobody else. The run is found from what the API server
recorded of the object, its name and uid (``cluster_run_id``), and followed along its continue-as-new chain in the
namespace's own store: never from a label, an annotation or the status, which others may write.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from durable_sandbox.engine.continue_as_new import follow
from durable_sandbox.engine.engine import Engine
from durable_sandbox.engine.errors import (
    LeaseHeld,
    QueryRefused,
    UpdateConflict,
    UpdateRefused,
    WorkflowNotFound,
)
from durable_sandbox.kube.api.resources import WORKFLOWS
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.sessions.errors import CallRefused

__all__ = ["QueryRequest", "UpdateRequest", "WorkflowCalls"]


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    arg: Any = None


class UpdateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: Any = None
    updateId: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$")


class WorkflowAuthorizer(Protocol):
    async def check_workflow(self, token: str | None, namespace: str, name: str, verb: str) -> str: ...


Reader = Callable[[str, str, str], Awaitable["dict[str, Any] | None"]]  # (plural, namespace, name) -> object


@dataclass(frozen=True)
class WorkflowCalls:
    """Answers the call API's Workflow queries and updates with the operator's engine of each namespace."""

    authorizer: WorkflowAuthorizer
    read: Reader
    engine_for: Callable[[str], Engine]
    namespaces: frozenset[str] = frozenset()  # the namespaces this operator serves (empty: all)
    # The call API's calls per second per caller (``SessionService.within_rate``): a query or update is a request
    # like a call, from the same bucket (``http.create_app`` gives the service's when None is given)
    within_rate: Callable[[str, str], str] | None = None

    async def query(self, token: str | None, namespace: str, name: str, query: str, request: QueryRequest) -> dict[str, Any]:
        self._rate(await self.authorizer.check_workflow(token, namespace, name, "get"), namespace, name)
        engine, run_id = await self._run(namespace, name)
        where = f"Workflow {namespace}/{name}, query {query}"
        try:
            answer = await engine.query(run_id, query, request.arg)
        except QueryRefused as exc:
            raise CallRefused(400, str(exc), where=where, do="ask a query the workflow registers "
                              "(ctx.query_handler), with an argument its handler takes") from None
        except WorkflowNotFound as exc:
            raise CallRefused(500, str(exc), where=where, do="the operator must be able to import the workflow's "
                              "module (its image, --workflows)") from None
        return {"runId": run_id, "query": query, "answer": answer}

    async def update(self, token: str | None, namespace: str, name: str, update: str,
                     request: UpdateRequest) -> dict[str, Any]:
        self._rate(await self.authorizer.check_workflow(token, namespace, name, "update"), namespace, name)
        engine, run_id = await self._run(namespace, name)
        where = f"Workflow {namespace}/{name}, update {update}"
        try:
            outcome = await engine.update(run_id, update, request.input, update_id=request.updateId, wait=20.0)
        except UpdateRefused as exc:
            raise CallRefused(400, str(exc), where=where, do="fix the input (nothing was recorded; the run is "
                              "unchanged)") from None
        except UpdateConflict as exc:
            raise CallRefused(409, str(exc), where=where, do="send the same input to read the recorded result "
                              "again, or use a new updateId") from None
        except LeaseHeld:
            raise CallRefused(503, "the run is executing in another replica right now", where=where,
                              do="retry with the same updateId (it is applied once)", retry_after=5.0) from None
        except WorkflowNotFound as exc:
            raise CallRefused(500, str(exc), where=where, do="the operator must be able to import the workflow's "
                              "module (its image, --workflows)") from None
        return {"runId": run_id, "update": update, **outcome.to_json()}

    def _rate(self, caller: str, namespace: str, name: str) -> None:
        if self.within_rate is not None:
            self.within_rate(caller, f"Workflow {namespace}/{name}")

    async def _run(self, namespace: str, name: str) -> tuple[Engine, str]:
        where = f"Workflow {namespace}/{name}"
        if self.namespaces and namespace not in self.namespaces:
            raise CallRefused(404, f"this operator does not serve namespace {namespace}", where=where,
                              do="ask the operator that watches that namespace")
        obj = await self.read(WORKFLOWS, namespace, name)
        if obj is None:
            raise CallRefused(404, "no such Workflow", where=where, do="check the name and namespace (kubectl get dwf)")
        meta = obj.get("metadata") or {}
        engine = self.engine_for(namespace)
        first = await engine.store.get_run(cluster_run_id(str(meta.get("name")), str(meta.get("uid"))))
        if first is None:
            raise CallRefused(409, "the Workflow has no run yet", where=where,
                              do="retry once the operator has admitted it (status.runId set)", retry_after=2.0)
        return engine, (await follow(engine.store, first)).run_id
