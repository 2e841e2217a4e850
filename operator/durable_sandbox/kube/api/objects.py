"""One custom object as a daemon serves it: what the Workflow and the Sandbox controllers share.

kopf runs one daemon per object and hands it a live view of the body (it follows the watch). Both
controllers keep a view per object (:class:`ObjectView`; ``RunView`` and ``SandboxView`` add their own
state), read the newest body from it, wake the daemon when the spec changed or deletion began (status
updates do not count: the daemons write status themselves), and wait for that or for a timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ObjectView", "owner_tag"]


def owner_tag(namespace: str, uid: str) -> str:
    """The owner tag of the provider sandboxes an object makes (orphans are found by it)."""
    return f"{namespace}/{uid}"


@dataclass(kw_only=True)
class ObjectView:
    """The newest body of one object as this process knows it, and the daemon's wake-up."""

    namespace: str
    name: str
    uid: str
    body: Mapping[str, Any]
    body_of: Callable[[], Mapping[str, Any]] | None = None  # kopf's live view of the object
    generation: int | None = None  # the spec generation the daemon last acted on
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def latest(self) -> Mapping[str, Any]:
        if self.body_of is not None:
            self.body = self.body_of()
        return self.body

    @property
    def deleting(self) -> bool:
        return bool(self.latest().get("metadata", {}).get("deletionTimestamp"))

    @property
    def owner(self) -> str:
        return owner_tag(self.namespace, self.uid)

    def notice(self, body: Mapping[str, Any]) -> None:
        """The watch saw ``body`` (or the daemon read it afresh): wake the daemon if the spec changed or
        deletion began. A body older than the one held (a lower generation: a watch that lags behind a fresh
        read, or replays after reconnecting) is ignored, so a read spec change is never forgotten again."""
        meta = body.get("metadata", {})
        held, seen = self.body.get("metadata", {}).get("generation"), meta.get("generation")
        if isinstance(held, int) and isinstance(seen, int) and seen < held:
            return
        self.body = body
        if meta.get("generation") != self.generation or meta.get("deletionTimestamp"):
            self.wake.set()

    async def wait(self, stopped: asyncio.Event, timeout: float | None) -> None:
        """Until woken, ``stopped``, or ``timeout`` seconds (None: no timer)."""
        waiters = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(stopped.wait())]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
