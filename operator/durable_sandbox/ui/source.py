"""What the web view reads and does, whichever runs it shows: the :class:`RunSource` protocol.

Two implementations: :class:`~durable_sandbox.ui.local.LocalSource` (the local store, through the same
engine ``dsb`` opens) and :class:`~durable_sandbox.ui.cluster.ClusterSource` (``dsb --kube``: the runs
of one namespace through ``KubernetesStore`` with the caller's kubeconfig, steered only through the
Workflow's spec). The pages are written against this protocol alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from durable_sandbox.engine import Event, OperationRecord, RunState, Store

__all__ = ["Action", "RunDetail", "RunHead", "RunPage", "RunQuery", "RunRow", "RunSource", "SandboxRow"]

ActionName = Literal["signal", "cancel", "suspend", "resume"]


@dataclass(frozen=True)
class RunQuery:
    statuses: tuple[str, ...] = ()  # RunStatus values; empty: every status
    workflow: str | None = None  # a registered workflow name, or a Workflow (manifest) name
    labels: tuple[tuple[str, str | None], ...] = ()  # key=value, or key alone (the label is set)
    page: int = 1
    per_page: int = 50

    def matches(self, *, status: str, workflow: str, name: str | None, labels: dict[str, str]) -> bool:
        if self.statuses and status not in self.statuses:
            return False
        if self.workflow and self.workflow not in (workflow, name):
            return False
        return all(key in labels and (value is None or labels[key] == value) for key, value in self.labels)


@dataclass
class RunRow:
    """One line of the runs list."""

    ref: str  # what the pages name the run by: its run id locally, its Workflow's name in a cluster
    run_id: str
    status: str
    workflow: str  # the registered workflow (sandbox-agent, pkg.mod:fn)
    name: str | None  # the manifest's Workflow name, when the run is one
    labels: dict[str, str]
    attempt: int
    calls_done: int | None
    calls_total: int | None
    created: float
    updated: float
    finished: float | None
    waiting_on: list[str] = field(default_factory=list)
    stale: bool = False  # recorded as running, but nobody executes it any more
    error: str | None = None


@dataclass
class RunPage:
    rows: list[RunRow]
    total: int  # runs matching the query, on every page
    query: RunQuery
    truncated: bool = False  # the store holds more runs than the list reads (see its note)

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.query.per_page))


@dataclass(frozen=True)
class Action:
    name: ActionName
    label: str
    does: str  # exactly what pressing it does, in this mode (shown beside the button and on the confirm page)
    enabled: bool = True
    why_not: str | None = None


@dataclass
class RunDetail:
    ref: str
    run_id: str
    state: RunState
    name: str | None  # the manifest's / Workflow's name
    attempt: int
    calls_done: int | None
    calls_total: int | None
    started: bool  # the run exists in the store (a cluster Workflow may not have been started yet)
    terminal: bool
    actions: list[Action]
    facts: list[tuple[str, str]] = field(default_factory=list)  # mode-specific lines (spec flags, lease holder)
    stale: bool = False
    not_started: str | None = None  # what the page says while the run has no journal (None: a Workflow's words)
    links: list[tuple[str, str]] = field(default_factory=list)  # (what, ref): its parent, its children's pages

    @property
    def live(self) -> bool:
        """Executing now: what is in flight grows until now. A run stopped (interrupted, its worker gone), waiting
        or suspended is not: the page says since when, and its timeline ends there."""
        return self.state.status == "running" and not self.stale


@dataclass(frozen=True)
class RunHead:
    """What the timeline needs of a run before anything else (one cheap read)."""

    run_id: str | None  # None while the run is not in the store (a Workflow the operator has not started)
    created_at: float
    status: str
    terminal: bool
    live: bool = False  # executing now (running, and its worker alive): what is in flight grows until now
    session: bool = False  # a Sandbox's own calls (``sandbox/NAME``): their operation ids shown, the newest items kept


@dataclass
class SandboxRow:
    """A sandbox as the Sandboxes page lists it: a run's session (from its journal) or a Sandbox resource."""

    name: str
    kind: Literal["session", "resource"]
    state: str
    provider: str | None
    sandbox_id: str | None
    snapshots: list[str]
    runs: list[tuple[str, str]]  # (ref, label) of the runs that used it
    retained: str | None = None
    detail: str | None = None
    session_ref: str | None = None  # the page of its session calls (``/run?id=sandbox/NAME``), for a Sandbox resource


class RunSource(Protocol):
    @property
    def mode(self) -> Literal["local", "cluster"]: ...

    @property
    def poll_seconds(self) -> float:
        """How often live pages read the store (in a cluster each read is API requests)."""
        ...

    @property
    def store(self) -> Store: ...

    def where(self) -> str:
        """Where the runs are, for the page header (a store path, a cluster and namespace)."""
        ...

    async def list_runs(self, query: RunQuery) -> RunPage: ...

    async def head(self, ref: str) -> RunHead:
        """Raises ``RunNotFound`` (or the source's own not-found error) for no such run."""
        ...

    async def detail(self, ref: str, journal: list[OperationRecord] | None = None) -> RunDetail:
        """The run's page header. ``journal``: the run's rows in commit order as far as the caller has read
        them (the live timeline's), so that a long run's journal is not read again: only what was added
        after it is, and only after the run itself, so the header never shows a run newer than its rows."""
        ...

    async def version(self, ref: str) -> Any:
        """A cheap token that changes when what the run page's header shows changes (status, callbacks, spec)."""
        ...

    async def journal(self, run_id: str) -> list[OperationRecord]: ...

    async def events(self, run_id: str, after: int) -> list[Event]: ...

    async def object_events(self, ref: str) -> list[dict[str, Any]]:
        """Events of the run's object outside the store (a Workflow's Kubernetes Events); [] locally."""
        ...

    async def sandboxes(self) -> tuple[list[SandboxRow], str | None]:
        """The sandboxes to list, and a note on what was left out (None if nothing)."""
        ...

    async def signal(self, ref: str, callback_id: str, value: Any, *, resume: bool) -> str:
        """Returns what was done, for the page's message."""
        ...

    async def cancel(self, ref: str, reason: str) -> str: ...

    async def suspend(self, ref: str) -> str: ...

    async def resume(self, ref: str) -> str: ...


def label_filters(text: str) -> tuple[tuple[str, str | None], ...]:
    """``a=b, c`` -> ((a, b), (c, None)): what the runs list's label box takes."""
    out: list[tuple[str, str | None]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        out.append((key.strip(), value.strip() if sep else None))
    return tuple(out)


def page_of(rows: Sequence[Any], query: RunQuery) -> list[Any]:
    start = (query.page - 1) * query.per_page
    return list(rows[start : start + query.per_page])


def child_runs(rows: Sequence[OperationRecord]) -> list[str]:
    """The child run ids a run's journal records (its ``child`` operations), in the order they were started."""
    out: list[str] = []
    for row in rows:
        child = (row.meta or {}).get("childRunId") if row.kind == "child" else None
        if child and str(child) not in out:
            out.append(str(child))
    return out


async def caught_up(store: Store, run_id: str, journal: list[OperationRecord] | None) -> list[OperationRecord]:
    """``journal`` (None: nothing read yet) with the rows committed after it."""
    if journal is None:
        return await store.load_journal(run_id)
    added = await store.journal_since(run_id, journal[-1].seq if journal else 0)
    return journal + added if added else journal
