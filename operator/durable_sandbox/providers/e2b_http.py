"""The e2b provider's connection to E2B: settings and their checks, the HTTP client, retries (bounded backoff,
Retry-After, a hold-back shared by every request after a 429), what an answer means (an error, a model), and
cursor-paged listings. Secrets (the API key, each sandbox's envd token) live only in this object's memory and
are scrubbed from any text the server echoes back."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit

import httpx
import pydantic

from durable_sandbox.providers.contract import (
    ConfigurationError,
    ProviderError,
    ProvisionError,
    RateLimited,
    SandboxGone,
    SandboxProvider,
)
from durable_sandbox.providers.e2b_api import DEFAULT_DOMAIN
from durable_sandbox.providers.redaction import redact_url

log = logging.getLogger("durable_sandbox.providers.e2b")

__all__ = ["DEFAULT_REQUEST_TIMEOUT", "DEFAULT_TEMPLATE", "E2BConnection", "RetryPolicy", "Transient",
           "configuration_problems", "request_timeout", "retry_after", "retry_attempts"]

DEFAULT_TEMPLATE = "base"

# Provisioning answers that say "not now" rather than "never" (E2B documents 409 for concurrent changes).
_RETRYABLE_PROVISION_STATUSES = frozenset({408, 409, 425, 429})
_TRANSIENT_STATUSES = frozenset({408, 425, 429})


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


class Transient(Exception):
    """A failure worth retrying; carries a secret-free description and the server's Retry-After."""

    def __init__(self, detail: str, retry_after: float | None = None, *, rate_limited: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after
        self.rate_limited = rate_limited  # HTTP 429: E2B asks us to slow down


def retry_after(response: httpx.Response, now: float) -> float | None:
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


DEFAULT_REQUEST_TIMEOUT = 30.0


def request_timeout(raw: str | None) -> float | None:
    """``E2B_REQUEST_TIMEOUT`` as seconds (the default when unset); None when it is not a positive number."""
    if not raw:
        return DEFAULT_REQUEST_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None


def retry_attempts(raw: str | None) -> int | None:
    """``E2B_RETRY_ATTEMPTS`` (requests sent in all for one transient failure's retries; the default when unset);
    None when it is not a whole number from 1 to 20."""
    if not raw:
        return RetryPolicy.attempts
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if 1 <= value <= 20 else None


def configuration_problems(key: str | None, api_url: str, sandbox_url: str | None,
                           raw_timeout: str | None = None, raw_attempts: str | None = None) -> list[str]:
    """One check for the constructor and for the pre-run check (``configuration_problems``)."""
    problems = []
    if request_timeout(raw_timeout) is None:
        problems.append(f"Sandbox provider [e2b]: E2B_REQUEST_TIMEOUT must be a positive number of seconds, "
                        f"got {raw_timeout!r}")
    if retry_attempts(raw_attempts) is None:
        problems.append(f"Sandbox provider [e2b]: E2B_RETRY_ATTEMPTS must be a whole number from 1 to 20, "
                        f"got {raw_attempts!r}")
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



class E2BConnection(SandboxProvider):
    """The provider's state and its HTTP plumbing: the client, secrets kept in memory only (and scrubbed from
    what the server echoes), retries with backoff, a shared hold-back after a rate limit, errors and parsing.
    The layers above it, each a module: ``e2b_sandboxes.py``, ``e2b_snapshots.py``, ``e2b_envd.py``,
    ``e2b_calls.py``; ``e2b.py`` is ``E2BProvider``."""

    name = "e2b"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        domain: str | None = None,
        template: str = DEFAULT_TEMPLATE,
        timeout: float | None = None,
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
        raw_timeout = None if timeout is not None else env.get("E2B_REQUEST_TIMEOUT")
        raw_attempts = None if retry is not None else env.get("E2B_RETRY_ATTEMPTS")
        problems = configuration_problems(key, api_url, sandbox_url, raw_timeout, raw_attempts)
        if problems or not key:
            raise ConfigurationError("; ".join(problems))
        self._api_key = key
        self.api_url = api_url
        self.sandbox_url = sandbox_url
        self.template = template
        self.retry = retry or RetryPolicy(attempts=retry_attempts(raw_attempts) or RetryPolicy.attempts)
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
        seconds = timeout if timeout is not None else request_timeout(raw_timeout)
        self._client = httpx.AsyncClient(timeout=seconds, transport=transport, follow_redirects=False)

    def __repr__(self) -> str:
        sandbox_url = redact_url(self.sandbox_url) if self.sandbox_url else None
        return (f"E2BProvider(domain={self.domain!r}, api_url={redact_url(self.api_url)!r}, "
                f"sandbox_url={sandbox_url!r}, template={self.template!r})")


    async def aclose(self) -> None:
        await self._client.aclose()
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
        """One request. Raises :class:`Transient` when trying again may help and is safe."""
        try:
            response = await self._client.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            detail = f"{op}: {type(exc).__name__} talking to E2B"
            # A request that never connected cannot have had an effect; any later failure might have.
            if replay_safe or isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
                raise Transient(detail) from None
            raise ProviderError(f"{detail}; the request may have taken effect, so it was not repeated") from None
        log.debug("e2b %s %s -> %s", method, urlsplit(url).path, response.status_code)
        status = response.status_code
        if status in _TRANSIENT_STATUSES or status >= 500:
            if replay_safe or status in (429, 503):  # 429/503 say the request was not processed
                await response.aread()
                raise Transient(f"{op}: E2B answered {status}: {self._server_message(response)}",
                                 retry_after(response, self._clock()), rate_limited=status == 429)
        if status == 409 and _error_code(response) == "idempotency_in_progress":
            # A create under the same Idempotency-Key is still being processed: ask again for its answer.
            raise Transient(f"{op}: E2B is still processing the first request with this Idempotency-Key",
                             retry_after(response, self._clock()))
        return response

    async def _backoff(self, attempt: int, failure: Transient) -> bool:
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

    def _gave_up(self, failure: Transient, attempts: int, *, provisioning: bool = False) -> ProviderError:
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
            except Transient as failure:
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
