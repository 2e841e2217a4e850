"""Retry policy for steps. Every attempt is journaled; the delay before the next one is recorded too,
so a worker that restarts during a backoff waits only for what is left of it."""

from __future__ import annotations

import random
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from durable_sandbox.engine.errors import is_retryable


class RetryPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    max_attempts: int = Field(default=3, ge=1)
    initial_interval: float = Field(default=1.0, ge=0)
    backoff: float = Field(default=2.0, ge=1)
    max_interval: float = Field(default=60.0, ge=0)
    jitter: bool = True
    # Exception types that are retried; None means "whatever the error says" (is_retryable) plus any
    # ordinary exception, which is what users of Temporal and LangGraph expect from a retry policy.
    retry_on: tuple[type[BaseException], ...] | Callable[[BaseException], bool] | None = None
    non_retryable: tuple[type[BaseException], ...] = ()

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        if attempt >= self.max_attempts or isinstance(exc, self.non_retryable):
            return False
        if getattr(exc, "retryable", None) is False:
            return False
        if self.retry_on is None:
            return isinstance(exc, Exception)
        if isinstance(self.retry_on, tuple):
            return isinstance(exc, self.retry_on)
        return bool(self.retry_on(exc))

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.max_interval, self.initial_interval * (self.backoff ** (attempt - 1)))
        return base * random.uniform(0.5, 1.0) if self.jitter else base


NO_RETRY = RetryPolicy(max_attempts=1)

__all__ = ["NO_RETRY", "RetryPolicy", "is_retryable"]
