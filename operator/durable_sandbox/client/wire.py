"""The call API's wire: its address and credentials (``_Target``), answers (``CallResult``, ``SnapshotResult``),
refusals (``SandboxCallError``) and the one retry rule (``_retry_after``) the client's calls and streams share."""

from __future__ import annotations

import os
import ssl
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from durable_sandbox.client.credentials import default_namespace, token_source
from durable_sandbox.tracing.traceparent import outgoing_traceparent

__all__ = ["CallResult", "SandboxCallError", "SnapshotResult"]

URL_ENV = "DSB_SESSION_URL"  # the call API's address when none is given
CA_ENV = "DSB_SESSION_CA"  # a CA bundle to verify it with (HTTPS)
RETRY_FOR = 120.0  # seconds a call is retried (same operation id) across disconnects and retryable refusals
FIRST_DELAY, MAX_DELAY = 0.2, 5.0
MAX_WAIT_ASKED = 30.0  # the longest wait a server's Retry-After is followed for at once


@dataclass(frozen=True)
class CallResult:
    operation_id: str
    exit_code: int
    stdout: str
    stderr: str
    stdout_bytes: int | None = None  # a cut stream's full size (the journal keeps its first and last 64 KiB)
    stderr_bytes: int | None = None
    replayed: bool = False  # answered from the journal: the call had run before this request

    @classmethod
    def of(cls, data: dict[str, Any]) -> CallResult:
        return cls(operation_id=data["operationId"], exit_code=int(data["exitCode"]), stdout=data.get("stdout", ""),
                   stderr=data.get("stderr", ""), stdout_bytes=data.get("stdoutBytes"),
                   stderr_bytes=data.get("stderrBytes"), replayed=bool(data.get("replayed")))


@dataclass(frozen=True)
class SnapshotResult:
    operation_id: str
    snapshot_id: str
    calls: int  # the session calls it holds
    replayed: bool = False  # the snapshot an earlier request with this operation id took

    @classmethod
    def of(cls, data: dict[str, Any]) -> SnapshotResult:
        return cls(operation_id=data["operationId"], snapshot_id=data["snapshotId"], calls=int(data["calls"]),
                   replayed=bool(data.get("replayed")))


class SandboxCallError(RuntimeError):
    """The call API refused a call: ``status`` and the server's what/where/do."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        self.status = status
        self.error = error
        super().__init__(f"{status} {error.get('reason', '')}: {error.get('what', '')} ({error.get('where', '')}); "
                         f"{error.get('do', '')}")


def _error_of(response: httpx.Response) -> SandboxCallError:
    try:
        error = response.json().get("error") or {}
    except ValueError:
        error = {"what": response.text[:500], "where": str(response.url), "do": "check the call API's address"}
    return SandboxCallError(response.status_code, error)


def _retry_after(outcome: httpx.Response | Exception, attempt: int, started: float, retry_for: float) -> float | None:
    """How long to wait before sending the same call again, or None to stop: a lost connection (the request or its
    answer may be lost: the journal answers a repeat) and refusals the server marks ``retry``."""
    if time.monotonic() - started > retry_for:
        return None
    if isinstance(outcome, httpx.Response):
        if outcome.status_code < 400:
            return None
        try:
            retry = bool((outcome.json().get("error") or {}).get("retry"))
        except ValueError:
            retry = outcome.status_code in (502, 503, 504)  # a proxy's answer, not the API's
        if not retry:
            return None
        asked = _retry_after_header(outcome)
        if asked is not None:  # the server says when (429 over the caller's rate): not sooner, and not for ever
            return min(asked, MAX_WAIT_ASKED)
    elif not isinstance(outcome, httpx.TransportError):
        return None
    return min(FIRST_DELAY * 2 ** attempt, MAX_DELAY)


def _retry_after_header(response: httpx.Response) -> float | None:
    """The answer's wait in seconds: the error's ``retryAfter`` (fractions), else the Retry-After header."""
    try:
        given = (response.json().get("error") or {}).get("retryAfter")
    except ValueError:
        given = None
    if given is None:
        given = response.headers.get("retry-after")
    try:
        return max(float(given), 0.0) if given is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff decides


def _operation_id(given: str | None) -> str:
    return given or f"c-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class _Target:
    url: str
    namespace: str
    name: str
    token: Callable[[], str]

    def path(self, kind: str = "") -> str:
        base = f"{self.url.rstrip('/')}/v1/namespaces/{self.namespace}/sandboxes/{self.name}"
        return f"{base}/{kind}" if kind else base

    def headers(self) -> dict[str, str]:
        # The caller's trace context, so the call's spans join its trace (docs/operations.md, "Traces").
        caller = outgoing_traceparent()
        return {"Authorization": f"Bearer {self.token()}", **({"traceparent": caller} if caller else {})}


def _target(name: str, namespace: str | None, url: str | None, token: str | None, kubeconfig: str | None,
            context: str | None) -> _Target:
    address = url or os.environ.get(URL_ENV)
    if not address:
        raise ValueError(f"no call API address: pass url=... or set ${URL_ENV} (the operator's --session-port, e.g. "
                         f"https://durable-sandbox-sessions.durable-sandbox-system.svc:8443)")
    return _Target(address, namespace or default_namespace(kubeconfig=kubeconfig, context=context), name,
                   token_source(token=token, kubeconfig=kubeconfig, context=context))


def _verify(verify: bool | str | None) -> bool | ssl.SSLContext:
    """True (the system's CAs), False (no check: never in production), or a context trusting the CA bundle named
    by ``verify`` or $DSB_SESSION_CA."""
    chosen = verify if verify is not None else os.environ.get(CA_ENV) or True
    return ssl.create_default_context(cafile=chosen) if isinstance(chosen, str) else chosen
