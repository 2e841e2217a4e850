"""The ``e2b`` provider: E2B sandboxes over E2B's documented HTTP APIs (management API + envd).

Configuration (constructor arguments win over the environment): ``E2B_API_KEY`` (required),
``E2B_API_URL`` (default ``https://api.e2b.app``), ``E2B_SANDBOX_URL`` (a shared envd host routed by the
``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` headers; default ``https://49983-<id>.<domain>``), ``template``
and the HTTP ``timeout``.

Secrets (the API key and each sandbox's envd access token) live only in this object's memory: they are
never put in handles, log lines or exception messages, and :meth:`_redact` scrubs them from any text the
server echoes back.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import email.utils
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import quote, urlencode, urlsplit

import httpx

from durable_sandbox.providers.contract import (
    TOOL_TYPES,
    Capability,
    ConfigurationError,
    ProviderCapabilities,
    ProviderError,
    ProvisionError,
    SandboxGone,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    ToolCall,
    ToolResult,
    file_not_found_result,
    safe_relative_path,
    unsupported_tool_result,
    wrote_file_result,
)
from durable_sandbox.providers.e2b_connect import (
    ConnectProtocolError,
    ConnectStreamError,
    ConnectStreamTruncated,
    encode_envelope,
    read_process_stream,
)
from durable_sandbox.providers.redaction import redact_url

log = logging.getLogger(__name__)

DEFAULT_API_URL = "https://api.e2b.app"
DEFAULT_TEMPLATE = "base"
ENVD_PORT = 49983
ENVD_USER = "user"
HOME = "/home/user"
MAXIMUM_LEASE_SECONDS = 86_400
OWNER_METADATA_KEY = "durable-sandbox.dev/owner"
SNAPSHOT_NAME_PREFIX = "dsb-"
TIMEOUT_EXIT_CODE = 124  # what coreutils' timeout(1) reports, so scripts can recognise it

# Provisioning answers that say "not now" rather than "never" (E2B documents 409 for concurrent changes).
_RETRYABLE_PROVISION_STATUSES = frozenset({408, 409, 425, 429})
_TRANSIENT_STATUSES = frozenset({408, 425, 429})


def snapshot_name(operation_id: str) -> str:
    """The snapshot name for an operation: deterministic, so a retried snapshot finds the first one."""
    return SNAPSHOT_NAME_PREFIX + hashlib.sha256(operation_id.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff for transient HTTP failures."""

    attempts: int = 5
    initial_delay: float = 0.5
    factor: float = 2.0
    max_delay: float = 8.0
    max_retry_after: float = 60.0  # a longer Retry-After is reported to the caller instead of waited out

    def delay(self, attempt: int, retry_after: float | None) -> float:
        backoff = min(self.max_delay, self.initial_delay * self.factor**attempt)
        return backoff if retry_after is None else max(backoff, retry_after)


