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
import secrets
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import BodyPartReader, web

from tests.fakes import connect
from tests.fakes.e2b_state import (
    ENVD_PORT,
    ENVD_VERSION,
    HOME,
    MAX_TIMEOUT_SECONDS,
    EosError,
    FakeState,
    RecordedRequest,
    Sandbox,
)

STATE_KEY: web.AppKey[FakeState] = web.AppKey("state", FakeState)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Reject(Exception):
    """The request does not match the documented protocol."""


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"code": status, "message": message}, status=status)


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat().replace("+00:00", "Z")


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
        if request.content_type == "application/json":
            # Multipart bodies are left unread here: the handler streams them.
            with contextlib.suppress(ValueError):
                parsed = json.loads(await request.read())
        record = RecordedRequest(
            server=server,  # type: ignore[arg-type]
            method=request.method,
            path=request.path,
            raw_path=request.raw_path.split("?", 1)[0],
            query=dict(request.query),
            headers=dict(request.headers),
            json=parsed,
        )
        state.requests.append(record)
        state.reap_expired()
        denied = auth(state, request)
        if denied is not None:
            record.status = denied.status
            return denied
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
    token = request.headers.get("X-Access-Token")
    if token is None or not secrets.compare_digest(token, sandbox.access_token):
        return _error(401, "missing or invalid X-Access-Token")
    return None


# ------------------------------------------------------------------------------------ management API


def _sandbox_detail(s: Sandbox) -> dict[str, Any]:
    return {
        "templateID": s.template_id,
        "sandboxID": s.id,
        "clientID": "fake-client",
        "startedAt": _iso(s.started_at),
        "endAt": _iso(s.end_at),
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": s.access_token,
        "state": "running",
        "metadata": s.metadata,
        "cpuCount": 2,
        "memoryMB": 512,
    }


def _listed(s: Sandbox) -> dict[str, Any]:
    detail = _sandbox_detail(s)
    del detail["envdAccessToken"]  # listing never reveals tokens
    return detail


