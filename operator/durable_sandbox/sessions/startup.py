"""The session API in `dsb operator`: a startup hook (``kube.handlers.STARTUP_HOOKS``) that builds the service from
the operator's own parts (its API client, Sandbox records, holder, providers and journals) and serves it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.kube.controller import Operator
from durable_sandbox.sessions.http import SessionApi, start_session_api
from durable_sandbox.sessions.journal import SessionJournal
from durable_sandbox.sessions.kube_auth import KubeAuthorizer
from durable_sandbox.sessions.kube_gate import KubeSandboxGate
from durable_sandbox.sessions.models import Limits
from durable_sandbox.sessions.service import SessionService

__all__ = ["SessionApiSettings", "session_api_hooks"]


@dataclass(frozen=True)
class SessionApiSettings:
    port: int
    host: str = "0.0.0.0"
    certfile: str | None = None
    keyfile: str | None = None
    limits: Limits = field(default_factory=Limits)


def build_service(op: Operator, settings: SessionApiSettings, namespaces: frozenset[str]) -> SessionService:
    journals: dict[str, SessionJournal] = {}

    def journal_for(namespace: str) -> SessionJournal:
        found = journals.get(namespace)
        if found is None:
            found = journals[namespace] = SessionJournal(op.engines.journals.store_for(namespace),
                                                         worker_id=op.settings.worker_id,
                                                         lease_ttl=op.settings.lease_ttl)
        return found

    gate = KubeSandboxGate(op.objects, op.records, op.holding, op.engines.provider_for_once, namespaces=namespaces)
    return SessionService(KubeAuthorizer(op.api), gate, journal_for, settings.limits)


def session_api_hooks(settings: SessionApiSettings, namespaces: list[str]) -> tuple[
        Callable[..., Awaitable[None]], Callable[[], Awaitable[None]]]:
    """(startup hook, shutdown hook) serving the call API for as long as the operator runs."""
    servers: list[SessionApi] = []

    async def start(op: Operator, *_: Any) -> None:
        service = build_service(op, settings, frozenset(namespaces))
        servers.append(await start_session_api(service, host=settings.host, port=settings.port,
                                               certfile=settings.certfile, keyfile=settings.keyfile))

    async def stop() -> None:
        while servers:
            await servers.pop().stop()

    return start, stop
