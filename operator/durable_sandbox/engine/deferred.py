"""Records that wait for the run's next commit instead of a commit of their own.

Two kinds: a record ``defer``red by the engine (a quick step's start, a ``ctx.patched`` marker), which goes
with whatever commit comes next, and a sandbox call's completion that ``ride``s on it
(``RunRuntime.defer_completion``): if no write follows within ``RIDE_SECONDS`` a completion is committed on
its own, so a crash then loses no completed call. Crash tests' ``after:<op>`` point of a riding completion
is reached once it is committed (``landed``).

A commit whose outcome is unknown (its task cancelled while the write was in flight, an answer lost in an API
server restart) may have landed: what it carried comes back ``unsure``, and before it rides on another commit
the journal is asked whether it is there already (``RunRuntime.confirm_unsure``); else one completion would be
journaled twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from durable_sandbox.engine import faults
from durable_sandbox.engine.records import OperationRecord

# How long a deferred completion waits for the run's next write before it is committed on its own.
RIDE_SECONDS = 0.5


class Deferred:
    """What waits for the run's next commit; ``write_alone`` commits it without records of its own."""

    def __init__(self, write_alone: Callable[[], Awaitable[None]]) -> None:
        self.records: list[OperationRecord] = []
        self.unsure: list[OperationRecord] = []  # put back from a commit that may have landed (``put_back``)
        self._write_alone = write_alone
        self._ridden: set[str] = set()
        self._flush: asyncio.Task[None] | None = None
        self._committing = False

    def defer(self, record: OperationRecord) -> None:
        self.records.append(record)

    def ride(self, record: OperationRecord) -> None:
        self.records.append(record)
        self._ridden.add(record.op_id)
        if self._flush is None or self._flush.done():
            self._flush = asyncio.get_running_loop().create_task(self._flush_riders())

    def take(self) -> list[OperationRecord]:
        """Everything deferred, for the commit being made (``put_back`` if it fails, ``landed`` once it lands)."""
        taken, self.records = self.records, []
        return taken

    def put_back(self, records: list[OperationRecord], *, unsure: bool = False) -> None:
        """A commit that failed: its deferred records go with the next one, before what was deferred since.
        ``unsure``: its outcome is unknown (it may have landed), so the journal is asked before they go again."""
        self.records[:0] = records
        if unsure:
            self.unsure.extend(records)

    def confirm(self, stored: list[OperationRecord]) -> list[OperationRecord]:
        """``stored``: the journal past the rows the run knows. The ``unsure`` records it holds are committed
        (given their seqs, no longer deferred, returned); the others go with the next commit as any deferred
        record."""
        found = {record_identity(r): r.seq for r in stored}
        landed = [r for r in self.unsure if record_identity(r) in found]
        for rec in landed:
            rec.seq = found[record_identity(rec)]
        gone = {id(r) for r in landed}
        self.records = [r for r in self.records if id(r) not in gone]
        self.unsure = []
        self.landed(landed)
        return landed

    async def _flush_riders(self) -> None:
        await asyncio.sleep(RIDE_SECONDS)
        if not any(r.op_id in self._ridden for r in self.records):
            return
        self._committing = True
        try:
            # Not held: a refusal leaves them deferred for the run's next write, which holds (and which
            # would otherwise wait behind a hold in this background task that nothing could end).
            await self._write_alone()
        except BaseException:  # the records stay deferred: the next write or the final commit takes them
            return
        finally:
            self._committing = False

    async def settle(self) -> None:
        """Before a write: a deferred completion being committed on its own lands first (commit order is
        journal order); a flush still waiting is dropped, since this write carries what it would."""
        task = self._flush
        if task is None or task.done() or task is asyncio.current_task():
            return
        if self._committing:
            await asyncio.shield(task)
        else:
            task.cancel()

    def landed(self, records: list[OperationRecord]) -> None:
        """``records`` are committed: a riding completion's ``after:<op>`` point is here, where it is durable."""
        for rec in records:
            if rec.op_id in self._ridden:
                self._ridden.discard(rec.op_id)
                faults.reach(f"after:{rec.op_id}")


def record_identity(rec: OperationRecord) -> tuple[str, str, int, int, float]:
    """What tells one journal record from every other: its ``ts`` is set once, when it is made."""
    return rec.op_id, rec.status, rec.attempt, rec.epoch, rec.ts