async def create_sandbox(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    body = _require_json_body(request, await request.read())
    _check_keys(body, required={"templateID", "timeout", "secure", "metadata"},
                allowed={"templateID", "timeout", "secure", "metadata", "envVars", "autoPause"})
    if not isinstance(body["templateID"], str) or not body["templateID"]:
        raise Reject("templateID must be a non-empty string")
    timeout = _check_timeout(body["timeout"])
    if body["secure"] is not True:
        raise Reject("secure must be true: envd must require an access token")
    metadata = _check_str_map(body["metadata"], "metadata")
    env_vars = _check_str_map(body.get("envVars", {}), "envVars")
    if state.create_faults:
        fault = state.create_faults.pop(0)
        headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else None
        return web.json_response({"code": fault.status, "message": f"injected fault {fault.status}"},
                                 status=fault.status, headers=headers)
    if not state.template_exists(body["templateID"]):
        return _error(404, f"template '{body['templateID']}' not found")
    sandbox = state.create_sandbox(body["templateID"], timeout, metadata, env_vars)
    return web.json_response(
        {
            "templateID": sandbox.template_id,
            "sandboxID": sandbox.id,
            "clientID": "fake-client",
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": sandbox.access_token,
            "domain": None,
        },
        status=201,
    )


def _sandbox_or_none(request: web.Request) -> Sandbox | None:
    return request.app[STATE_KEY].sandboxes.get(request.match_info["id"])


async def get_sandbox(request: web.Request) -> web.StreamResponse:
    _check_no_body(request, await request.read())
    _check_query(request, set())
    sandbox = _sandbox_or_none(request)
    if sandbox is None:
        return _error(404, f"sandbox '{request.match_info['id']}' not found")
    return web.json_response(_sandbox_detail(sandbox))


async def list_sandboxes(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    _check_no_body(request, await request.read())
    query = _check_query(request, {"metadata", "state"})
    wanted: dict[str, str] = {}
    if "metadata" in query:
        pairs = parse_qsl(query["metadata"], keep_blank_values=True, strict_parsing=True)
        wanted = dict(pairs)
    if query.get("state", "running") not in {"running", "paused", "running,paused"}:
        raise Reject(f"state must be running and/or paused, got {query['state']!r}")
    found = [s for s in state.sandboxes.values() if all(s.metadata.get(k) == v for k, v in wanted.items())]
    return web.json_response([_listed(s) for s in found])


async def delete_sandbox(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    _check_no_body(request, await request.read())
    _check_query(request, set())
    if _sandbox_or_none(request) is None:
        return _error(404, f"sandbox '{request.match_info['id']}' not found")
    state.kill(request.match_info["id"])
    return web.Response(status=204)


async def set_timeout(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    body = _require_json_body(request, await request.read())
    _check_keys(body, required={"timeout"}, allowed={"timeout"})
    timeout = _check_timeout(body["timeout"])
    sandbox = _sandbox_or_none(request)
    if sandbox is None:
        return _error(404, f"sandbox '{request.match_info['id']}' not found")
    sandbox.end_at = state.now() + timeout
    return web.Response(status=204)


async def create_snapshot(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    body = _require_json_body(request, await request.read())
    _check_keys(body, required=set(), allowed={"name"})
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or not name or "/" in name or ":" in name):
        raise Reject(f"snapshot name must be a non-empty string without '/' or ':', got {name!r}")
    sandbox = _sandbox_or_none(request)
    if sandbox is None:
        return _error(404, f"sandbox '{request.match_info['id']}' not found")
    snap = state.take_snapshot(sandbox, name)
    if state.snapshot_drops > 0:
        state.snapshot_drops -= 1
        # The snapshot is persisted; only the answer is lost, as when a proxy or the network drops it.
        assert request.transport is not None
        request.transport.abort()
        raise asyncio.CancelledError
    return web.json_response({"snapshotID": snap.id, "names": [snap.name]}, status=201)


async def list_snapshots(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    _check_no_body(request, await request.read())
    query = _check_query(request, {"sandboxID", "name", "limit", "nextToken"})
    if "limit" in query and (not query["limit"].isdigit() or not 1 <= int(query["limit"]) <= 100):
        raise Reject(f"limit must be an integer in [1, 100], got {query['limit']!r}")
    if "nextToken" in query:
        raise Reject("the fake never hands out a nextToken, so none can be sent back")
    found = [
        s for s in state.snapshot_store.values()
        if query.get("sandboxID", s.sandbox_id) == s.sandbox_id and query.get("name", s.name) == s.name
    ]
    return web.json_response([{"snapshotID": s.id, "names": [s.name]} for s in found])


async def delete_template(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
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


async def write_file(request: web.Request) -> web.StreamResponse:
    sandbox = _sandbox_of(request)
    target = _resolve(sandbox, _check_files_query(request))
    if request.content_type != "multipart/form-data":
        raise Reject(f"POST /files needs a multipart/form-data body, got {request.content_type!r}")
    reader = await request.multipart()
    part = await reader.next()
    if part is None or not isinstance(part, BodyPartReader) or part.name != "file":
        raise Reject("multipart body must carry one part named 'file'")
    data = await part.read()
    if await reader.next() is not None:
        raise Reject("multipart body must carry exactly one part")
    if target.is_dir():
        return _error(400, f"path '{_display(sandbox, target)}' is a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(bytes(data))
    return web.json_response([{"path": _display(sandbox, target), "name": target.name, "type": "file"}])


def _check_process_request(request: web.Request, raw: bytes) -> dict[str, Any]:
    if request.headers.get("Content-Type") != "application/connect+json":
        raise Reject(f"process.Process/Start needs Content-Type application/connect+json, got {request.headers.get('Content-Type')!r}")
    if request.headers.get("Connect-Protocol-Version") != "1":
        raise Reject("process.Process/Start needs Connect-Protocol-Version: 1")
    auth = request.headers.get("Authorization")
    if auth is not None:
        try:
            user = base64.b64decode(auth.removeprefix("Basic "), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise Reject(f"Authorization must be Basic base64('<user>:'): {exc}") from exc
        if not auth.startswith("Basic ") or not user.endswith(":"):
            raise Reject("Authorization must be Basic base64('<user>:')")
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
    api.router.add_post("/sandboxes", create_sandbox)
    api.router.add_get("/sandboxes", list_sandboxes, allow_head=False)
    api.router.add_get("/sandboxes/{id}", get_sandbox, allow_head=False)
    api.router.add_delete("/sandboxes/{id}", delete_sandbox)
    api.router.add_post("/sandboxes/{id}/timeout", set_timeout)
    api.router.add_post("/sandboxes/{id}/snapshots", create_snapshot)
    api.router.add_get("/snapshots", list_snapshots, allow_head=False)
    api.router.add_delete("/templates/{id:.+}", delete_template)
    api.router.add_route("*", "/{tail:.*}", unknown_route)

    envd = web.Application(middlewares=[_recording("envd", _envd_auth)])
    envd[STATE_KEY] = state
    envd.router.add_get("/files", read_file, allow_head=False)
    envd.router.add_post("/files", write_file)
    envd.router.add_post("/process.Process/Start", start_process)
    envd.router.add_route("*", "/{tail:.*}", unknown_route)
    return api, envd


class FakeE2BServer:
    """Runs the two apps on loopback; ``async with`` starts and stops them."""

    def __init__(self, state: FakeState | None = None, *, port: int = 0, sandbox_port: int = 0) -> None:
        self.state = state or FakeState()
        self._ports = (port, sandbox_port)
        self._runners: list[web.AppRunner] = []

    async def start(self) -> FakeState:
        urls = []
        for app, port in zip(build_apps(self.state), self._ports, strict=True):
            runner = web.AppRunner(app, handle_signals=False, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", port)
            await site.start()
            self._runners.append(runner)
            urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
        self.state.api_url, self.state.sandbox_url = urls
        return self.state

    async def stop(self) -> None:
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
