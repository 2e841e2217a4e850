"""A fake E2B service speaking the documented HTTP protocol (see /work/shared/reference/e2b-protocol.md).

Two aiohttp apps on two loopback ports, like E2B's API host and its envd sandbox host. Every request is
checked against the documented shape; anything malformed gets ``400 {"code": 400, "message": <reason>}``
and is recorded as a rejection, so drift in the adapter fails tests instead of passing silently.

Run by hand: ``python -m tests.fakes.e2b_server --port 3000`` (envd on port + 1).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import datetime as dt
import json
import os
import re
import secrets
import signal
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

from aiohttp import BodyPartReader, web
from multidict import CIMultiDict

from tests.fakes import connect
from tests.fakes.e2b_state import (
    DEFAULT_TIMEOUT_SECONDS,
    ENVD_PORT,
    ENVD_VERSION,
    HOME,
    MAX_PAGE_LIMIT,
    MAX_TIMEOUT_SECONDS,
    STALL_LIMIT_SECONDS,
    EosError,
    FakeState,
    IdempotentCreate,
    RecordedRequest,
    Sandbox,
    Snapshot,
)

STATE_KEY: web.AppKey[FakeState] = web.AppKey("state", FakeState)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Reject(Exception):
    """The request does not match the documented protocol."""


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"code": status, "message": message}, status=status)


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat().replace("+00:00", "Z")


def _parse_iso(value: str) -> float:
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise Reject(f"not an RFC 3339 time: {value!r}") from None


# ------------------------------------------------------------------------------------ shape checks


def _require_json_body(request: web.Request, raw: bytes) -> dict[str, Any]:
    if request.content_type != "application/json":
        raise Reject(f"{request.method} {request.path} needs Content-Type application/json, got {request.content_type!r}")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise Reject(f"body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise Reject("body must be a JSON object")
    return body


def _check_keys(body: dict[str, Any], *, required: set[str], allowed: set[str]) -> None:
    missing = required - body.keys()
    if missing:
        raise Reject(f"missing field(s) {sorted(missing)}")
    unknown = body.keys() - allowed
    if unknown:
        raise Reject(f"unknown field(s) {sorted(unknown)}")


def _check_str_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise Reject(f"{what} must be an object of strings")
    return value


def _check_timeout(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TIMEOUT_SECONDS:
        raise Reject(f"timeout must be an integer number of seconds in [0, {MAX_TIMEOUT_SECONDS}], got {value!r}")
    return value


def _check_no_body(request: web.Request, raw: bytes) -> None:
    if raw:
        raise Reject(f"{request.method} {request.path} takes no body")


def _check_query(request: web.Request, allowed: set[str], required: frozenset[str] = frozenset()) -> dict[str, str]:
    keys = list(request.query.keys())
    if len(keys) != len(set(keys)):
        raise Reject("repeated query parameters")
    unknown = set(keys) - allowed
    if unknown:
        raise Reject(f"unknown query parameter(s) {sorted(unknown)}")
    missing = required - set(keys)
    if missing:
        raise Reject(f"missing query parameter(s) {sorted(missing)}")
    return dict(request.query)


# ------------------------------------------------------------------------------------ middleware


def _recording(server: str, auth: Callable[[FakeState, web.Request], web.Response | None]) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        state = request.app[STATE_KEY]
        parsed: Any = None
        envelope: Any = None
        if request.content_type == "application/json":
            # Multipart bodies are left unread here: the handler streams them.
            with contextlib.suppress(ValueError):
                parsed = json.loads(await request.read())
        elif request.content_type == "application/connect+json":
            with contextlib.suppress(ValueError):
                envelope = connect.decode_single_request(await request.read())
        record = RecordedRequest(
            server=server,  # type: ignore[arg-type]
            method=request.method,
            path=request.path,
            raw_path=request.raw_path.split("?", 1)[0],
            query=dict(request.query),
            raw_query=request.query_string,
            headers=CIMultiDict(request.headers),  # header names are case-insensitive (the SDK sends lowercase)
            json=parsed,
            envelope=envelope,
        )
        state.requests.append(record)
        state.reap_expired()
        denied = auth(state, request)
        if denied is not None:
            record.status = denied.status
            return denied
        if server == "api" and (request.method, request.path) in state.stalled_requests:
            # The client gave up on a stalled request and sent it again: this one is processed.
            state.stalled_requests.pop((request.method, request.path)).set()
        elif server == "api" and state.request_stalls > 0:
            state.request_stalls -= 1
            state.stalls_fired += 1
            released = state.stalled_requests[(request.method, request.path)] = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(released.wait(), STALL_LIMIT_SECONDS)
            if state.stalled_requests.get((request.method, request.path)) is released:
                del state.stalled_requests[(request.method, request.path)]
            record.status = 504
            return _error(504, "injected stall: gateway timeout, the request was not processed")
        if server == "api" and state.request_faults:
            fault = state.request_faults.pop(0)
            state.request_faults_fired += 1
            headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else None
            record.status = fault.status
            return web.json_response({"code": fault.status, "message": f"injected fault {fault.status}"},
                                     status=fault.status, headers=headers)
        if state.throttled and state.throttle_server in (None, server):
            state.throttled -= 1
            retry_after = state.throttle_retry_after
            record.status = 429
            return web.json_response({"code": 429, "message": "rate limit exceeded"}, status=429,
                                     headers={"Retry-After": retry_after} if retry_after is not None else None)
        try:
            response = await handler(request)
        except Reject as exc:
            record.rejection = str(exc)
            response = _error(400, str(exc))
        record.status = response.status
        return response

    return middleware


def _api_auth(state: FakeState, request: web.Request) -> web.Response | None:
    key = request.headers.get("X-API-Key")
    if key is None:
        return _error(401, "missing X-API-Key header")
    if not secrets.compare_digest(key, state.api_key):
        return _error(401, "Invalid API key")
    return None


def _envd_auth(state: FakeState, request: web.Request) -> web.Response | None:
    # Routing headers first: without them the shared sandbox host cannot know where to send the request.
    sid = request.headers.get("E2b-Sandbox-Id")
    port = request.headers.get("E2b-Sandbox-Port")
    if not sid or port != ENVD_PORT:
        record = state.requests[-1]
        record.rejection = f"envd requests need E2b-Sandbox-Id and E2b-Sandbox-Port: {ENVD_PORT} (got {sid!r}, {port!r})"
        return _error(400, record.rejection)
    sandbox = state.sandboxes.get(sid)
    if sandbox is None:
        return _error(404, f"The sandbox {sid} was not found")
    if sandbox.state == "paused":  # nothing runs in a paused sandbox: the edge proxy answers 502
        return _error(502, f"The sandbox {sid} is paused; connect to it to resume it")
    token = request.headers.get("X-Access-Token")
    if token is None or not secrets.compare_digest(token, sandbox.access_token):
        return _error(401, "missing or invalid X-Access-Token")
    return None


# ------------------------------------------------------------------------------------ management API

# E2B's control plane answers with these for every sandbox; the SDK's models require them.
_RESOURCES = {"cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024}
_IDEMPOTENCY_KEY = re.compile(r"[a-z0-9-]{1,255}")
_CREATE_FIELDS = {"templateID", "timeout", "autoPause", "autoPauseMemory", "allow_internet_access", "metadata",
                  "envVars"}


def _created(s: Sandbox) -> dict[str, Any]:
    """The ``Sandbox`` model: what create and connect answer."""
    return {
        "templateID": s.template_id,
        "sandboxID": s.id,
        "clientID": "fake-client",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": s.access_token,
        "domain": None,
    }


def _listed(s: Sandbox) -> dict[str, Any]:
    """The ``ListedSandbox`` model: listing never reveals access tokens."""
    return {
        "templateID": s.template_id,
        "sandboxID": s.id,
        "clientID": "fake-client",
        "startedAt": _iso(s.started_at),
        "endAt": _iso(s.end_at),
        "envdVersion": ENVD_VERSION,
        "state": s.state,
        "metadata": s.metadata,
        **_RESOURCES,
    }


def _sandbox_detail(s: Sandbox) -> dict[str, Any]:
    """The ``SandboxDetail`` model of ``GET /sandboxes/{id}``."""
    return {**_listed(s), "envdAccessToken": s.access_token, "domain": None}


def _check_bool(body: dict[str, Any], key: str) -> None:
    if key in body and not isinstance(body[key], bool):
        raise Reject(f"{key} must be a boolean, got {body[key]!r}")


def _page(request: web.Request, query: dict[str, str], items: list[Any],
          keep: Callable[[Any], bool]) -> tuple[list[Any], dict[str, str]]:
    """Cursor paging as E2B does it: ``limit`` and ``nextToken`` in, ``X-Next-Token`` out when more remain.

    With ``filter_after_paging`` the filter runs on each page instead of before paging, so a page may hold
    fewer matches than ``limit``, or none, while ``X-Next-Token`` still says more follow (as cursor APIs that
    filter while scanning do); a client must follow the token, not stop at a short page.
    """
    state = request.app[STATE_KEY]
    if not state.filter_after_paging:
        items = [item for item in items if keep(item)]
    limit = MAX_PAGE_LIMIT
    if "limit" in query:
        if not query["limit"].isdigit() or not 1 <= int(query["limit"]) <= MAX_PAGE_LIMIT:
            raise Reject(f"limit must be an integer in [1, {MAX_PAGE_LIMIT}], got {query['limit']!r}")
        limit = int(query["limit"])
    limit = min(limit, state.page_size)
    start = 0
    if "nextToken" in query:
        try:
            after = int(base64.urlsafe_b64decode(query["nextToken"].encode()).decode().removeprefix("after:"))
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise Reject(f"nextToken {query['nextToken']!r} was not handed out by this server") from None
        start = next((i for i, item in enumerate(items) if item.seq > after), len(items))
    page = items[start : start + limit]
    headers = {}
    if start + limit < len(items):
        headers["X-Next-Token"] = base64.urlsafe_b64encode(f"after:{page[-1].seq}".encode()).decode()
    return [item for item in page if keep(item)], headers


async def create_sandbox(request: web.Request) -> web.StreamResponse:
    """``POST /v2/sandboxes``; an ``Idempotency-Key`` makes a retry answer what the first attempt got."""
    state = request.app[STATE_KEY]
    raw = await request.read()
    body = _require_json_body(request, raw)
    _check_query(request, set())
    _check_keys(body, required={"templateID"}, allowed=_CREATE_FIELDS)
    if not isinstance(body["templateID"], str) or not body["templateID"]:
        raise Reject("templateID must be a non-empty string")
    timeout = _check_timeout(body.get("timeout", DEFAULT_TIMEOUT_SECONDS))
    for flag in ("autoPause", "autoPauseMemory", "allow_internet_access"):
        _check_bool(body, flag)
    if body.get("autoPause"):
        raise Reject("the fake does not emulate autoPause: a paused sandbox outlives its timeout")
    metadata = _check_str_map(body.get("metadata", {}), "metadata")
    env_vars = _check_str_map(body.get("envVars", {}), "envVars")
    key = request.headers.get("Idempotency-Key")
    fingerprint = json.dumps(body, sort_keys=True)
    if key is not None and not _IDEMPOTENCY_KEY.fullmatch(key):
        raise Reject(f"Idempotency-Key must be 1-255 lowercase letters, digits or hyphens, got {key!r}")
    # An injected failure stands for the edge or the service failing before the request is processed,
    # so it comes before the idempotency lookup.
    if state.create_faults:
        fault = state.create_faults.pop(0)
        headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else None
        return web.json_response({"code": fault.status, "message": f"injected fault {fault.status}"},
                                 status=fault.status, headers=headers)
    if key is not None:
        seen = state.idempotency.get(key)
        if seen is not None and state.creates_in_progress > 0:
            state.creates_in_progress -= 1
            return web.json_response({"code": 409, "message": "a request with this Idempotency-Key is in progress",
                                      "error_code": "idempotency_in_progress"}, status=409)
        if seen is not None:
            if seen.fingerprint != fingerprint:
                return web.json_response({"code": 422, "message": "Idempotency-Key was used with a different request",
                                          "error_code": "idempotency_request_mismatch"}, status=422)
            return web.json_response(seen.body, status=seen.status)
    if not state.template_exists(body["templateID"]):
        return _error(404, f"template '{body['templateID']}' not found")
    sandbox = state.create_sandbox(body["templateID"], timeout, metadata, env_vars)
    answer = _created(sandbox)
    if key is not None:
        state.idempotency[key] = IdempotentCreate(fingerprint, 201, answer)
    if state.create_drops > 0:
        state.create_drops -= 1
        # The sandbox exists; only the answer is lost, as when a proxy or the network drops it.
        assert request.transport is not None
        request.transport.abort()
        raise asyncio.CancelledError
    return web.json_response(answer, status=201)


def _sandbox_or_none(request: web.Request) -> Sandbox | None:
    return request.app[STATE_KEY].sandboxes.get(request.match_info["id"])


def _not_found(request: web.Request) -> web.Response:
    return _error(404, f"sandbox '{request.match_info['id']}' not found")


async def get_sandbox(request: web.Request) -> web.StreamResponse:
    _check_no_body(request, await request.read())
    _check_query(request, set())
    sandbox = _sandbox_or_none(request)
    if sandbox is None:
        return _not_found(request)
    return web.json_response(_sandbox_detail(sandbox))


def _metadata_filter(raw: str) -> dict[str, str]:
    """The ``metadata`` query value: ``urlencode`` of percent-quoted keys and values (the SDK quotes each
    before encoding the pairs), so both layers are decoded here."""
    try:
        pairs = parse_qsl(raw, keep_blank_values=True, strict_parsing=True)
    except ValueError as exc:
        raise Reject(f"metadata must be URL-encoded key=value pairs: {exc}") from None
    return {unquote(k): unquote(v) for k, v in pairs}


async def list_sandboxes(request: web.Request) -> web.StreamResponse:
    """``GET /v2/sandboxes``: running and paused sandboxes, filtered, in pages."""
    state = request.app[STATE_KEY]
    _check_no_body(request, await request.read())
    query = _check_query(request, {"metadata", "state", "limit", "nextToken", "order", "startedAfter", "template"})
    wanted = _metadata_filter(query["metadata"]) if "metadata" in query else {}
    states = query.get("state", "running,paused").split(",")
    if not states or not set(states) <= {"running", "paused"}:
        raise Reject(f"state must be a comma-separated list of running and paused, got {query['state']!r}")
    order = query.get("order", "asc")
    if order not in ("asc", "desc"):
        raise Reject(f"order must be asc or desc, got {order!r}")
    after = _parse_iso(query["startedAfter"]) if "startedAfter" in query else None
    def keep(s: Sandbox) -> bool:
        return (s.state in states and all(s.metadata.get(k) == v for k, v in wanted.items())
                and query.get("template", s.template_id) == s.template_id and (after is None or s.started_at > after))

    if order == "desc" and "nextToken" in query:
        raise Reject("the fake pages only in ascending order")
    ordered = sorted(state.sandboxes.values(), key=lambda s: s.seq, reverse=order == "desc")
    page, headers = _page(request, query, ordered, keep)
    return web.json_response([_listed(s) for s in page], headers=headers)


async def delete_sandbox(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    if state.delete_fault:
        return _error(state.delete_fault, f"injected fault {state.delete_fault}")
    _check_no_body(request, await request.read())
    _check_query(request, set())
    if _sandbox_or_none(request) is None:
        return _not_found(request)
    state.kill(request.match_info["id"])
    return web.Response(status=204)


async def set_timeout(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    body = _require_json_body(request, await request.read())
    _check_keys(body, required={"timeout"}, allowed={"timeout"})
    timeout = _check_timeout(body["timeout"])
    sandbox = _sandbox_or_none(request)
    if sandbox is None:
        return _not_found(request)
    sandbox.end_at = state.now() + timeout
    return web.Response(status=204)


async def pause_sandbox(request: web.Request) -> web.StreamResponse:
    """``POST /sandboxes/{id}/pause {memory?, requireHealthyGuest?}``: 204, 409 when already paused."""
    body = _require_json_body(request, await request.read())
    _check_keys(body, required=set(), allowed={"memory", "requireHealthyGuest"})
    _check_bool(body, "memory")
    _check_bool(body, "requireHealthyGuest")
    sandbox = _sandbox_or_none(request)
    if sandbox is None:
        return _not_found(request)
    if sandbox.state == "paused":
        return _error(409, f"sandbox '{sandbox.id}' is already paused")
    sandbox.state = "paused"
    return web.Response(status=204)


async def connect_sandbox(request: web.Request) -> web.StreamResponse:
    """``POST /v2/sandboxes/{id}/connect {timeout?, memory?}``: 200 when running (the timeout only grows),
    201 when a paused sandbox was resumed."""
    state = request.app[STATE_KEY]
    body = _require_json_body(request, await request.read())
    _check_keys(body, required=set(), allowed={"timeout", "memory"})
    _check_bool(body, "memory")
    timeout = _check_timeout(body.get("timeout", DEFAULT_TIMEOUT_SECONDS))
    sandbox = _sandbox_or_none(request)
    if sandbox is None:
        return _not_found(request)
    resumed = sandbox.state == "paused"
    sandbox.state = "running"
    sandbox.end_at = state.now() + timeout if resumed else max(sandbox.end_at, state.now() + timeout)
    return web.json_response(_created(sandbox), status=201 if resumed else 200)


async def create_snapshot(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    body = _require_json_body(request, await request.read())
    _check_keys(body, required=set(), allowed={"name", "memory"})
    _check_bool(body, "memory")
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or not name or "/" in name or ":" in name):
        raise Reject(f"snapshot name must be a non-empty string without '/' or ':', got {name!r}")
    sandbox = _sandbox_or_none(request)
    if sandbox is None:
        return _not_found(request)
    snap = state.take_snapshot(sandbox, name)
    if state.snapshot_drops > 0:
        state.snapshot_drops -= 1
        # The snapshot is persisted; only the answer is lost, as when a proxy or the network drops it.
        assert request.transport is not None
        request.transport.abort()
        raise asyncio.CancelledError
    return web.json_response({"snapshotID": snap.id, "names": snap.names}, status=201)


async def list_snapshots(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    _check_no_body(request, await request.read())
    query = _check_query(request, {"sandboxID", "name", "limit", "nextToken"})
    def keep(s: Snapshot) -> bool:
        return query.get("sandboxID", s.sandbox_id) == s.sandbox_id and ("name" not in query or s.matches(query["name"]))

    page, headers = _page(request, query, sorted(state.snapshot_store.values(), key=lambda s: s.seq), keep)
    return web.json_response([{"snapshotID": s.id, "names": s.names} for s in page], headers=headers)


async def delete_template(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    if state.delete_fault:
        return _error(state.delete_fault, f"injected fault {state.delete_fault}")
    _check_no_body(request, await request.read())
    _check_query(request, set())
    raw_id = request.raw_path.split("?", 1)[0].removeprefix("/templates/")
    if "/" in raw_id or ":" in raw_id:
        raise Reject(f"template id must be URL-encoded in the path (':' and '/' included), got {raw_id!r}")
    template_id = request.match_info["id"]
    if not state.delete_template(template_id):
        return _error(404, f"template '{template_id}' not found")
    return web.Response(status=204)


# ------------------------------------------------------------------------------------ envd


def _sandbox_of(request: web.Request) -> Sandbox:
    return request.app[STATE_KEY].sandboxes[request.headers["E2b-Sandbox-Id"]]


def _resolve(sandbox: Sandbox, path: str) -> Path:
    if path.startswith("/"):
        if path != HOME and not path.startswith(HOME + "/"):
            raise Reject(f"the fake only serves paths under {HOME}, got {path!r}")
        path = path[len(HOME):].lstrip("/") or "."
    target = (sandbox.workspace / path).resolve()
    if not target.is_relative_to(sandbox.workspace.resolve()):
        raise Reject(f"path {path!r} leaves {HOME}")
    return target


def _display(sandbox: Sandbox, target: Path) -> str:
    rel = target.relative_to(sandbox.workspace.resolve()).as_posix()
    return HOME if rel == "." else f"{HOME}/{rel}"


def _check_files_query(request: web.Request) -> str:
    query = _check_query(request, {"path", "username", "signature", "signature_expiration"}, frozenset({"path"}))
    if not query["path"]:
        raise Reject("path must not be empty")
    _check_user(query)
    return query["path"]


async def read_file(request: web.Request) -> web.StreamResponse:
    _check_no_body(request, await request.read())
    sandbox = _sandbox_of(request)
    target = _resolve(sandbox, _check_files_query(request))
    if target.is_dir():
        return _error(400, f"path '{_display(sandbox, target)}' is a directory")
    if not target.exists():
        return _error(404, f"path '{_display(sandbox, target)}' does not exist")
    return web.Response(body=target.read_bytes(), content_type="application/octet-stream")


def _check_user(query: dict[str, str]) -> None:
    """envd >= 0.4.0 has a default user; any user named must be the one the fake runs as."""
    if query.get("username", "user") != "user":
        raise Reject(f"the fake only runs as user 'user', got username={query['username']!r}")


async def write_file(request: web.Request) -> web.StreamResponse:
    """``POST /files``: one file as ``application/octet-stream`` (``path`` in the query), or a multipart body
    whose parts are named ``file`` (filename = the path when the query has none)."""
    sandbox = _sandbox_of(request)
    query = _check_query(request, {"path", "username", "signature", "signature_expiration"})
    _check_user(query)
    if "path" in query and not query["path"]:
        raise Reject("path must not be empty")
    if request.content_type == "application/octet-stream":
        if "path" not in query:
            raise Reject("an application/octet-stream upload needs ?path=")
        if request.headers.get("Content-Encoding", "identity") != "identity":
            raise Reject("the fake does not decode Content-Encoding on uploads")
        uploads = [(query["path"], await request.read())]
    elif request.content_type == "multipart/form-data":
        uploads = []
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader) or part.name != "file":
                raise Reject("multipart body must carry parts named 'file'")
            path = query.get("path") or part.filename
            if not path:
                raise Reject("a multipart part without ?path= needs its filename set to the path")
            uploads.append((path, bytes(await part.read())))
        if not uploads:
            raise Reject("multipart body must carry at least one part named 'file'")
        if "path" in query and len(uploads) != 1:
            raise Reject("?path= names one file; a multipart body with several parts names each in its filename")
    else:
        raise Reject(f"POST /files needs application/octet-stream or multipart/form-data, got {request.content_type!r}")
    written = []
    for path, data in uploads:
        target = _resolve(sandbox, path)
        if target.is_dir():
            return _error(400, f"path '{_display(sandbox, target)}' is a directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written.append({"path": _display(sandbox, target), "name": target.name, "type": "file"})
    return web.json_response(written)


async def health(request: web.Request) -> web.StreamResponse:
    _check_no_body(request, await request.read())
    _check_query(request, set())
    return web.Response(status=204)


def _entry(sandbox: Sandbox, target: Path) -> dict[str, Any]:
    """envd's ``filesystem.EntryInfo`` in proto3 JSON (int64 as a string, enum by name)."""
    info = target.lstat()
    kind = "FILE_TYPE_SYMLINK" if target.is_symlink() else "FILE_TYPE_DIRECTORY" if target.is_dir() else "FILE_TYPE_FILE"
    entry: dict[str, Any] = {
        "name": target.name, "type": kind, "path": _display(sandbox, target), "size": str(info.st_size),
        "mode": stat.S_IMODE(info.st_mode), "permissions": stat.filemode(info.st_mode), "owner": "user", "group": "user",
        "modifiedTime": _iso(info.st_mtime),
    }
    if target.is_symlink():
        entry["symlinkTarget"] = os.readlink(target)
    return entry


