"""A lease keeper's test store: renewals that raise a script's errors in turn (then succeed), timed by the kit's
``SteppedClock``."""

from __future__ import annotations

import asyncio

from durable_sandbox.engine.errors import StoreUnavailable
from durable_sandbox.engine.records import Lease, RunRecord
from durable_sandbox.testing import SteppedClock

RUN = "kept"


class ScriptedRenewals:
    """A store whose renewals raise the script's errors in turn, then succeed (expiry = clock's wall + ttl)."""

    def __init__(self, clock: SteppedClock, script: list[Exception | None], *, forever: Exception | None = None) -> None:
        self.clock = clock
        self.script = list(script)
        self.forever = forever
        self.renewals: list[tuple[float, str]] = []  # (monotonic time, "ok" or the error's type)
        self.enough = asyncio.Event()

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        error = self.script.pop(0) if self.script else self.forever
        self.renewals.append((self.clock.now(), "ok" if error is None else type(error).__name__))
        if len(self.renewals) >= 6:
            self.enough.set()
        if error is not None:
            raise error
        return Lease(lease.run_id, lease.owner, lease.fence, self.clock.wall() + ttl)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return None


def unavailable() -> StoreUnavailable:
    return StoreUnavailable("ConnectionRefusedError: the API server restarts", RUN)
