"""The API server not answering, said once: when it goes away, at growing intervals while it stays away, and when it
answers again (docs/operations.md, "The operator's log").

Every part of the operator that meets an API server that does not answer (kopf's watches, a run's turn, a lease
renewal, a status patch, the orphan sweep) retries on its own backoff and reports here (:meth:`ApiServerAway.failed`)
instead of logging a line per try. The first report starts a probe (a LIST of Workflows, what kopf's watches need)
that asks again with a bounded backoff; the WARNING names what failed and when the probe asks next. A probe that
succeeds at once (a blip another retry got past) says nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from durable_sandbox.kube.api.api_errors import brief, is_transient

__all__ = ["ApiServerAway", "took"]

log = logging.getLogger("durable_sandbox.kube.apiserver")

FIRST_DELAY = 1.0  # seconds before the probe asks again, doubling up to MAX_DELAY
MAX_DELAY = 30.0
FIRST_REMINDER = 30.0  # seconds after the first WARNING that the next says it is still away, doubling up to MAX_REMINDER
MAX_REMINDER = 300.0

Probe = Callable[[], Awaitable[object]]


def took(seconds: float) -> str:
    """A duration as a person reads it: 4.2s, 3m05s, 1h02m."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


class ApiServerAway:
    def __init__(self, *, first_delay: float = FIRST_DELAY, max_delay: float = MAX_DELAY,
                 first_reminder: float = FIRST_REMINDER, max_reminder: float = MAX_REMINDER,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.first_delay, self.max_delay = first_delay, max_delay
        self.first_reminder, self.max_reminder = first_reminder, max_reminder
        self.clock = clock
        self.probe: Probe | None = None  # set once the operator serves (kube/process/application.py): silent until then
        self.away_since: float | None = None  # while the probe has not yet succeeded
        self._task: asyncio.Task[None] | None = None

    def configure(self, probe: Probe | None) -> None:
        self.probe = probe

    def failed(self, where: str) -> None:
        """Something (``where``: what it was doing) could not reach the API server; it retries on its own."""
        if self.probe is None or (self._task is not None and not self._task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # reported from outside the operator's loop: nothing to probe with
            return
        self._task = loop.create_task(self._watch(where), name="the API server probe")

    async def _watch(self, where: str) -> None:
        assert self.probe is not None
        started = self.clock()
        delay, reminder = self.first_delay, self.first_reminder
        said: float | None = None
        while True:
            try:
                await self.probe()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.away_since = started
                now = self.clock()
                if said is None:
                    log.warning("the API server does not answer (%s: %s); the operator waits for it (runs keep "
                                "their state, nothing is lost) and asks again in %gs, then with a backoff of up to "
                                "%gs", where, brief(exc), delay, self.max_delay)
                    said = now
                elif now - said >= reminder:
                    log.warning("the API server still does not answer after %s (%s); asking again in %gs",
                                took(now - started), brief(exc), delay)
                    said, reminder = now, min(reminder * 2, self.max_reminder)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_delay)
                continue
            if said is not None:
                log.info("the API server answers again (it did not for %s)", took(self.clock() - started))
            self.away_since = None
            return

    def unreachable(self, exc: BaseException, where: str) -> bool:
        """Whether ``exc`` is the API server not answering (then reported here, which says it once): the caller
        retries and logs nothing more; else the caller says what went wrong itself."""
        if not any(is_transient(e) for e in _chain(exc)):  # the journal's StoreUnavailable carries it as its cause
            return False
        self.failed(where)
        return True

    async def aclose(self) -> None:
        task, self._task = self._task, None
        self.probe = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _chain(exc: BaseException, depth: int = 4) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(found) < depth:
        found.append(current)
        current = current.__cause__
    return found