def _connect_error(code: str, message: str, status: int) -> web.Response:
    return web.json_response({"code": code, "message": message}, status=status)


def _check_unary(request: web.Request, raw: bytes, *, required: set[str], allowed: set[str]) -> dict[str, Any]:
    """A Connect unary call with the JSON codec: the body is the bare message, no envelope."""
    if request.content_type != "application/json":
        raise Reject(f"{request.path} needs Content-Type application/json (Connect unary, JSON codec)")
    if request.headers.get("Connect-Protocol-Version") != "1":
        raise Reject(f"{request.path} needs Connect-Protocol-Version: 1")
    _check_basic_auth(request)
    _timeout_ms(request)
    body = _require_json_body(request, raw)
    _check_keys(body, required=required, allowed=allowed)
    if not isinstance(body.get("path"), str):
        raise Reject("path must be a string")
    return body


async def list_dir(request: web.Request) -> web.StreamResponse:
    body = _check_unary(request, await request.read(), required={"path"}, allowed={"path", "depth"})
    depth = body.get("depth", 0)
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise Reject(f"depth must be a non-negative integer, got {depth!r}")
    sandbox = _sandbox_of(request)
    target = _resolve(sandbox, body["path"] or HOME)
    if not target.is_dir():
        what = "is not a directory" if target.exists() else "does not exist"
        return _connect_error("not_found" if not target.exists() else "invalid_argument",
                              f"path '{_display(sandbox, target)}' {what}", 404 if not target.exists() else 400)
    root_depth = len(target.parts)
    entries = [_entry(sandbox, p) for p in sorted(target.rglob("*"))
               if len(p.parts) - root_depth <= max(depth, 1)]
    return web.json_response({"entries": entries})


