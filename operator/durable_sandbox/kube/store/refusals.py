"""How the store's API failures reach its callers: an API server that cannot be reached is ``StoreUnavailable``
(handled as a lost lease, never as a failure of the run); an answer that says the write will never be taken as
it is (quota, RBAC, size) is ``StoreRefused``, with the API server's own short message."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from durable_sandbox.engine.errors import StoreRefused, StoreUnavailable
from durable_sandbox.kube.api.client import ApiException, is_transient

# Answers that say the write will not be taken as it is (others are retried inside the store, or transient).
REFUSALS = frozenset({400, 403, 413, 422})


class _InNamespace(Protocol):
    namespace: str


def api_message(exc: ApiException) -> str:
    """The API server's own message (a Status object's), short; never a request body."""
    try:
        message = str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        message = str(exc.reason)
    return message[:300]


def unavailable_when_unreachable(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A store method whose API server cannot be reached (after the retries inside it) raises
    StoreUnavailable, which every caller handles as a lost lease, never as a failure of the run."""

    @functools.wraps(method)
    async def wrapper(self: _InNamespace, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except Exception as exc:
            if is_transient(exc):
                raise StoreUnavailable(f"{method.__name__}: {type(exc).__name__}: {exc}") from exc
            if isinstance(exc, ApiException) and exc.status in REFUSALS:
                raise StoreRefused(
                    f"The API server refused to write the journal in namespace {self.namespace!r} ({method.__name__}: "
                    f"{exc.status} {api_message(exc)}); the run stops here and goes on from its journal once that "
                    f"is fixed (a ResourceQuota on journals.durable-sandbox.dev, the operator's RBAC, a size limit)."
                ) from exc
            raise

    return wrapper