class _Transient(Exception):
    """A failure worth retrying; carries a secret-free description and the server's Retry-After."""

    def __init__(self, detail: str, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after


def _retry_after(response: httpx.Response, now: float) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def _parse_time(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _configuration_problems(key: str | None, api_url: str, sandbox_url: str | None) -> list[str]:
    """One check for the constructor and for the pre-run check (``configuration_problems``)."""
    problems = []
    if not key:
        problems.append("Sandbox provider [e2b] needs an API key: set E2B_API_KEY or pass api_key=")
    elif not all("!" <= ch <= "~" for ch in key):
        # Sent as an HTTP header: a CR, a space or a non-ASCII character cannot be sent (or is an injection).
        problems.append(
            "Sandbox provider [e2b]: E2B_API_KEY must be printable ASCII without spaces or line breaks "
            "(check for a stray newline or a copy-paste artefact)"
        )
    for what, url in (("E2B_API_URL", api_url), ("E2B_SANDBOX_URL", sandbox_url)):
        if url is not None and urlsplit(url).scheme not in ("http", "https"):
            problems.append(f"Sandbox provider [e2b]: {what} must be an http(s) URL, got {redact_url(url)!r}")
    return problems


class E2BProvider(SandboxProvider):
    name = "e2b"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        template: str = DEFAULT_TEMPLATE,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        key = api_key if api_key is not None else env.get("E2B_API_KEY")
        api_url = (api_url or env.get("E2B_API_URL") or DEFAULT_API_URL).rstrip("/")
        sandbox_url = (sandbox_url or env.get("E2B_SANDBOX_URL") or "").rstrip("/") or None
        problems = _configuration_problems(key, api_url, sandbox_url)
        if problems or not key:
            raise ConfigurationError("; ".join(problems))
        self._api_key = key
        self.api_url = api_url
        self.sandbox_url = sandbox_url
        self.template = template
        self.retry = retry or RetryPolicy()
        self._clock = clock
        self._sleep = sleep
        self._tokens: dict[str, str | None] = {}  # sandbox id -> envd access token (never leaves this object)
        self._domains: dict[str, str] = {}
        self._client = httpx.AsyncClient(timeout=timeout, transport=transport, follow_redirects=False)

    def __repr__(self) -> str:
        sandbox_url = redact_url(self.sandbox_url) if self.sandbox_url else None
        return f"E2BProvider(api_url={redact_url(self.api_url)!r}, sandbox_url={sandbox_url!r}, template={self.template!r})"

    @classmethod
    def configuration_problems(cls, environ: Mapping[str, str]) -> list[str]:
        return _configuration_problems(
            environ.get("E2B_API_KEY"), environ.get("E2B_API_URL") or DEFAULT_API_URL, environ.get("E2B_SANDBOX_URL") or None
        )

    def capabilities(self) -> ProviderCapabilities:
        return ProviderCapabilities(
            supported=frozenset(
                {
                    Capability.SNAPSHOT,
                    Capability.SNAPSHOT_DELETION,
                    Capability.SNAPSHOT_RECONCILIATION,
                    Capability.RESTORE,
                    Capability.LEASE_RECONCILIATION,
                }
            ),
            delivery_guarantee="at_least_once_effects",
            idempotent_destroy=True,
            maximum_lease_seconds=MAXIMUM_LEASE_SECONDS,
            tool_types=TOOL_TYPES,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    # ------------------------------------------------------------------------------------- HTTP plumbing

    def _redact(self, text: str) -> str:
        for secret in (self._api_key, *(t for t in self._tokens.values() if t)):
            text = text.replace(secret, "***")
        return text

    def _server_message(self, response: httpx.Response) -> str:
        try:
            body = response.json()
            message = body.get("message") if isinstance(body, dict) else None
        except ValueError:
            message = None
        text = str(message) if message else response.text[:200]
        return self._redact(text.strip()) or response.reason_phrase

    def _api_headers(self) -> dict[str, str]:
        return {"X-API-Key": self._api_key}

    async def _send_once(self, op: str, method: str, url: str, *, replay_safe: bool, **kwargs: Any) -> httpx.Response:
        """One request. Raises :class:`_Transient` when trying again may help and is safe."""
        try:
            response = await self._client.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            detail = f"{op}: {type(exc).__name__} talking to E2B"
            # A request that never connected cannot have had an effect; any later failure might have.
            if replay_safe or isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
                raise _Transient(detail) from None
            raise ProviderError(f"{detail}; the request may have taken effect, so it was not repeated") from None
        log.debug("e2b %s %s -> %s", method, urlsplit(url).path, response.status_code)
        status = response.status_code
        if status in _TRANSIENT_STATUSES or status >= 500:
            if replay_safe or status in (429, 503):  # 429/503 say the request was not processed
                await response.aread()
                raise _Transient(f"{op}: E2B answered {status}: {self._server_message(response)}",
                                 _retry_after(response, self._clock()))
        return response

    async def _backoff(self, attempt: int, failure: _Transient) -> bool:
        """Wait before the next attempt; False when the attempts (or the patience for Retry-After) ran out."""
        if attempt + 1 >= self.retry.attempts:
            return False
        if failure.retry_after is not None and failure.retry_after > self.retry.max_retry_after:
            return False
        delay = self.retry.delay(attempt, failure.retry_after)
        log.debug("e2b retrying in %.2fs after: %s", delay, failure.detail)
        await self._sleep(delay)
        return True

    async def _request(self, op: str, method: str, url: str, *, provisioning: bool = False,
                       replay_safe: bool = True, **kwargs: Any) -> httpx.Response:
        attempt = 0
        while True:
            try:
                return await self._send_once(op, method, url, replay_safe=replay_safe, **kwargs)
            except _Transient as failure:
                if not await self._backoff(attempt, failure):
                    message = f"{failure.detail} (gave up after {attempt + 1} attempt(s))"
                    if provisioning:
                        raise ProvisionError(message, retryable=True) from None
                    raise ProviderError(message) from None
                attempt += 1

    def _fail(self, op: str, response: httpx.Response, *, sandbox_id: str | None = None,
              provisioning: bool = False) -> NoReturn:
        status = response.status_code
        message = f"{op}: E2B answered {status}: {self._server_message(response)}"
        if status == 404 and sandbox_id is not None:
            raise SandboxGone(sandbox_id, message)
        if status in (401, 403):
            raise ConfigurationError(f"{message} (check E2B_API_KEY and its team's permissions)")
        if provisioning:
            raise ProvisionError(message, retryable=status in _RETRYABLE_PROVISION_STATUSES or status >= 500)
        error = ProviderError(message)
        error.retryable = status >= 500 or status in _TRANSIENT_STATUSES
        raise error

    def _json(self, op: str, response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            raise ProviderError(f"{op}: E2B answered {response.status_code} with a body that is not JSON") from None

    # ------------------------------------------------------------------------------------- management

    def _check_lease(self, seconds: int) -> None:
        if not isinstance(seconds, int) or not 1 <= seconds <= MAXIMUM_LEASE_SECONDS:
            raise ValueError(f"lease must be a whole number of seconds in [1, {MAXIMUM_LEASE_SECONDS}], got {seconds!r}")

    async def _create(self, op: str, template: str, spec: SandboxSpec, lease_seconds: int) -> SandboxHandle:
        self._check_lease(lease_seconds)
        metadata = dict(spec.labels)
        if spec.owner is not None:
            metadata[OWNER_METADATA_KEY] = spec.owner
        body: dict[str, Any] = {"templateID": template, "timeout": lease_seconds, "secure": True, "metadata": metadata}
        if spec.env:
            body["envVars"] = dict(spec.env)
        response = await self._request(op, "POST", f"{self.api_url}/sandboxes", provisioning=True,
                                       json=body, headers=self._api_headers())
        if response.status_code != 201:
            self._fail(op, response, provisioning=True)
        data = self._json(op, response)
        sandbox_id = data.get("sandboxID") if isinstance(data, dict) else None
        if not isinstance(sandbox_id, str) or not sandbox_id:
            raise ProvisionError(f"{op}: E2B's answer has no sandboxID", retryable=True)
        token = data.get("envdAccessToken")
        self._tokens[sandbox_id] = token if isinstance(token, str) and token else None
        meta: dict[str, Any] = {"templateID": template, "envdVersion": data.get("envdVersion")}
        if isinstance(data.get("domain"), str):
            self._domains[sandbox_id] = data["domain"]
            meta["domain"] = data["domain"]
        if spec.owner is not None:
            meta["owner"] = spec.owner
        if spec.labels:
            meta["labels"] = dict(spec.labels)
        log.debug("e2b created sandbox %s from template %s", sandbox_id, template)
        return SandboxHandle(id=sandbox_id, provider=self.name, metadata=meta,
                             lease_expires_at=self._clock() + lease_seconds)

    async def provision(self, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        return await self._create("create sandbox", spec.template or self.template, spec, lease_seconds)

    async def restore(self, snapshot_id: str, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        op = f"restore snapshot {snapshot_id}"
        try:
            return await self._create(op, snapshot_id, spec, lease_seconds)
        except ProvisionError as exc:
            if "answered 404" in str(exc):
                raise ProvisionError(f"{op}: the snapshot does not exist (deleted?)", retryable=False) from None
            raise

    async def renew_lease(self, handle: SandboxHandle, seconds: int) -> SandboxHandle:
        self._check_lease(seconds)
        op = f"renew lease of sandbox {handle.id}"
        response = await self._request(op, "POST", f"{self.api_url}/sandboxes/{quote(handle.id, safe='')}/timeout",
                                       json={"timeout": seconds}, headers=self._api_headers())
        if response.status_code != 204:
            self._fail(op, response, sandbox_id=handle.id)
        return handle.model_copy(update={"lease_expires_at": self._clock() + seconds})

    async def destroy(self, handle: SandboxHandle) -> None:
        op = f"destroy sandbox {handle.id}"
        response = await self._request(op, "DELETE", f"{self.api_url}/sandboxes/{quote(handle.id, safe='')}",
                                       headers=self._api_headers())
        if response.status_code not in (204, 404):  # 404: already gone, which is what destroy wants
            self._fail(op, response)
        self._tokens.pop(handle.id, None)
        self._domains.pop(handle.id, None)

    async def list_sandboxes(self, owner: str) -> list[SandboxHandle]:
        op = f"list sandboxes of owner {owner}"
        response = await self._request(op, "GET", f"{self.api_url}/sandboxes",
                                       params={"metadata": urlencode({OWNER_METADATA_KEY: owner})},
                                       headers=self._api_headers())
        if response.status_code != 200:
            self._fail(op, response)
        data = self._json(op, response)
        if not isinstance(data, list):
            raise ProviderError(f"{op}: E2B's answer is not a list")
        handles = []
        for item in data:
            if not isinstance(item, dict) or not isinstance(item.get("sandboxID"), str):
                raise ProviderError(f"{op}: E2B listed an entry without a sandboxID")
            metadata = item.get("metadata") or {}
            if metadata.get(OWNER_METADATA_KEY) != owner:  # never sweep what the filter should have excluded
                continue
            handles.append(SandboxHandle(
                id=item["sandboxID"], provider=self.name,
                metadata={"templateID": item.get("templateID"), "owner": owner, "state": item.get("state"),
                          "labels": {k: v for k, v in metadata.items() if k != OWNER_METADATA_KEY}},
                lease_expires_at=_parse_time(item.get("endAt")),
            ))
        return handles

    # ------------------------------------------------------------------------------------- snapshots

    async def _find_snapshot(self, op: str, name: str) -> str | None:
        response = await self._send_once(op, "GET", f"{self.api_url}/snapshots", replay_safe=True,
                                         params={"name": name}, headers=self._api_headers())
        if response.status_code != 200:
            self._fail(op, response)
        data = self._json(op, response)
        if not isinstance(data, list):
            raise ProviderError(f"{op}: E2B's snapshot list is not a list")
        for item in data:
            if isinstance(item, dict) and name in (item.get("names") or []) and isinstance(item.get("snapshotID"), str):
                return str(item["snapshotID"])
        return None

    async def snapshot(self, handle: SandboxHandle, *, operation_id: str) -> str:
        name = snapshot_name(operation_id)
        op = f"snapshot sandbox {handle.id} (operation {operation_id})"
        attempt = 0
        # Look up before creating, on every attempt: when a response was lost after E2B persisted the
        # snapshot, the retry finds it instead of building a second one over the same name.
        while True:
            try:
                existing = await self._find_snapshot(op, name)
                if existing is not None:
                    return existing
                response = await self._send_once(
                    op, "POST", f"{self.api_url}/sandboxes/{quote(handle.id, safe='')}/snapshots",
                    replay_safe=True, json={"name": name}, headers=self._api_headers(),
                )
            except _Transient as failure:
                if not await self._backoff(attempt, failure):
                    raise ProviderError(f"{failure.detail} (gave up after {attempt + 1} attempt(s))") from None
                attempt += 1
                continue
            if response.status_code != 201:
                self._fail(op, response, sandbox_id=handle.id)
            data = self._json(op, response)
            snapshot_id = data.get("snapshotID") if isinstance(data, dict) else None
            if not isinstance(snapshot_id, str) or not snapshot_id:
                raise ProviderError(f"{op}: E2B's answer has no snapshotID")
            log.debug("e2b snapshot %s taken of sandbox %s", snapshot_id, handle.id)
            return snapshot_id

    async def delete_snapshot(self, snapshot_id: str) -> None:
        op = f"delete snapshot {snapshot_id}"
        response = await self._request(op, "DELETE", f"{self.api_url}/templates/{quote(snapshot_id, safe='')}",
                                        headers=self._api_headers())
        if response.status_code not in (204, 404):  # 404: already deleted
            self._fail(op, response)

    # ------------------------------------------------------------------------------------- envd

    async def _envd(self, handle: SandboxHandle) -> tuple[str, dict[str, str]]:
        if handle.id not in self._tokens:
            # A handle from an earlier process: the token was never persisted, so ask E2B again.
            op = f"look up sandbox {handle.id}"
            response = await self._request(op, "GET", f"{self.api_url}/sandboxes/{quote(handle.id, safe='')}",
                                           headers=self._api_headers())
            if response.status_code != 200:
                self._fail(op, response, sandbox_id=handle.id)
            data = self._json(op, response)
            token = data.get("envdAccessToken") if isinstance(data, dict) else None
            self._tokens[handle.id] = token if isinstance(token, str) and token else None
            if isinstance(data, dict) and isinstance(data.get("domain"), str):
                self._domains[handle.id] = data["domain"]
        headers = {"E2b-Sandbox-Id": handle.id, "E2b-Sandbox-Port": str(ENVD_PORT)}
        token = self._tokens[handle.id]
        if token:
            headers["X-Access-Token"] = token
        if self.sandbox_url:
            return self.sandbox_url, headers
        domain = self._domains.get(handle.id) or handle.metadata.get("domain") or self._default_domain()
        return f"https://{ENVD_PORT}-{handle.id}.{domain}", headers

    def _default_domain(self) -> str:
        host = urlsplit(self.api_url).hostname or "e2b.app"
        return host.removeprefix("api.")

    def _envd_fail(self, op: str, response: httpx.Response, handle: SandboxHandle) -> NoReturn:
        if response.status_code == 401:
            self._tokens.pop(handle.id, None)  # a stale token is looked up again next time
        self._fail(op, response, sandbox_id=handle.id)

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        if call.type not in TOOL_TYPES:
            return unsupported_tool_result(call.type)
        try:
            if call.type == "shell":
                return await self._shell(handle, call)
            if call.type == "write_file":
                return await self._write_file(handle, call)
            return await self._read_file(handle, call)
        except _InvalidCall as exc:
            return ToolResult(exit_code=1, stdout="", stderr=str(exc))

    async def _write_file(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        path = _path_arg(call)
        contents = call.args.get("contents")
        if not isinstance(contents, str):
            raise _InvalidCall("write_file needs a string 'contents'")
        data = contents.encode()
        op = f"write {path} in sandbox {handle.id}"
        base, headers = await self._envd(handle)
        response = await self._request(
            op, "POST", f"{base}/files", params={"path": safe_relative_path(path), "username": ENVD_USER},
            files={"file": (path.rsplit("/", 1)[-1], data, "application/octet-stream")}, headers=headers,
        )
        if response.status_code != 200:
            self._envd_fail(op, response, handle)
        return wrote_file_result(path, len(data))

    async def _read_file(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        path = _path_arg(call)
        op = f"read {path} in sandbox {handle.id}"
        base, headers = await self._envd(handle)
        response = await self._request(op, "GET", f"{base}/files",
                                       params={"path": safe_relative_path(path), "username": ENVD_USER},
                                       headers=headers)
        if response.status_code == 200:
            return ToolResult(exit_code=0, stdout=response.content.decode("utf-8", errors="replace"), stderr="")
        # envd's 404 for a missing path says so; any other 404 comes from the proxy: the sandbox is gone.
        if response.status_code == 404 and "does not exist" in self._server_message(response):
            return file_not_found_result(path)
        if response.status_code == 400 and "directory" in self._server_message(response):
            return ToolResult(exit_code=1, stdout="", stderr=f"Is a directory: {path}")
        self._envd_fail(op, response, handle)

    async def _shell(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        command, timeout, cwd, env = _shell_args(call)
        process: dict[str, Any] = {"cmd": "/bin/bash", "args": ["-lc", command], "cwd": cwd}
        if env:
            process["envs"] = env
        base, headers = await self._envd(handle)
        headers = {
            **headers,
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            "Authorization": "Basic " + base64.b64encode(f"{ENVD_USER}:".encode()).decode(),
        }
        if timeout is not None:
            headers["Connect-Timeout-Ms"] = str(max(1, round(timeout * 1000)))
        body = encode_envelope({"process": process, "tag": call.operation_id, "stdin": False})
        op = f"run shell call {call.operation_id} in sandbox {handle.id}"
        attempt = 0
        while True:
            try:
                return await self._stream_process(op, f"{base}/process.Process/Start", body, headers, handle, timeout)
            except _Transient as failure:  # only failures that prove the command did not start
                if not await self._backoff(attempt, failure):
                    raise ProviderError(f"{failure.detail} (gave up after {attempt + 1} attempt(s))") from None
                attempt += 1

    async def _stream_process(self, op: str, url: str, body: bytes, headers: dict[str, str],
                              handle: SandboxHandle, command_timeout: float | None) -> ToolResult:
        request = self._client.build_request("POST", url, content=body, headers=headers,
                                             timeout=httpx.Timeout(self._client.timeout.connect, read=None))
        try:
            response = await self._client.send(request, stream=True)
        except httpx.ConnectError:
            raise _Transient(f"{op}: could not connect to the sandbox") from None
        except httpx.TransportError as exc:
            raise ProviderError(f"{op}: {type(exc).__name__}; the command may have run") from None
        try:
            log.debug("e2b POST /process.Process/Start -> %s", response.status_code)
            if response.status_code != 200:
                await response.aread()
                if response.status_code in (429, 503):
                    raise _Transient(f"{op}: E2B answered {response.status_code}",
                                     _retry_after(response, self._clock()))
                self._envd_fail(op, response, handle)
            content_type = response.headers.get("Content-Type", "")
            if content_type.split(";")[0].strip() != "application/connect+json":
                raise ConnectProtocolError(f"{op}: expected a Connect stream (application/connect+json), got {content_type!r}")
            try:
                outcome = await read_process_stream(response.aiter_raw())
            except ConnectStreamError as exc:
                if exc.code == "deadline_exceeded" and command_timeout is not None:
                    return _timed_out(exc, command_timeout)
                raise ConnectStreamError(exc.code, self._redact(exc.server_message), context=op) from None
            except (ConnectProtocolError, ConnectStreamTruncated) as exc:
                raise type(exc)(f"{op}: {self._redact(str(exc))}") from None
            except httpx.TransportError as exc:
                raise ConnectStreamTruncated(
                    f"{op}: the connection broke mid-stream ({type(exc).__name__}); the command may or may not have finished"
                ) from None
        finally:
            await response.aclose()
        if outcome.end_error:
            log.debug("e2b process %s ended with error text %r", outcome.pid, self._redact(outcome.end_error))
        return ToolResult(
            exit_code=outcome.exit_code if outcome.exit_code is not None else 1,
            stdout=outcome.stdout.decode("utf-8", errors="replace"),
            stderr=outcome.stderr.decode("utf-8", errors="replace"),
        )


def _timed_out(exc: ConnectStreamError, seconds: float) -> ToolResult:
    """The deadline we asked envd to enforce passed: the command ran and was killed, as with the local
    provider (exit 124, the output so far, and the reason appended to stderr)."""
    out = exc.partial.stdout.decode("utf-8", errors="replace") if exc.partial else ""
    err = exc.partial.stderr.decode("utf-8", errors="replace") if exc.partial else ""
    separator = "\n" if err and not err.endswith("\n") else ""
    return ToolResult(exit_code=TIMEOUT_EXIT_CODE, stdout=out,
                      stderr=f"{err}{separator}Command timed out after {seconds:g} seconds")


class _InvalidCall(Exception):
    """Arguments a tool call cannot run with: reported as a failed tool result, as for an unknown type."""


def _path_arg(call: ToolCall) -> str:
    path = call.args.get("path")
    if not isinstance(path, str):
        raise _InvalidCall(f"{call.type} needs a string 'path'")
    try:
        safe_relative_path(path)
    except ValueError as exc:
        raise _InvalidCall(str(exc)) from None
    return path


def _shell_args(call: ToolCall) -> tuple[str, float | None, str, dict[str, str]]:
    command = call.args.get("command")
    if not isinstance(command, str) or not command:
        raise _InvalidCall("shell needs a non-empty string 'command'")
    timeout = call.args.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
        raise _InvalidCall("shell 'timeout' must be a positive number of seconds")
    cwd_arg = call.args.get("cwd")
    cwd = HOME
    if cwd_arg is not None:
        if not isinstance(cwd_arg, str):
            raise _InvalidCall("shell 'cwd' must be a string")
        try:
            cwd = f"{HOME}/{safe_relative_path(cwd_arg)}"
        except ValueError as exc:
            raise _InvalidCall(str(exc)) from None
    env = call.args.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise _InvalidCall("shell 'env' must map strings to strings")
    return command, (float(timeout) if timeout is not None else None), cwd, env
