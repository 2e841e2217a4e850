"""Calls per second per caller: a token bucket per Kubernetes user (the name TokenReview gave), in this replica.

Why per caller and not per Sandbox: the bound protects the operator and the API server from one runaway agent
(a loop without a model in it) whatever Sandboxes it calls; the per-Sandbox bound (calls in flight) is the
service's. A caller over its rate is refused with 429 and how long to wait (``Retry-After``), never queued: a
queued call would hold a connection and the caller's retry would find it still there.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["CallerRates"]

MAX_CALLERS = 4096  # buckets kept; the least recently used goes first (a full bucket is the same as none)


class CallerRates:
    def __init__(self, per_second: float, *, burst: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if per_second <= 0:
            raise ValueError(f"calls per second must be > 0, not {per_second}")
        self.per_second = per_second
        self.burst = max(burst if burst is not None else per_second, 1.0)  # a second's worth by default
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # caller -> (tokens, at)

    def take(self, caller: str) -> float | None:
        """Take one call for ``caller``: None when it may go, else the seconds until it may."""
        now = self.clock()
        tokens, at = self._buckets.get(caller, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.per_second)
        if tokens >= 1.0:
            self._remember(caller, tokens - 1.0, now)
            return None
        self._remember(caller, tokens, now)
        return (1.0 - tokens) / self.per_second

    def _remember(self, caller: str, tokens: float, now: float) -> None:
        self._buckets[caller] = (tokens, now)
        self._buckets.move_to_end(caller)
        while len(self._buckets) > MAX_CALLERS:
            self._buckets.popitem(last=False)
