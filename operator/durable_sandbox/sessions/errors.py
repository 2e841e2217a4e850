"""The one error a session call is refused with: an HTTP status and what/where/do, never a secret."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from durable_sandbox.sessions.models import ErrorBody

__all__ = ["CallRefused"]

_REASONS: Final[Mapping[int, str]] = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
            413: "PayloadTooLarge", 429: "TooManyRequests", 503: "Unavailable", 500: "Failed"}


class CallRefused(Exception):
    def __init__(self, status: int, what: str, *, where: str, do: str, retry: bool | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{what} ({where}); {do}")
        self.body = ErrorBody(status=status, reason=_REASONS[status], what=what, where=where, do=do,  # type: ignore[arg-type]
                              retry=status in (429, 503) if retry is None else retry, retryAfter=retry_after)

    @property
    def status(self) -> int:
        return self.body.status
