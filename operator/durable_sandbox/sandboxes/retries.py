"""Retrying a provider's answers: transient errors with backoff, rate limits waited out, cleanup tried hard.

The delays are read when a retry waits (not bound at import), so a test can set them to 0."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from durable_sandbox.providers.contract import (
    ConfigurationError,
    ProviderError,
    ProvisionError,
    RateLimited,
    SandboxGone,
    UnsupportedCapability,
)
from durable_sandbox.sandboxes.errors import CleanupFailed

log = logging.getLogger("durable_sandbox.sandboxes")

T = TypeVar("T")

TRANSIENT_ATTEMPTS = 6
CLEANUP_ATTEMPTS = 8
FIRST_RETRY_DELAY = 0.2  # seconds; doubles per attempt up to MAX_RETRY_DELAY
MAX_RETRY_DELAY = 5.0
MAX_RATE_LIMIT_WAIT = 300.0  # a provider's Retry-After is honoured up to this long per wait, then asked again


async def transient(sid: str, provider: str, what: str, fn: Callable[[], Awaitable[T]]) -> T:
    """``fn()``, retried on a provider's transient errors (``TRANSIENT_ATTEMPTS`` in all) and after every rate
    limit; a loss (``SandboxGone``) and a configuration the provider refuses pass through at once."""
    delay = FIRST_RETRY_DELAY
    attempt = 1
    while True:
        try:
            return await fn()
        except (SandboxGone, UnsupportedCapability, ConfigurationError):
            raise
        except RateLimited as exc:
            # The provider asks us to slow down: the request was not processed and nothing is wrong
            # with it, so the run waits (as long as it takes; a cancel still stops it) and no
            # attempt is spent. The provider has already honoured Retry-After for its own retries.
            wait = min(exc.retry_after if exc.retry_after is not None else delay, MAX_RATE_LIMIT_WAIT)
            log.info("sandbox %s: %s rate limited by provider %s; slowing down, retrying in %.1fs",
                     sid, what, provider, wait)
            await asyncio.sleep(wait)
            delay = min(delay * 2, MAX_RETRY_DELAY)
            continue
        except ProvisionError as exc:
            if not exc.retryable or attempt == TRANSIENT_ATTEMPTS:
                raise
        except ProviderError:
            if attempt == TRANSIENT_ATTEMPTS:
                raise
        log.info("sandbox %s: %s failed transiently (attempt %d); retrying in %.1fs", sid, what, attempt, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_RETRY_DELAY)
        attempt += 1


async def cleanup(what: str, fn: Callable[[], Awaitable[None]], attempts: int | None = None) -> None:
    """``fn()`` (a destroy or a deletion), tried ``attempts`` times in all (default ``CLEANUP_ATTEMPTS``; the
    operator's ``--cleanup-attempts``, through ``SandboxServices``); what is already gone is done."""
    total = CLEANUP_ATTEMPTS if attempts is None else max(1, attempts)
    delay = FIRST_RETRY_DELAY
    for attempt in range(1, total + 1):
        try:
            await fn()
            return
        except SandboxGone:
            return
        except ProviderError as exc:
            if attempt == total or not exc.retryable:
                raise CleanupFailed(f"Could not {what} after {attempt} attempts: {exc}") from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_DELAY)
