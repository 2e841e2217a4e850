"""What a failed request to the API server was: named once, for every part of the operator and ``dsb --kube``
(re-exported by :mod:`durable_sandbox.kube.api.client`)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
from kubernetes.aio.client.exceptions import ApiException

__all__ = ["ApiException", "brief", "is_conflict", "is_gone", "is_not_found", "is_precondition_failed", "is_transient"]


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404


def is_gone(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status in (404, 410)


def is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 409


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: the connection failed or timed out, or the server is overloaded or failing."""
    if isinstance(exc, ApiException):
        return exc.status in (429, 500, 502, 503, 504)
    return isinstance(exc, aiohttp.ClientError | asyncio.TimeoutError)


def brief(exc: BaseException) -> str:
    """One line saying what went wrong with a request: ``HTTP 429 Too Many Requests: storage is (re)initializing``
    (the Status message of an ApiException, whose own text is a multi-line dump of headers and body), else the
    exception's type and text."""
    if isinstance(exc, ApiException):
        message = exc.body if isinstance(exc.body, str) else ""
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(message).get("message") or message  # a Status: its message says it all
        message = " ".join(message.split())
        return f"HTTP {exc.status} {exc.reason or ''}".rstrip() + (f": {message[:300]}" if message else "")
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def is_precondition_failed(exc: BaseException) -> bool:
    """A JSON Patch ``test`` op did not hold (the apiserver answers 422 Unprocessable Entity)."""
    return isinstance(exc, ApiException) and exc.status == 422
