"""Issue 12: a deleted Workflow's finalizer waited up to the daemon's 60 s graceful backoff.

kopf lets the finalizer go only in a handling cycle that finds the object's daemons ended; a daemon ending
is no watch event, so a daemon that kopf found still running (it marks it DAEMON_SIGNALLED) and that ended
afterwards made kopf wait for the next event of the object, or the backoff. The daemon wrapper now touches
the object once its task has ended, when (and only when) kopf is left waiting. These tests drive the wrapper
with kopf's own stopper, setting its reasons in the order kopf's ``stop_daemons``/``stop_daemon`` do."""

from __future__ import annotations

import asyncio

from kopf import DaemonStoppingReason as Reason
from kopf._core.intents.stoppers import DaemonStopper

from durable_sandbox.kube.handlers import DAEMON_INSTANT_EXIT, configure_kopf, until_stopped
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics


class Daemon:
    """A daemon body that, once told to stop, still has one write to make on its way out (a status flush)."""

    def __init__(self) -> None:
        self.stopper: DaemonStopper = DaemonStopper()
        self.told_to_stop = asyncio.Event()
        self.last_write_done = asyncio.Event()
        self.touches: list[bool] = []  # for each touch: had the daemon's task ended when it was sent?
        self.task: asyncio.Task[None] | None = None
        self.metrics = OperatorMetrics(process_collectors=False)
        self.background: set[asyncio.Task[None]] = set()  # the touches under way

    async def serve(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.told_to_stop.set()
        await self.last_write_done.wait()

    async def touch(self) -> None:
        assert self.task is not None
        self.touches.append(self.task.done())

    def start(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(until_stopped(self.stopper.async_waiter, self.serve, touch=self.touch,
                                                      metrics=self.metrics, background=self.background))
        return self.task


async def settle(daemon: Daemon) -> None:
    assert daemon.task is not None
    await asyncio.wait_for(asyncio.shield(daemon.task), 10)
    # The touch is a task of its own, created by the daemon task's done callback.
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_daemon_that_ends_after_kopf_found_it_running_makes_kopf_look_again() -> None:
    daemon = Daemon()
    daemon.start()
    daemon.stopper.set(reason=Reason.RESOURCE_DELETED)
    await asyncio.wait_for(daemon.told_to_stop.wait(), 10)
    # kopf's wait for an instant exit is over and the daemon still runs: kopf signals it and schedules its
    # next look at the object for the end of the graceful backoff.
    daemon.stopper.set(reason=Reason.DAEMON_SIGNALLED)
    daemon.last_write_done.set()
    await settle(daemon)
    assert daemon.touches == [True]  # exactly one touch, sent after the daemon's task had ended


async def test_a_daemon_that_ended_within_kopfs_wait_costs_no_write() -> None:
    daemon = Daemon()
    daemon.last_write_done.set()
    daemon.start()
    daemon.stopper.set(reason=Reason.RESOURCE_DELETED)
    await settle(daemon)  # kopf found it ended: it lets the finalizer go in the same handling cycle
    assert daemon.touches == []


async def test_an_exiting_operator_touches_nothing() -> None:
    daemon = Daemon()
    daemon.start()
    daemon.stopper.set(reason=Reason.OPERATOR_EXITING)
    await asyncio.wait_for(daemon.told_to_stop.wait(), 10)
    daemon.stopper.set(reason=Reason.DAEMON_SIGNALLED)  # stop_daemon's graceful wait (the run is handed over)
    daemon.last_write_done.set()
    await settle(daemon)
    assert daemon.touches == []


def test_kopf_waits_for_a_stopping_daemon_within_the_deletion_cycle() -> None:
    import kopf

    settings = kopf.OperatorSettings()
    assert settings.background.instant_exit_timeout is None  # kopf's default: 10 event-loop turns only
    configure_kopf(settings)
    assert settings.background.instant_exit_timeout == DAEMON_INSTANT_EXIT
