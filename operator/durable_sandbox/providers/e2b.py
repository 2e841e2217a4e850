"""The ``e2b`` provider: E2B sandboxes over E2B's HTTP APIs (management API + envd), as E2B's SDK speaks them.

Configuration (constructor arguments win over the environment): ``E2B_API_KEY`` (required),
``E2B_DOMAIN`` (default ``e2b.app``), ``E2B_API_URL`` (default ``https://api.<domain>``), ``E2B_SANDBOX_URL``
(one envd host for every sandbox; by default ``https://sandbox.<domain>`` for E2B's own domains and
``https://49983-<id>.<domain>`` for others, see :func:`e2b_api.sandbox_url`), ``template`` and the HTTP ``timeout``.

Secrets (the API key and each sandbox's envd access token) live only in this object's memory: they are
never put in handles, log lines or exception messages, and :meth:`_redact` scrubs them from any text the
server echoes back.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import hashlib
import logging
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar
from urllib.parse import quote, urlsplit

import httpx
import pydantic

from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    RETAIN_LABEL,
    TOOL_TYPES,
    Capability,
    ConfigurationError,
    ProviderCapabilities,
    ProviderError,
    ProvisionError,
    RateLimited,
    SandboxGone,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    SnapshotEntry,
    ToolCall,
    ToolResult,
    file_not_found_result,
    safe_relative_path,
    tag_key,
    unsupported_tool_result,
    wrote_file_result,
)
from durable_sandbox.providers.e2b_api import (
    DEFAULT_DOMAIN,
    ENVD_PORT,
    CreatedSandbox,
    ListedSandbox,
    SandboxDetail,
    SnapshotInfo,
    bare_snapshot_name,
    envd_version,
    idempotency_key,
    metadata_query,
    needs_explicit_user,
    sandbox_url,
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

DEFAULT_TEMPLATE = "base"
ENVD_USER = "user"
KEEPALIVE_PING_SECONDS = 50  # asks envd for keepalive events, so idle proxies keep long commands' streams open
HOME = "/home/user"
MAXIMUM_LEASE_SECONDS = 86_400
OWNER_METADATA_KEY = "durable-sandbox.dev/owner"
SNAPSHOT_NAME_PREFIX = "dsb-"
TIMEOUT_EXIT_CODE = 124  # what coreutils' timeout(1) reports, so scripts can recognise it

# Provisioning answers that say "not now" rather than "never" (E2B documents 409 for concurrent changes).
_RETRYABLE_PROVISION_STATUSES = frozenset({408, 409, 425, 429})
_TRANSIENT_STATUSES = frozenset({408, 425, 429})


def snapshot_name(operation_id: str, handle: SandboxHandle | None = None) -> str:
    """The snapshot name for an operation: deterministic, so a retried snapshot finds the first one.

    E2B keeps nothing but a name with a snapshot, so a snapshot of a sandbox labelled with an installation
    carries its tags in the name, as digests (``tag_key``): ``dsb-<installation>-<owner>-<k|d><operation>``
    (``k``: the sandbox had RETAIN_LABEL). The inventory reads them back (:func:`parse_tagged_snapshot_name`)."""
    digest = hashlib.sha256(operation_id.encode()).hexdigest()
    labels = (handle.metadata.get("labels") if handle is not None else None) or {}
    installation = labels.get(INSTALLATION_LABEL) if isinstance(labels, dict) else None
    if not isinstance(installation, str):
        return SNAPSHOT_NAME_PREFIX + digest[:40]
    assert handle is not None
    owner = handle.metadata.get("owner")
    owner_key = tag_key(owner) if isinstance(owner, str) else _NO_OWNER
    kept = "k" if RETAIN_LABEL in labels else "d"
    return f"{SNAPSHOT_NAME_PREFIX}{tag_key(installation)}-{owner_key}-{kept}{digest[:28]}"


_NO_OWNER = "0" * 12
_TAGGED_NAME = re.compile(rf"{SNAPSHOT_NAME_PREFIX}([0-9a-f]{{12}})-([0-9a-f]{{12}})-([kd])[0-9a-f]{{28}}")


def parse_tagged_snapshot_name(name: str) -> tuple[str, str | None, bool] | None:
    """``(installation key, owner key or None, retained)`` of a name made by :func:`snapshot_name` for a
    labelled sandbox; None for any other name."""
    match = _TAGGED_NAME.fullmatch(name)
    if match is None:
        return None
    installation_key, owner_key, kept = match.groups()
    return installation_key, (None if owner_key == _NO_OWNER else owner_key), kept == "k"


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

    def __init__(self, detail: str, retry_after: float | None = None, *, rate_limited: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after
        self.rate_limited = rate_limited  # HTTP 429: E2B asks us to slow down


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


_M = TypeVar("_M", bound=pydantic.BaseModel)


def _problems(exc: pydantic.ValidationError) -> str:
    """Which fields of E2B's answer were missing or malformed (never their values: they may be tokens)."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors(include_input=False))


