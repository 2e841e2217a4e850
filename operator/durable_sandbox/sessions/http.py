"""The call API over HTTP(S), served by the operator process (``dsb operator --session-port``).

``POST /v1/namespaces/<namespace>/sandboxes/<name>/<kind>`` with ``kind`` one of ``shell``, ``write_file``,
``read_file``, ``list``; a JSON body (``models.py``) with the caller's ``operationId``; ``Authorization: Bearer
<Kubernetes token>``. The answer is the call's result (``CallAnswer``), or with ``Accept: text/event-stream`` its
output while it runs and then its result (``streaming.py``); every refusal a JSON ``{"error": {status, reason,
what, where, do}}``. ``POST .../snapshot``: a snapshot now, journaled (``snapshots.py``). ``GET`` and ``DELETE`` on the Sandbox's path, ``POST .../suspend`` and
``.../resume``, ``PUT`` (create or attach): its lifecycle, done with the caller's own credentials
(``lifecycle.py``); ``POST .../rewind`` with ``{"toCall": N}``: its session rewound to after call N (``rewind.py``,
allowed to who may ``update`` the Sandbox); ``.../mcp``: MCP over HTTP whose tools are its calls (``mcp_http.py``). ``POST
/v1/namespaces/<namespace>/workflows/<name>/queries/<query>`` and ``.../updates/<update>``: a Workflow run's query
and update handlers (``workflow_calls.py``). Why in the operator:
it holds each Sandbox's record, holder and call journal, so the call API is the same process that decides the
Sandbox's lifecycle, with nothing between them to fail apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import uvicorn
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from durable_sandbox.engine.errors import DurableError
from durable_sandbox.kube.api.client import brief, is_transient
from durable_sandbox.providers.contract import ProviderError
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.lifecycle import Lifecycle
from durable_sandbox.sessions.models import CALL_KINDS, RewindRequest, SnapshotRequest, request_model
from durable_sandbox.sessions.service import SessionService
from durable_sandbox.sessions.streaming import stream_answer, wants_events
from durable_sandbox.sessions.workflow_calls import QueryRequest, UpdateRequest, WorkflowCalls

if TYPE_CHECKING:  # the mcp extra may be missing: then no MCP endpoint is given (sessions/startup.py)
    from durable_sandbox.sessions.mcp_http import McpEndpoint

__all__ = ["SessionApi", "create_app", "start_session_api"]

log = logging.getLogger("durable_sandbox.sessions")


def create_app(service: SessionService, lifecycle: Lifecycle | None = None, mcp: McpEndpoint | None = None,
               workflows: WorkflowCalls | None = None) -> Starlette:
    async def call(request: Request) -> Response:
        namespace, name, kind = (request.path_params[k] for k in ("namespace", "name", "kind"))
        where = f"Sandbox {namespace}/{name}"
        try:
            model = request_model(kind)
            if model is None:
                raise CallRefused(404, f"no call kind {kind!r}", where=f"{where}, the URL's last segment",
                                  do=f"use one of {', '.join(sorted(CALL_KINDS))}, snapshot or rewind")
            parsed = await _parsed(request, model, service.limits.max_request_bytes, f"{where}, {kind}")
            token, traceparent = _bearer(request), request.headers.get("traceparent")
            if wants_events(request.headers.get("accept")):  # server-sent events: the output while it runs
                return await stream_answer(lambda sink: service.call(token, namespace, name, parsed,  # type: ignore[arg-type]
                                                                     traceparent=traceparent, sink=sink),
                                           lambda exc: _failure(where, exc), service.detached,
                                           service.limits.max_streamed_bytes)
            answer = await service.call(token, namespace, name, parsed, traceparent=traceparent)  # type: ignore[arg-type]
            return JSONResponse(answer.model_dump(exclude_none=True))
        except Exception as exc:
            return _failure(where, exc)

    async def healthz(_: Request) -> Response:
        return Response("ok\n")

    async def lifecycle_call(request: Request) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        token = _bearer(request)
        try:
            if lifecycle is None:
                raise CallRefused(404, "this call API does not serve Sandbox lifecycle requests",
                                  where=f"Sandbox {namespace}/{name}", do="use kubectl (patch spec.suspend, delete)")
            action = request.url.path.rstrip("/").rsplit("/", 1)[-1]
            if request.method == "PUT":  # create, or attach to the one that exists (its spec as it is)
                spec = await _spec(request, service.limits.max_request_bytes, f"Sandbox {namespace}/{name}")
                return JSONResponse(await lifecycle.create_or_get(token, namespace, name, spec))
            if request.method == "DELETE":
                await lifecycle.delete(token, namespace, name)
                return JSONResponse({"deleted": True})
            if action in ("suspend", "resume"):
                return JSONResponse(await lifecycle.set_suspend(token, namespace, name, action == "suspend"))
            return JSONResponse(await lifecycle.state(token, namespace, name))
        except CallRefused as refused:
            return _refusal(refused)

    async def mcp_route(scope: Scope, receive: Receive, send: Send) -> None:
        params = scope.get("path_params") or {}
        token = _bearer(Request(scope))
        if mcp is None:
            refused = CallRefused(404, "this call API does not serve MCP", where="the /mcp path",
                                  do="use `dsb mcp --sandbox NAME` (stdio)")
            await _refusal(refused)(scope, receive, send)
            return
        await mcp.handle(scope, receive, send, token=token, namespace=params["namespace"], name=params["name"],
                         refuse=_refusal)

    if workflows is not None and workflows.within_rate is None:  # a query or update is held to the caller's rate
        workflows = dataclasses.replace(workflows, within_rate=service.within_rate)
    workflow_call = _workflow_route(service, workflows)
    prefix = "/v1/namespaces/{namespace}/sandboxes/{name}"
    workflow_prefix = "/v1/namespaces/{namespace}/workflows/{name}"
    return Starlette(routes=[
        Route(workflow_prefix + "/queries/{handler}", workflow_call, methods=["POST"]),
        Route(workflow_prefix + "/updates/{handler}", workflow_call, methods=["POST"]),
        Route(prefix + "/mcp", _Asgi(mcp_route), methods=["GET", "POST", "DELETE"]),
        Route(prefix, lifecycle_call, methods=["GET", "PUT", "DELETE"]),
        Route(prefix + "/suspend", lifecycle_call, methods=["POST"]),
        Route(prefix + "/resume", lifecycle_call, methods=["POST"]),
        Route(prefix + "/rewind", _rewind(service), methods=["POST"]),
        Route(prefix + "/snapshot", _snapshot(service), methods=["POST"]),
        Route(prefix + "/{kind}", call, methods=["POST"]),
        Route("/healthz", healthz),
    ])


def _snapshot(service: SessionService) -> Callable[[Request], Awaitable[Response]]:
    """``POST .../snapshot``: a snapshot of the Sandbox now, journaled (sessions/snapshots.py)."""

    async def snapshot(request: Request) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        where = f"Sandbox {namespace}/{name}"
        try:
            parsed = await _parsed(request, SnapshotRequest, service.limits.max_request_bytes, f"{where}, snapshot")
            taken = await service.snapshot(_bearer(request), namespace, name, parsed)  # type: ignore[arg-type]
            return JSONResponse(taken.model_dump())
        except Exception as exc:
            return _failure(where, exc)

    return snapshot


def _rewind(service: SessionService) -> Callable[[Request], Awaitable[Response]]:
    """``POST .../rewind`` with ``{"toCall": N}``: the Sandbox's session rewound (sessions/rewind.py)."""

    async def rewind(request: Request) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        where = f"Sandbox {namespace}/{name}"
        try:
            body = await _bounded_body(request, service.limits.max_request_bytes, where)
            try:
                parsed = RewindRequest.model_validate_json(body)
            except ValidationError as exc:
                raise CallRefused(400, "the request body is not a valid rewind: " + _fields(exc),
                                  where=f"{where}, rewind", do="send {\"toCall\": N}: the calls to keep") from None
            answer = await service.rewind(_bearer(request), namespace, name, parsed)
            return JSONResponse(answer.model_dump())
        except CallRefused as refused:
            return _refusal(refused)
        except DurableError as exc:  # a replay that diverged (ReconstructionError), a call that cannot be replayed
            return _refusal(CallRefused(500, str(exc), where=where,
                                        do="the rewind itself is committed; rewind to before the call named (its "
                                        "outcome cannot be made again), or see the operator's log"))

    return rewind


