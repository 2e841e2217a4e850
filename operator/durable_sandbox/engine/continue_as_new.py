"""Continue-as-new: ``await ctx.continue_as_new(input)`` ends the run and starts a new run of the same workflow.

A run that would live for ever (an agent that runs for weeks) keeps a bounded journal this way: each run of the
chain has its own. The run ends ``succeeded`` with the result ``{"continuedAsNew": <next run id>}``; the next run
has the labels ``durable-sandbox.dev/continued-from`` (the run before it), ``durable-sandbox.dev/chain`` (the
chain's first run) and ``durable-sandbox.dev/generation`` (1, 2, ...), and its id is ``<first run>~<generation>``:
the same for the same run, so a replay after a crash creates nothing twice.

Order, for the sandbox passed over (sandboxes/passover.py): ``continue_as_new`` raises :class:`ContinueAsNew`
through the workflow code; each open ``ctx.sandbox`` block it leaves records its sandbox as passed to the next
run (the old run will never destroy it); only then, after the workflow function has returned, does the old run's
final commit (succeeded, its result naming the next run) create the next run in the same store transaction
(:class:`NextRun`, ``engine.store.commit_ending``; fault point ``continued-as-new:<run>`` right after it). So the
next run can only start once every sandbox is recorded as passed, and finds each in the old run's journal; and
there is never a next run beside an old run still running, nor an old run ended without its next run. (A store
without ``CommitsWithNewRun`` creates the next run just before the final commit: a crash between the two leaves
a next run a replay of the old run finds and keeps.)

Both sides are checked: the next run adopts a sandbox only from the run its label names *and* whose journal says
it passed that sandbox to this very run; a chain is followed (:func:`follow`) only where the next run's label
names the run whose result points at it.
"""

from __future__ import annotations

from typing import Any, NoReturn, Protocol, cast

from durable_sandbox.engine import faults
from durable_sandbox.engine.errors import InvalidInput, RunConflict, WorkflowNotFound
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.engine.serialization import to_jsonable
from durable_sandbox.engine.store import Store
from durable_sandbox.engine.workflow import WorkflowDefinition, resolve

CONTINUED_FROM = "durable-sandbox.dev/continued-from"
CHAIN = "durable-sandbox.dev/chain"
GENERATION = "durable-sandbox.dev/generation"
# The last journal seq the old run had committed when it called continue_as_new: what it wrote at the hand-over
# (sandboxes passed) comes after, so the next run reads only that much of the old journal, however long it is.
HANDED_OVER_AFTER = "durable-sandbox.dev/handed-over-after-seq"
RESULT_KEY = "continuedAsNew"


class ContinueAsNew(BaseException):  # a control-flow signal, like Suspend: not an error
    """Raised by ``ctx.continue_as_new`` through the workflow code (a BaseException: ``except Exception`` in the
    workflow does not stop it); the engine ends the run and starts the next (:class:`NextRun`)."""

    def __init__(self, run: RunRecord, next_run_id: str, input: Any, after_seq: int = 0) -> None:
        super().__init__(f"run {run.run_id!r} continues as new run {next_run_id!r}")
        self.run = run
        self.next_run_id = next_run_id
        self.input = input
        self.after_seq = after_seq


def next_run_id(run: RunRecord) -> str:
    return f"{run.labels.get(CHAIN, run.run_id)}~{int(run.labels.get(GENERATION, '0')) + 1}"


def _definition(run: RunRecord) -> WorkflowDefinition:
    try:
        return resolve(run.workflow)
    except WorkflowNotFound:
        if not run.workflow_ref:
            raise
        return resolve(run.workflow_ref)


class _Context(Protocol):
    @property
    def run_id(self) -> str: ...

    @property
    def operations(self) -> Any: ...


class ContinuesAsNew:
    """``ctx.continue_as_new``: the context's part for it (a base of ``engine.context.Context``)."""

    __slots__ = ()

    async def continue_as_new(self, input: Any = None) -> NoReturn:
        """End this run and start a new run of the same workflow with ``input`` (checked against the workflow's
        input type first: a bad input fails this run, and nothing is passed over). Open ``ctx.sandbox`` blocks
        pass their live sandbox to the new run, which uses it without provisioning. Never returns."""
        rt = cast("_Context", self).operations
        store: Store = rt.store
        run = await store.get_run(rt.run_id)
        assert run is not None  # it executes
        data = to_jsonable(input, what="The input of continue_as_new")
        try:
            _definition(run).check_input(data)
        except InvalidInput as exc:
            raise InvalidInput(f"continue_as_new of run {run.run_id!r} ({run.workflow!r}): {exc}") from None
        committed = next((r.seq for r in reversed(rt.rows) if r.seq), 0)  # rows are in commit order
        raise ContinueAsNew(run, next_run_id(run), data, committed)