async def stat_path(request: web.Request) -> web.StreamResponse:
    body = _check_unary(request, await request.read(), required={"path"}, allowed={"path"})
    sandbox = _sandbox_of(request)
    target = _resolve(sandbox, body["path"] or HOME)
    if not target.exists() and not target.is_symlink():
        return _connect_error("not_found", f"path '{_display(sandbox, target)}' does not exist", 404)
    return web.json_response({"entry": _entry(sandbox, target)})


def _check_basic_auth(request: web.Request) -> None:
    auth = request.headers.get("Authorization")
    if auth is None:
        return
    try:
        user = base64.b64decode(auth.removeprefix("Basic "), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise Reject(f"Authorization must be Basic base64('<user>:'): {exc}") from exc
    if not auth.startswith("Basic ") or not user.endswith(":"):
        raise Reject("Authorization must be Basic base64('<user>:')")
    if user != "user:":
        raise Reject(f"the fake only runs as user 'user', got {user[:-1]!r}")


def _check_process_request(request: web.Request, raw: bytes) -> dict[str, Any]:
    if request.headers.get("Content-Type") != "application/connect+json":
        raise Reject(f"process.Process/Start needs Content-Type application/connect+json, got {request.headers.get('Content-Type')!r}")
    if request.headers.get("Connect-Protocol-Version") != "1":
        raise Reject("process.Process/Start needs Connect-Protocol-Version: 1")
    _check_basic_auth(request)
    keepalive = request.headers.get("Keepalive-Ping-Interval")
    if keepalive is not None and not keepalive.isdigit():
        raise Reject(f"Keepalive-Ping-Interval must be whole seconds, got {keepalive!r}")
    try:
        body = connect.decode_single_request(raw)
    except ValueError as exc:
        raise Reject(str(exc)) from exc
    _check_keys(body, required={"process"}, allowed={"process", "tag", "stdin", "pty"})
    proc = body["process"]
    if not isinstance(proc, dict):
        raise Reject("process must be an object")
    _check_keys(proc, required={"cmd"}, allowed={"cmd", "args", "cwd", "envs"})
    if not isinstance(proc["cmd"], str) or not isinstance(proc.get("args", []), list):
        raise Reject("process.cmd must be a string and process.args a list")
    if not all(isinstance(a, str) for a in proc.get("args", [])):
        raise Reject("process.args must be strings")
    _check_str_map(proc.get("envs", {}), "process.envs")
    if "cwd" in proc and not isinstance(proc["cwd"], str):
        raise Reject("process.cwd must be a string")
    if "tag" in body and not isinstance(body["tag"], str):
        raise Reject("tag must be a string")
    if body.get("stdin", False) is not False:
        raise Reject("the fake only supports stdin: false")
    return body


def _timeout_ms(request: web.Request) -> int | None:
    raw = request.headers.get("Connect-Timeout-Ms")
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 10:
        raise Reject(f"Connect-Timeout-Ms must be a positive integer of at most 10 digits, got {raw!r}")
    return int(raw)


async def _run(sandbox: Sandbox, proc: dict[str, Any], timeout_ms: int | None) -> AsyncIterator[dict[str, Any]]:
    """Run the command for real in the sandbox workspace, yielding process events as envd would."""
    cwd = _resolve(sandbox, proc.get("cwd", HOME))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(sandbox.workspace), "USER": "user",
           "LANG": "C.UTF-8", **sandbox.env_vars, **proc.get("envs", {})}
    if not cwd.is_dir():
        yield {"error": {"code": "invalid_argument", "message": f"cwd '{proc.get('cwd')}' does not exist"}}
        return
    child = await asyncio.create_subprocess_exec(
        proc["cmd"], *proc.get("args", []), cwd=cwd, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    sandbox.processes.add(child.pid)
    if sandbox.gone:  # the sandbox went while the process was being started: it goes with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    try:
        async for item in _events(child, timeout_ms):
            yield item
    finally:
        sandbox.processes.discard(child.pid)


async def _events(child: asyncio.subprocess.Process, timeout_ms: int | None) -> AsyncIterator[dict[str, Any]]:
    yield {"event": {"start": {"pid": child.pid}}}
    yield {"event": {"keepalive": {}}}
    queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()

    async def pump(stream: asyncio.StreamReader | None, key: str) -> None:
        assert stream is not None
        while chunk := await stream.read(4096):
            await queue.put((key, chunk))

    pumps = asyncio.gather(pump(child.stdout, "stdout"), pump(child.stderr, "stderr"), child.wait())
    deadline = None if timeout_ms is None else asyncio.get_running_loop().time() + timeout_ms / 1000
    while True:
        if pumps.done() and queue.empty():
            break
        getter = asyncio.ensure_future(queue.get())
        remaining = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
        waitables: set[asyncio.Future[Any]] = {getter, pumps}
        done, _ = await asyncio.wait(waitables, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            key, chunk = getter.result()
            yield {"event": {"data": {key: base64.b64encode(chunk).decode()}}}
            continue
        getter.cancel()
        if not done:  # deadline passed
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, 9)
            await pumps
            yield {"error": {"code": "deadline_exceeded", "message": f"process exceeded its {timeout_ms} ms deadline"}}
            return
    code = child.returncode
    assert code is not None
    end: dict[str, Any] = {"exited": code >= 0, "status": f"exit status {code}" if code >= 0 else f"signal: {-code}"}
    if code != 0:
        end["exitCode"] = code if code >= 0 else -1
    yield {"event": {"end": end}}


async def start_process(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    body = _check_process_request(request, await request.read())
    timeout_ms = _timeout_ms(request)
    sandbox = _sandbox_of(request)
    fault = state.stream_faults.pop(0) if state.stream_faults else None
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/connect+json"})
    await response.prepare(request)
    eos: dict[str, Any] = {}
    async for item in _run(sandbox, body["process"], timeout_ms):
        if "error" in item:
            eos = item
            break
        if fault is not None and "end" in item["event"]:
            break  # every fault replaces the honest ending
        await response.write(connect.envelope(item))
    if sandbox.id not in state.sandboxes:
        # The sandbox was killed or deleted while the command ran: envd went with it, the stream is cut.
        assert request.transport is not None
        request.transport.abort()
        raise asyncio.CancelledError
    if fault == "malformed":
        await response.write(connect.raw_envelope(b'{"event": {"end": '))
    elif fault == "bad_event":
        await response.write(connect.envelope({"event": {"exit": {"code": 0}}}))
    elif fault == "compressed":
        await response.write(connect.envelope({"event": {"end": {"exited": True}}}, flags=connect.FLAG_COMPRESSED))
    elif fault == "truncated":
        await response.write(connect.raw_envelope(b'{"event": {"data"', declared_length=200))
        assert request.transport is not None
        request.transport.abort()  # the peer sees the stream cut mid-envelope
        raise asyncio.CancelledError
    elif isinstance(fault, EosError):
        eos = {"error": {"code": fault.code, "message": fault.message}}
    # "missing_end" falls through: a clean end-of-stream that never said how the process ended.
    await response.write(connect.envelope(eos, flags=connect.FLAG_END_STREAM))
    await response.write_eof()
    return response


# ------------------------------------------------------------------------------------ apps


async def unknown_route(request: web.Request) -> web.StreamResponse:
    raise Reject(f"no such route in E2B's protocol: {request.method} {request.path}")


def build_apps(state: FakeState) -> tuple[web.Application, web.Application]:
    api = web.Application(middlewares=[_recording("api", _api_auth)])
    api[STATE_KEY] = state
    # Only the current endpoints: the deprecated v1 create/list/connect are routed to unknown_route, so
    # a client that drifts back to them fails loudly.
    api.router.add_post("/v2/sandboxes", create_sandbox)
    api.router.add_get("/v2/sandboxes", list_sandboxes, allow_head=False)
    api.router.add_get("/sandboxes/{id}", get_sandbox, allow_head=False)
    api.router.add_delete("/sandboxes/{id}", delete_sandbox)
    api.router.add_post("/sandboxes/{id}/timeout", set_timeout)
    api.router.add_post("/sandboxes/{id}/pause", pause_sandbox)
    api.router.add_post("/v2/sandboxes/{id}/connect", connect_sandbox)
    api.router.add_post("/sandboxes/{id}/snapshots", create_snapshot)
    api.router.add_get("/snapshots", list_snapshots, allow_head=False)
    api.router.add_delete("/templates/{id:.+}", delete_template)
    api.router.add_route("*", "/{tail:.*}", unknown_route)

    envd = web.Application(middlewares=[_recording("envd", _envd_auth)])
    envd[STATE_KEY] = state
    envd.router.add_get("/health", health, allow_head=False)
    envd.router.add_get("/files", read_file, allow_head=False)
    envd.router.add_post("/files", write_file)
    envd.router.add_post("/filesystem.Filesystem/ListDir", list_dir)
    envd.router.add_post("/filesystem.Filesystem/Stat", stat_path)
    envd.router.add_post("/process.Process/Start", start_process)
    envd.router.add_route("*", "/{tail:.*}", unknown_route)
    return api, envd


class FakeE2BServer:
    """Runs the two apps on loopback (or ``host``); ``async with`` starts and stops them."""

    def __init__(self, state: FakeState | None = None, *, port: int = 0, sandbox_port: int = 0,
                 host: str = "127.0.0.1") -> None:
        self.state = state or FakeState()
        self._ports = (port, sandbox_port)
        self._host = host  # another local address for clients in the test node's Pods (its bridge's)
        self._runners: list[web.AppRunner] = []

    async def start(self) -> FakeState:
        urls = []
        for app, port in zip(build_apps(self.state), self._ports, strict=True):
            runner = web.AppRunner(app, handle_signals=False, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, self._host, port)
            await site.start()
            self._runners.append(runner)
            urls.append(f"http://{self._host}:{runner.addresses[0][1]}")
        self.state.api_url, self.state.sandbox_url = urls
        return self.state

    async def stop(self) -> None:
        self.state.kill_commands()
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        self.state.close()

    async def __aenter__(self) -> FakeState:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _serve(port: int, sandbox_port: int, api_key: str | None) -> None:
    state = FakeState(api_key=api_key) if api_key else FakeState()
    async with FakeE2BServer(state, port=port, sandbox_port=sandbox_port):
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # stop cleanly so the temp workspaces are removed
            loop.add_signal_handler(sig, stop.set)
        print(f"E2B_API_URL={state.api_url}\nE2B_SANDBOX_URL={state.sandbox_url}\nE2B_API_KEY={state.api_key}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fake E2B API + envd on loopback (for manual tries).")
    parser.add_argument("--port", type=int, default=3000, help="API port; envd listens on --sandbox-port")
    parser.add_argument("--sandbox-port", type=int, default=None, help="envd port (default: --port + 1)")
    parser.add_argument("--api-key", default=None, help="accepted X-API-Key (default: random, printed)")
    args = parser.parse_args(argv)
    sandbox_port = args.sandbox_port if args.sandbox_port is not None else args.port + 1
    asyncio.run(_serve(args.port, sandbox_port, args.api_key))


if __name__ == "__main__":
    main()