async def _parsed(request: Request, model: type[BaseModel], limit: int, where: str) -> BaseModel:
    """The request's body as ``model`` (bounded; 400 naming the fields that are wrong)."""
    body = await _bounded_body(request, limit, where)
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise CallRefused(400, "the request body is not a valid call: " + _fields(exc), where=where,
                          do="fix the fields named (docs/agents.md lists each call's fields)") from None


def _failure(where: str, exc: Exception) -> JSONResponse:
    """What a caller is told when a call (or snapshot) did not give an answer."""
    if isinstance(exc, CallRefused):
        return _refusal(exc)
    if isinstance(exc, ProviderError):
        return _refusal(CallRefused(503, f"the provider failed the call: {exc}", where=where,
                                    do="retry with the same operationId (a call that completed is not run again)"))
    if isinstance(exc, DurableError):
        return _refusal(CallRefused(500, str(exc), where=where,
                                    do="see the operator's log for this Sandbox; retry with the same operationId"))
    # The API server away, a damaged record, a bug: the caller is told, the log has it.
    log.error("%s: a call failed", where, exc_info=exc)
    return _refusal(CallRefused(503 if is_transient(exc) else 500, f"the call failed: {brief(exc)}",
                                where=where, do="retry with the same operationId (a call that completed is "
                                "not run again); the operator's log has the details"))


