"""The session API in `dsb operator`: a service of the operator process (``kube/process/application.py`` starts it once
its controllers are built) that builds the call service from the operator's own parts (its API client, Sandbox
records, holder, providers and journals) and serves it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.kube.workflow.controller import Operator
from durable_sandbox.sessions.hold import HoldSettings
from durable_sandbox.sessions.http import SessionApi, start_session_api
from durable_sandbox.sessions.journal import SessionJournal
from durable_sandbox.sessions.kube_auth import KubeAuthorizer
from durable_sandbox.sessions.kube_gate import KubeSandboxGate
from durable_sandbox.sessions.lifecycle import KubeLifecycle
from durable_sandbox.sessions.models import Limits
from durable_sandbox.sessions.service import SessionService
from durable_sandbox.sessions.workflow_calls import WorkflowCalls

__all__ = ["SessionApiService", "SessionApiSettings"]

log = logging.getLogger("durable_sandbox.sessions")


@dataclass(frozen=True)
class SessionApiSettings:
    port: int
    host: str = "0.0.0.0"
    certfile: str | None = None
    keyfile: str | None = None
    limits: Limits = field(default_factory=Limits)
    hold: HoldSettings = field(default_factory=HoldSettings)


def build_service(op: Operator, settings: SessionApiSettings, namespaces: frozenset[str],
                  journals: dict[str, SessionJournal]) -> SessionService:

    def journal_for(namespace: str) -> SessionJournal:
        found = journals.get(namespace)
        if found is None:
            found = journals[namespace] = SessionJournal(op.engines.journals.store_for(namespace),
                                                         worker_id=op.settings.worker_id,
                                                         lease_ttl=op.settings.lease_ttl, hold=settings.hold)
        return found

    gate = KubeSandboxGate(op.objects, op.records, op.holding, op.engines.provider_for_once, namespaces=namespaces)
    return SessionService(KubeAuthorizer(op.api), gate, journal_for, settings.limits)


class SessionApiService:
    """The call API as a service of the operator process (``kube/process/process_config.py``'s ``Service``): built from the
    operator's own parts once its controllers are, served until the process closes."""

    def __init__(self, settings: SessionApiSettings, namespaces: tuple[str, ...]) -> None:
        self.settings = settings
        self.namespaces = frozenset(namespaces)
        self._server: SessionApi | None = None
        self._journals: dict[str, SessionJournal] = {}  # namespace -> its Sandboxes' call journals (open sessions)
        self._lifecycle: KubeLifecycle | None = None

    async def start(self, workflows: Operator) -> None:
        service = build_service(workflows, self.settings, self.namespaces, self._journals)
        self._lifecycle = KubeLifecycle.of(workflows.api.api_client.configuration)
        self._server = await start_session_api(service, host=self.settings.host, port=self.settings.port,
                                               certfile=self.settings.certfile, keyfile=self.settings.keyfile,
                                               lifecycle=self._lifecycle, mcp=_mcp(service),
                                               workflows=WorkflowCalls(KubeAuthorizer(workflows.api), workflows.objects.get,
                                                                       workflows.engines.engine_for, self.namespaces))

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop()
        for journal in self._journals.values():  # after the last answer: the open sessions' holders and leases
            await journal.aclose()
        if self._lifecycle is not None:
            await self._lifecycle.aclose()


def _mcp(service: SessionService) -> Any:
    """MCP over HTTP (``mcp_http.py``) when the mcp package is installed (the kubernetes extra carries it)."""
    try:
        from durable_sandbox.sessions.mcp_http import McpEndpoint
    except ImportError as exc:
        log.warning("MCP over HTTP is not served: %s (pip install 'durable-sandbox[mcp]')", exc)
        return None
    return McpEndpoint(service)