class NextRun:
    """The run a run continues as, handed from its workflow task (:meth:`prepare`) to its final commit, which
    creates it in the same transaction (``engine.store.commit_ending``; engine/endings.py)."""

    __slots__ = ("record",)

    def __init__(self) -> None:
        self.record: RunRecord | None = None

    async def prepare(self, store: Store, c: ContinueAsNew) -> dict[str, str]:
        """The next run's record (created by the final commit) and the old run's result; ``RunConflict`` (the
        old run fails, nothing is created) if a run of the next run's id exists that is not its continuation."""
        old = c.run
        labels = {k: v for k, v in old.labels.items()
                  if k not in (CONTINUED_FROM, CHAIN, GENERATION, HANDED_OVER_AFTER)}
        labels |= {CONTINUED_FROM: old.run_id, CHAIN: old.labels.get(CHAIN, old.run_id),
                   GENERATION: str(int(old.labels.get(GENERATION, "0")) + 1), HANDED_OVER_AFTER: str(c.after_seq)}
        stored = await store.get_run(c.next_run_id)
        if stored is not None and (stored.labels.get(CONTINUED_FROM) != old.run_id or stored.input != c.input):
            raise RunConflict(
                f"Run {old.run_id!r} continues as {c.next_run_id!r}, but a run of that id exists that is not its "
                f"continuation (continued from {stored.labels.get(CONTINUED_FROM)!r}); delete it or start a new "
                f"chain."
            )
        self.record = stored or RunRecord(run_id=c.next_run_id, workflow=old.workflow, input=c.input,
                                          thread_id=old.thread_id, labels=labels, workflow_ref=old.workflow_ref)
        return {RESULT_KEY: c.next_run_id}

    def created(self, run_id: str) -> None:
        """The final commit that ended ``run_id`` created the next run (fault point ``continued-as-new:<run>``)."""
        if self.record is not None:
            faults.reach(f"continued-as-new:{run_id}")


def continued_to(run: RunRecord) -> str | None:
    """The run ``run`` continued as, if it ended so."""
    return next_of(run.status.value, run.result)


def next_of(status: str, result: Any) -> str | None:
    """The next run's id, from a run's status and result (a ``RunState``'s too), if it continued as new."""
    if status == RunStatus.SUCCEEDED.value and isinstance(result, dict) and set(result) == {RESULT_KEY}:
        value = result[RESULT_KEY]
        return value if isinstance(value, str) else None
    return None


async def follow(store: Store, run: RunRecord) -> RunRecord:
    """The last run of the chain ``run`` begins (``run`` itself if it did not continue as new); a link is followed
    only where the next run's label names the run before it."""
    seen = {run.run_id}
    while (nxt := continued_to(run)) is not None and nxt not in seen:
        following = await store.get_run(nxt)
        if following is None or following.labels.get(CONTINUED_FROM) != run.run_id:
            return run
        seen.add(nxt)
        run = following
    return run


async def chain_of(store: Store, run: RunRecord, limit: int = 100) -> tuple[list[str], list[str]]:
    """``(earlier, later)`` run ids of ``run``'s chain, nearest first (at most ``limit`` each way), for ``dsb inspect``."""
    earlier: list[str] = []
    cur: RunRecord | None = run
    while cur is not None and len(earlier) < limit and (prev := cur.labels.get(CONTINUED_FROM)):
        before = await store.get_run(prev)
        if before is None or continued_to(before) != cur.run_id:
            break
        earlier.append(prev)
        cur = before
    later: list[str] = []
    cur = run
    while len(later) < limit and (nxt := continued_to(cur)) is not None:
        after = await store.get_run(nxt)
        if after is None or after.labels.get(CONTINUED_FROM) != cur.run_id:
            break
        later.append(nxt)
        cur = after
    return earlier, later