def _workflow_route(service: SessionService, workflows: WorkflowCalls | None) -> Any:
    """``POST .../workflows/<name>/queries/<q>`` and ``.../updates/<u>`` (sessions/workflow_calls.py)."""

    async def workflow_call(request: Request) -> Response:
        namespace, name, handler = (request.path_params[k] for k in ("namespace", "name", "handler"))
        is_update = "/updates/" in request.url.path
        where = f"Workflow {namespace}/{name}, {'update' if is_update else 'query'} {handler}"
        try:
            if workflows is None:
                raise CallRefused(404, "this call API does not serve Workflow queries and updates", where=where,
                                  do="use `dsb query`/`dsb update` against the run's store")
            body = await _bounded_body(request, service.limits.max_request_bytes, where) or b"{}"
            token = _bearer(request)
            try:
                if is_update:
                    return JSONResponse(await workflows.update(token, namespace, name, handler,
                                                               UpdateRequest.model_validate_json(body)))
                return JSONResponse(await workflows.query(token, namespace, name, handler,
                                                          QueryRequest.model_validate_json(body)))
            except ValidationError as exc:
                raise CallRefused(400, "the request body is not valid: " + _fields(exc), where=where,
                                  do='send {"arg": ...} to a query, {"input": ..., "updateId": "..."} to an update') from None
        except CallRefused as refused:
            return _refusal(refused)
        except DurableError as exc:
            return _refusal(CallRefused(500, str(exc), where=where, do="see the operator's log for this Workflow"))
        except Exception as exc:  # the API server away, a bug: the caller is told, the log has it
            log.exception("%s failed", where)
            return _refusal(CallRefused(503 if is_transient(exc) else 500, f"the request failed: {brief(exc)}",
                                        where=where, do="retry (an update with the same updateId is applied once)"))

    return workflow_call


async def _spec(request: Request, limit: int, where: str) -> dict[str, Any]:
    """A create-or-attach body: ``{"spec": {...}}`` (the Sandbox's spec; the API server validates it)."""
    body = await _bounded_body(request, limit, where)
    try:
        parsed = json.loads(body or b"{}")
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("spec", {}), dict):
        raise CallRefused(400, "the body is not {\"spec\": {...}}", where=f"{where}, request body",
                          do="send the Sandbox's spec as {\"spec\": {...}} (docs/kubernetes.md#sandbox-resources)")
    return dict(parsed.get("spec") or {})


@dataclass(frozen=True)
class _Asgi:
    """A raw ASGI endpoint (Starlette takes a plain function for a request handler)."""

    app: Any

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


async def _bounded_body(request: Request, limit: int, where: str) -> bytes:
    too_big = CallRefused(413, f"the request body is over {limit} bytes", where=f"{where}, request body",
                          do="send large files in parts (several write_file calls), or raise --session-max-request-bytes")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _fields(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()[:5])


def _refusal(refused: CallRefused) -> JSONResponse:
    wait = refused.body.retryAfter
    headers = {"Retry-After": str(max(1, math.ceil(wait)))} if wait is not None else None
    return JSONResponse({"error": refused.body.model_dump(exclude_none=True)}, status_code=refused.status,
                        headers=headers)


class _QuietServer(uvicorn.Server):
    """uvicorn inside the operator's event loop: the operator's own signal handlers stay (runs are handed over on
    SIGTERM before anything stops)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


@dataclass
class SessionApi:
    server: uvicorn.Server
    task: asyncio.Task[None]
    port: int

    async def stop(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(self.task, timeout=10)


async def start_session_api(service: SessionService, *, host: str, port: int, certfile: str | None = None,
                            keyfile: str | None = None, lifecycle: Lifecycle | None = None,
                            mcp: McpEndpoint | None = None, workflows: WorkflowCalls | None = None) -> SessionApi:
    """Serve the call API on ``host:port`` (0: any free port), over TLS when ``certfile`` is given."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on connections of a socket whose proto says TCP,
    # and without it every answer (uvicorn writes its headers and its body apart) waited ~40 ms for the client's
    # delayed ACK (Nagle): 45 of a no-op call's 77 ms (docs/benchmarks.md, "One call's path, phase by phase").
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"cannot serve the session API on {host}:{port}: {exc.strerror}; choose another "
                           f"--session-port") from exc
    sock.listen(128)
    config = uvicorn.Config(create_app(service, lifecycle, mcp, workflows), lifespan="off", log_level="warning", access_log=False,
                            server_header=False, proxy_headers=False, timeout_graceful_shutdown=5,
                            ssl_certfile=certfile, ssl_keyfile=keyfile, ssl_version=ssl.PROTOCOL_TLS_SERVER)
    server = _QuietServer(config)
    async def serve() -> None:
        async with mcp.lifespan() if mcp is not None else contextlib.nullcontext():  # the MCP SDK's session manager
            await server.serve(sockets=[sock])

    task = asyncio.create_task(serve())
    bound = int(sock.getsockname()[1])
    log.info("serving the session API on %s://%s:%d", "https" if certfile else "http", host, bound)
    return SessionApi(server, task, bound)