def _error_code(response: httpx.Response) -> str | None:
    """E2B's machine-readable ``error_code`` of an error answer, if it has one."""
    try:
        body = response.json()
    except ValueError:
        return None
    code = body.get("error_code") if isinstance(body, dict) else None
    return code if isinstance(code, str) else None


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
        domain: str | None = None,
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
        self.domain = domain or env.get("E2B_DOMAIN") or DEFAULT_DOMAIN
        api_url = (api_url or env.get("E2B_API_URL") or f"https://api.{self.domain}").rstrip("/")
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
        self._envd_versions: dict[str, tuple[int, ...] | None] = {}
        # Create idempotency keys are scoped to this object: a new process (after a crash) has already reaped
        # what the old one may have created, so it must not be handed the old sandbox back by E2B.
        self._instance = secrets.token_hex(8)
        self._key_generation: dict[str, int] = {}  # operation id -> bumped when its sandbox is destroyed
        self._created_by: dict[str, str] = {}  # sandbox id -> operation id that created it
        self._throttled_until = 0.0  # clock time before which no new request is sent (after a 429)
        self._client = httpx.AsyncClient(timeout=timeout, transport=transport, follow_redirects=False)

    def __repr__(self) -> str:
        sandbox_url = redact_url(self.sandbox_url) if self.sandbox_url else None
        return (f"E2BProvider(domain={self.domain!r}, api_url={redact_url(self.api_url)!r}, "
                f"sandbox_url={sandbox_url!r}, template={self.template!r})")

    @classmethod
    def configuration_problems(cls, environ: Mapping[str, str]) -> list[str]:
        domain = environ.get("E2B_DOMAIN") or DEFAULT_DOMAIN
        return _configuration_problems(environ.get("E2B_API_KEY"), environ.get("E2B_API_URL") or f"https://api.{domain}",
                                       environ.get("E2B_SANDBOX_URL") or None)

    def capabilities(self) -> ProviderCapabilities:
        return ProviderCapabilities(
            supported=frozenset(
                {
                    Capability.SNAPSHOT,
                    Capability.SNAPSHOT_DELETION,
                    Capability.SNAPSHOT_RECONCILIATION,
                    Capability.RESTORE,
                    Capability.LEASE_RECONCILIATION,
                    Capability.INVENTORY,
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
                                 _retry_after(response, self._clock()), rate_limited=status == 429)
        if status == 409 and _error_code(response) == "idempotency_in_progress":
            # A create under the same Idempotency-Key is still being processed: ask again for its answer.
            raise _Transient(f"{op}: E2B is still processing the first request with this Idempotency-Key",
                             _retry_after(response, self._clock()))
        return response

    async def _backoff(self, attempt: int, failure: _Transient) -> bool:
        """Wait before the next attempt; False when the attempts (or the patience for Retry-After) ran out."""
        if failure.rate_limited:
            # Rate limited: every request of this provider holds back until then, not only this one, so
            # concurrent runs slow down together instead of each hammering E2B into more 429s.
            wait = failure.retry_after if failure.retry_after is not None else self.retry.delay(attempt, None)
            self._throttled_until = max(self._throttled_until, self._clock() + wait)
        if attempt + 1 >= self.retry.attempts:
            return False
        if failure.retry_after is not None and failure.retry_after > self.retry.max_retry_after:
            return False
        delay = self.retry.delay(attempt, failure.retry_after)
        log.debug("e2b retrying in %.2fs after: %s", delay, failure.detail)
        await self._sleep(delay)
        return True

    async def _hold_back(self) -> None:
        """Before a new request: wait out what is left of a rate limit another request was told about."""
        wait = self._throttled_until - self._clock()
        if wait > 0:
            log.debug("e2b rate limited: holding a request back %.2fs", wait)
            await self._sleep(wait)

    def _gave_up(self, failure: _Transient, attempts: int, *, provisioning: bool = False) -> ProviderError:
        message = f"{failure.detail} (gave up after {attempts} attempt(s))"
        if failure.rate_limited:  # not a failure of the request: the caller slows down and tries again
            return RateLimited(message, retry_after=failure.retry_after)
        if provisioning:
            return ProvisionError(message, retryable=True)
        return ProviderError(message)

    async def _request(self, op: str, method: str, url: str, *, provisioning: bool = False,
                       replay_safe: bool = True, **kwargs: Any) -> httpx.Response:
        attempt = 0
        await self._hold_back()
        while True:
            try:
                return await self._send_once(op, method, url, replay_safe=replay_safe, **kwargs)
            except _Transient as failure:
                if not await self._backoff(attempt, failure):
                    raise self._gave_up(failure, attempt + 1, provisioning=provisioning) from None
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

    def _parse(self, op: str, response: httpx.Response, model: type[_M]) -> _M:
        try:
            return model.model_validate(self._json(op, response))
        except pydantic.ValidationError as exc:
            raise ProviderError(f"{op}: E2B's answer does not match its {model.__name__} model ({_problems(exc)})") from None

    def _parse_list(self, op: str, response: httpx.Response, model: type[_M]) -> list[_M]:
        data = self._json(op, response)
        if not isinstance(data, list):
            raise ProviderError(f"{op}: E2B's answer is not a list")
        try:
            return [model.model_validate(item) for item in data]
        except pydantic.ValidationError as exc:
            raise ProviderError(
                f"{op}: E2B listed an entry that does not match its {model.__name__} model ({_problems(exc)})"
            ) from None

    async def _pages(self, op: str, path: str, params: dict[str, str]) -> AsyncIterator[httpx.Response]:
        """Every page of a cursor-paged list: ``nextToken`` in, ``X-Next-Token`` out. No ``limit``, as the SDK
        sends none: E2B's default page size (100) applies, and a short or empty page still has a token to follow."""
        seen: set[str] = set()
        token: str | None = None
        while True:
            query = {**params, **({"nextToken": token} if token else {})}
            response = await self._request(op, "GET", f"{self.api_url}{path}", params=query,
                                           headers=self._api_headers())
            if response.status_code != 200:
                self._fail(op, response)
            yield response
            token = response.headers.get("X-Next-Token") or None
            if token is None:
                return
            if token in seen:  # a server that hands out the same cursor again would loop forever
                raise ProviderError(f"{op}: E2B repeated a page token; the listing cannot be completed")
            seen.add(token)

    # ------------------------------------------------------------------------------------- management

    def _check_lease(self, seconds: int) -> None:
        if not isinstance(seconds, int) or not 1 <= seconds <= MAXIMUM_LEASE_SECONDS:
            raise ValueError(f"lease must be a whole number of seconds in [1, {MAXIMUM_LEASE_SECONDS}], got {seconds!r}")

    def _create_key(self, op: str, spec: SandboxSpec) -> str:
        """The ``Idempotency-Key`` of a create: derived from the spec's operation id (a retry of the same
        operation is answered with the same sandbox), or fresh for a caller that gave none (then only this
        call's own retries share it)."""
        if spec.operation_id is None:
            return idempotency_key(self._instance, op, secrets.token_hex(8))
        generation = self._key_generation.get(spec.operation_id, 0)
        return idempotency_key(self._instance, spec.operation_id, str(generation))

    async def _create(self, op: str, template: str, spec: SandboxSpec, lease_seconds: int) -> SandboxHandle:
        self._check_lease(lease_seconds)
        metadata = dict(spec.labels)
        if spec.owner is not None:
            metadata[OWNER_METADATA_KEY] = spec.owner
        body: dict[str, Any] = {"templateID": template, "timeout": lease_seconds, "metadata": metadata,
                                "envVars": dict(spec.env)}
        # With the key, E2B answers a repeated create with the sandbox of the first one, so a create whose
        # answer was lost is safe to send again: exactly one sandbox.
        headers = {**self._api_headers(), "Idempotency-Key": self._create_key(op, spec)}
        response = await self._request(op, "POST", f"{self.api_url}/v2/sandboxes", provisioning=True,
                                       json=body, headers=headers)
        if response.status_code != 201:
            self._fail(op, response, provisioning=True)
        try:
            created = self._parse(op, response, CreatedSandbox)
        except ProviderError as exc:
            raise ProvisionError(str(exc), retryable=True) from None
        sandbox_id = created.sandbox_id
        self._remember(sandbox_id, created.envd_access_token, created.domain, created.envd_version)
        if spec.operation_id is not None:
            self._created_by[sandbox_id] = spec.operation_id
        meta: dict[str, Any] = {"templateID": template, "envdVersion": created.envd_version}
        if created.domain:
            meta["domain"] = created.domain
        if spec.owner is not None:
            meta["owner"] = spec.owner
        if spec.labels:
            meta["labels"] = dict(spec.labels)
        log.debug("e2b created sandbox %s from template %s", sandbox_id, template)
        return SandboxHandle(id=sandbox_id, provider=self.name, metadata=meta,
                             lease_expires_at=self._clock() + lease_seconds)

    def _remember(self, sandbox_id: str, token: str | None, domain: str | None, version: str | None) -> None:
        self._tokens[sandbox_id] = token or None
        if domain:
            self._domains[sandbox_id] = domain
        self._envd_versions[sandbox_id] = envd_version(version)

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
        self._envd_versions.pop(handle.id, None)
        operation = self._created_by.pop(handle.id, None)
        if operation is not None:
            # A later create for the same operation (after this sandbox was reaped) must get a new sandbox,
            # not E2B's remembered answer pointing at the one just destroyed.
            self._key_generation[operation] = self._key_generation.get(operation, 0) + 1

    async def _listed(self, op: str, key: str, value: str) -> list[SandboxHandle]:
        """Every sandbox whose metadata has ``key: value``, running or paused, across all pages (``GET
        /v2/sandboxes``; the v1 listing shows running sandboxes only, so an orphan sweep on it would miss paused
        ones). Filtered again here: a server that ignored the filter must not make a sweep destroy foreign ones."""
        params = {"metadata": metadata_query({key: value}), "state": "running,paused"}
        handles = []
        async for response in self._pages(op, "/v2/sandboxes", params):
            for item in self._parse_list(op, response, ListedSandbox):
                metadata = item.metadata or {}
                if metadata.get(key) != value:
                    continue
                handles.append(SandboxHandle(
                    id=item.sandbox_id, provider=self.name,
                    metadata={"templateID": item.template_id, "owner": metadata.get(OWNER_METADATA_KEY),
                              "state": item.state,
                              "labels": {k: v for k, v in metadata.items() if k != OWNER_METADATA_KEY}},
                    lease_expires_at=item.end_at.timestamp(),
                ))
        return handles

    async def list_sandboxes(self, owner: str) -> list[SandboxHandle]:
        """Every sandbox tagged with ``owner``, running or paused, across all pages."""
        return await self._listed(f"list sandboxes of owner {owner}", OWNER_METADATA_KEY, owner)

    async def inventory_sandboxes(self, installation: str) -> list[SandboxHandle]:
        """Every sandbox labelled with ``installation``, running or paused, whatever its owner, on every page."""
        return await self._listed(f"list sandboxes of installation {installation}", INSTALLATION_LABEL, installation)

    async def inventory_snapshots(self, installation: str) -> list[SnapshotEntry]:
        """Every snapshot whose name carries ``installation``'s key (see :func:`snapshot_name`), on every page
        of ``GET /snapshots``."""
        op = f"list snapshots of installation {installation}"
        key = tag_key(installation)
        entries: dict[str, SnapshotEntry] = {}
        async for response in self._pages(op, "/snapshots", {}):
            for item in self._parse_list(op, response, SnapshotInfo):
                for full in item.names:
                    tags = parse_tagged_snapshot_name(bare_snapshot_name(full))
                    if tags is not None and tags[0] == key:
                        entries[item.snapshot_id] = SnapshotEntry(
                            id=item.snapshot_id, provider=self.name, installation_key=key, owner_key=tags[1],
                            retained=tags[2],
                        )
        return list(entries.values())

    # ------------------------------------------------------------------------------------- snapshots

    async def _find_snapshot(self, op: str, name: str) -> str | None:
        """The snapshot named ``name``, looked for on every page. E2B reports full names
        (``team-slug/<name>:<tag>``), so the namespace and tag are set aside before comparing."""
        async for response in self._pages(op, "/snapshots", {"name": name}):
            for item in self._parse_list(op, response, SnapshotInfo):
                if any(bare_snapshot_name(full) == name for full in item.names):
                    return item.snapshot_id
        return None

    async def snapshot(self, handle: SandboxHandle, *, operation_id: str) -> str:
        name = snapshot_name(operation_id, handle)
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
            snapshot_id = self._parse(op, response, SnapshotInfo).snapshot_id
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
            detail = self._parse(op, response, SandboxDetail)
            self._remember(handle.id, detail.envd_access_token, detail.domain, detail.envd_version)
        # The routing headers go with every envd request, whichever host serves it (as the SDK does).
        headers = {"E2b-Sandbox-Id": handle.id, "E2b-Sandbox-Port": str(ENVD_PORT)}
        token = self._tokens[handle.id]
        if token:
            headers["X-Access-Token"] = token
        domain = self._domains.get(handle.id) or handle.metadata.get("domain") or self.domain
        return sandbox_url(handle.id, domain, self.sandbox_url), headers

    def _explicit_user(self, handle: SandboxHandle) -> bool:
        """Whether envd needs the user named (envd < 0.4.0 has no default user)."""
        version = self._envd_versions.get(handle.id) or envd_version(handle.metadata.get("envdVersion"))
        return needs_explicit_user(version)

    def _files_params(self, handle: SandboxHandle, path: str) -> dict[str, str]:
        params = {"path": safe_relative_path(path)}
        if self._explicit_user(handle):
            params["username"] = ENVD_USER
        return params

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
            op, "POST", f"{base}/files", params=self._files_params(handle, path),
            files={"file": (safe_relative_path(path), data, "application/octet-stream")}, headers=headers,
        )
        if response.status_code != 200:
            self._envd_fail(op, response, handle)
        return wrote_file_result(path, len(data))

    async def _read_file(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        path = _path_arg(call)
        op = f"read {path} in sandbox {handle.id}"
        base, headers = await self._envd(handle)
        response = await self._request(op, "GET", f"{base}/files", params=self._files_params(handle, path),
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
        # As the SDK starts commands: a login bash with -l -c; cwd only when asked (envd defaults to home).
        process: dict[str, Any] = {"cmd": "/bin/bash", "args": ["-l", "-c", command]}
        if env:
            process["envs"] = env
        if cwd is not None:
            process["cwd"] = cwd
        base, headers = await self._envd(handle)
        headers = {
            **headers,
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            "Keepalive-Ping-Interval": str(KEEPALIVE_PING_SECONDS),
        }
        if self._explicit_user(handle):
            headers["Authorization"] = "Basic " + base64.b64encode(f"{ENVD_USER}:".encode()).decode()
        if timeout is not None:
            headers["Connect-Timeout-Ms"] = str(max(1, round(timeout * 1000)))
        body = encode_envelope({"process": process, "tag": call.operation_id, "stdin": False})
        op = f"run shell call {call.operation_id} in sandbox {handle.id}"
        attempt = 0
        await self._hold_back()
        while True:
            try:
                return await self._stream_process(op, f"{base}/process.Process/Start", body, headers, handle, timeout)
            except _Transient as failure:  # only failures that prove the command did not start
                if not await self._backoff(attempt, failure):
                    raise self._gave_up(failure, attempt + 1) from None
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
                                     _retry_after(response, self._clock()), rate_limited=response.status_code == 429)
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


def _shell_args(call: ToolCall) -> tuple[str, float | None, str | None, dict[str, str]]:
    command = call.args.get("command")
    if not isinstance(command, str) or not command:
        raise _InvalidCall("shell needs a non-empty string 'command'")
    timeout = call.args.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
        raise _InvalidCall("shell 'timeout' must be a positive number of seconds")
    cwd_arg = call.args.get("cwd")
    cwd = None
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
