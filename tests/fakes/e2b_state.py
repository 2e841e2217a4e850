"""State and fault switches of the fake E2B service (no HTTP here; see ``e2b_server``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

TEAM_SLUG = "fake-team"  # snapshot names are namespaced by the team: "<team>/<name>:<tag>"
SNAPSHOT_TAG = "default"
HOME = "/home/user"
ENVD_PORT = "49983"
# A current envd: >= 0.4.0 means a default user (no username / Basic auth needed), >= 0.5.7 octet-stream
# uploads; the SDK changes what it sends by this version, so an old one would hide requests we must accept.
ENVD_VERSION = "0.6.4"
MAX_TIMEOUT_SECONDS = 86_400
DEFAULT_TIMEOUT_SECONDS = 300  # NewSandboxV2.timeout's default in E2B's API
MAX_PAGE_LIMIT = 100
STALL_LIMIT_SECONDS = 60.0

StreamFault = Literal["malformed", "compressed", "truncated", "missing_end", "bad_event"]


@dataclass
class Sandbox:
    id: str
    template_id: str
    workspace: Path
    access_token: str
    metadata: dict[str, str]
    env_vars: dict[str, str]
    started_at: float
    end_at: float
    seq: int = 0  # creation order: the listing order and what page tokens point at
    state: Literal["running", "paused"] = "running"
    processes: set[int] = field(default_factory=set)  # process groups of commands running in it
    # Gone (killed or deleted): a command whose spawn was under way when it went dies as soon as it is known
    # (its pid joins ``processes`` a few loop turns after the process started: kill() may fall in between).
    gone: bool = False


@dataclass
class Snapshot:
    id: str
    name: str | None  # the bare name the client chose (None: unnamed)
    sandbox_id: str
    files: Path
    builds: int = 1
    seq: int = 0

    @property
    def names(self) -> list[str]:
        """Full names as E2B reports them: team namespace and tag included."""
        return [f"{TEAM_SLUG}/{self.name}:{SNAPSHOT_TAG}"] if self.name else []

    def matches(self, query: str) -> bool:
        """``GET /snapshots?name=``: a name or an id, optionally namespaced and/or tag-qualified."""
        if query == self.id or self.name is None:
            return query == self.id
        bare = query.split("/", 1)[1] if "/" in query else query
        if "/" in query and query.split("/", 1)[0] != TEAM_SLUG:
            return False
        name, _, tag = bare.partition(":")
        return name == self.name and tag in ("", SNAPSHOT_TAG)


@dataclass
class IdempotentCreate:
    """What E2B remembers for an Idempotency-Key: the request it came with and the answer it got."""

    fingerprint: str
    status: int
    body: dict[str, Any]


@dataclass
class CreateFault:
    status: int
    retry_after: str | None


@dataclass
class EosError:
    code: str
    message: str


@dataclass
class RecordedRequest:
    server: Literal["api", "envd"]
    method: str
    path: str
    raw_path: str
    query: dict[str, str]
    headers: Mapping[str, str]  # case-insensitive
    json: Any = None
    raw_query: str = ""  # as sent, before decoding: what query-encoding comparisons look at
    envelope: Any = None  # the JSON message of a Connect streaming request's single envelope
    status: int = 0
    rejection: str | None = None


@dataclass
class FakeState:
    """Everything the fake remembers; the fixture hands this object to tests.

    Time is ``clock() + offset`` so a test moves it with :meth:`advance` instead of sleeping.
    """

    api_key: str = field(default_factory=lambda: "e2b_fake_" + secrets.token_hex(16))
    clock: Callable[[], float] = time.time
    base_templates: frozenset[str] = frozenset({"base"})
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fake-e2b-")))
    api_url: str = ""
    sandbox_url: str = ""
    offset: float = 0.0
    sandboxes: dict[str, Sandbox] = field(default_factory=dict)
    snapshot_store: dict[str, Snapshot] = field(default_factory=dict)  # keyed by snapshot id
    requests: list[RecordedRequest] = field(default_factory=list)
    create_faults: list[CreateFault] = field(default_factory=list)
    create_drops: int = 0
    creates_in_progress: int = 0
    snapshot_drops: int = 0
    idempotency: dict[str, IdempotentCreate] = field(default_factory=dict)
    page_size: int = MAX_PAGE_LIMIT  # the server's own cap per page; tests lower it to force paging
    filter_after_paging: bool = False  # filter each page, not the whole list: short and empty pages
    seq: int = 0
    stream_faults: list[StreamFault | EosError] = field(default_factory=list)
    deleted_templates: list[str] = field(default_factory=list)
    rejections_expected: bool = False  # set by tests that send malformed requests on purpose
    delete_fault: int = 0  # while set, DELETE of sandboxes and templates (snapshots) answers this status
    request_faults: list[CreateFault] = field(default_factory=list)
    request_faults_fired: int = 0
    request_stalls: int = 0
    stalled_requests: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)  # (method, path) -> released
    stalls_fired: int = 0
    throttled: int = 0  # the next this many requests (after auth) answer 429, as E2B's rate limiter does
    throttle_retry_after: str | None = None
    throttle_server: str | None = None  # "api", "envd" or None for both

    # ----------------------------------------------------------------------------------- clock

    def now(self) -> float:
        return self.clock() + self.offset

    def advance(self, seconds: float) -> None:
        """Move the fake's clock forward; sandboxes whose timeout passes are gone on their next lookup."""
        self.offset += seconds

    def expire(self, sandbox_id: str) -> None:
        """Make one sandbox's timeout elapse now, as E2B's TTL would."""
        self.sandboxes[sandbox_id].end_at = self.now() - 1

    def reap_expired(self) -> None:
        """Running sandboxes die at their timeout; paused ones are not bounded by it (E2B keeps them)."""
        now = self.now()
        for sid in [s.id for s in self.sandboxes.values() if s.state == "running" and s.end_at <= now]:
            self._remove(sid)

    # ----------------------------------------------------------------------------------- faults

    def kill(self, sandbox_id: str) -> None:
        """The sandbox dies behind the client's back: every later call about it answers 404."""
        self._remove(sandbox_id)

    def fail_deletes(self, status: int = 503) -> None:
        """Every DELETE of a sandbox or a snapshot answers ``status`` until :meth:`allow_deletes` (an outage
        that outlasts the client's retries, as cleanup must survive)."""
        self.delete_fault = status

    def allow_deletes(self) -> None:
        self.delete_fault = 0

    def fail_create(self, status: int = 429, *, times: int = 1, retry_after: str | None = None) -> None:
        """The next ``times`` ``POST /v2/sandboxes`` answer ``status`` (with ``Retry-After`` when given)."""
        self.create_faults.extend(CreateFault(status, retry_after) for _ in range(times))

    def fail_requests(self, status: int = 503, *, times: int = 1, retry_after: str | None = None) -> None:
        """The next ``times`` requests to the management API, whatever their route, answer ``status`` without
        being processed (an outage of E2B's edge)."""
        self.request_faults.extend(CreateFault(status, retry_after) for _ in range(times))

    def stall_requests(self, times: int = 1) -> None:
        """The next ``times`` requests to the management API get no answer until the client has given up on them
        (it sends the same method and path again, which is processed as usual): a response that outlasts the
        client's timeout, whatever that is. The stalled request then answers 504 unprocessed (nobody reads it),
        and so it does after ``STALL_LIMIT_SECONDS`` if it is never repeated."""
        self.request_stalls += times
    def throttle(self, times: int, *, retry_after: str | None = None, server: Literal["api", "envd"] | None = None) -> None:
        """E2B's rate limiter: the next ``times`` authenticated requests (of ``server``, or any) answer 429
        ``{"code": 429, "message": "rate limit exceeded"}`` (with ``Retry-After`` when given), unprocessed."""
        self.throttled, self.throttle_retry_after, self.throttle_server = times, retry_after, server

    def drop_connection_after_create(self, times: int = 1) -> None:
        """Create the next sandbox(es) but close the connection instead of answering (a lost response)."""
        self.create_drops += times

    def report_create_in_progress(self, times: int = 1) -> None:
        """The next ``times`` creates under an already used Idempotency-Key answer 409
        ``idempotency_in_progress``, as while the first request is still being processed."""
        self.creates_in_progress += times

    def drop_connection_after_snapshot(self, times: int = 1) -> None:
        """Persist the next snapshot(s) but close the connection instead of answering (a lost response)."""
        self.snapshot_drops += times

    def corrupt_next_stream(self, kind: StreamFault) -> None:
        """The next ``process.Process/Start`` runs the command, then answers with a broken Connect stream."""
        self.stream_faults.append(kind)

    def end_stream_with_error(self, code: str = "unavailable", message: str = "envd lost the process") -> None:
        """The next process stream ends with an end-of-stream error envelope instead of an ``end`` event."""
        self.stream_faults.append(EosError(code, message))

    # ----------------------------------------------------------------------------------- views

    def live_sandboxes(self) -> list[str]:
        """Every sandbox that still exists, running or paused."""
        self.reap_expired()
        return sorted(self.sandboxes)

    def snapshots(self) -> list[Snapshot]:
        return list(self.snapshot_store.values())

    def rejections(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.rejection is not None]

    def calls(self, method: str, path_prefix: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == method and r.path.startswith(path_prefix)]

    # ----------------------------------------------------------------------------------- mutations

    def create_sandbox(self, template_id: str, timeout: int, metadata: dict[str, str], env_vars: dict[str, str]) -> Sandbox:
        sid = "i" + secrets.token_hex(10)
        workspace = self.root / "sandboxes" / sid
        source = self.template_files(template_id)
        if source is None:
            workspace.mkdir(parents=True)
        else:
            shutil.copytree(source, workspace, symlinks=True)
        now = self.now()
        sandbox = Sandbox(sid, template_id, workspace, secrets.token_hex(16), metadata, env_vars, now, now + timeout,
                          seq=self._next_seq())
        self.sandboxes[sid] = sandbox
        return sandbox

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def template_exists(self, template_id: str) -> bool:
        return template_id in self.base_templates or template_id in self.snapshot_store

    def template_files(self, template_id: str) -> Path | None:
        snap = self.snapshot_store.get(template_id)
        return snap.files if snap else None

    def take_snapshot(self, sandbox: Sandbox, name: str | None) -> Snapshot:
        # A named snapshot's id is its namespaced, tagged name; an unnamed one gets a template id.
        sid = f"{TEAM_SLUG}/{name}:{SNAPSHOT_TAG}" if name else f"{secrets.token_hex(10)}:{SNAPSHOT_TAG}"
        target = self.root / "snapshots" / secrets.token_hex(8)
        shutil.copytree(sandbox.workspace, target, symlinks=True)
        existing = self.snapshot_store.get(sid)
        if existing is not None:
            # E2B: a name that already exists gets a new build, replacing what the id resolves to.
            shutil.rmtree(existing.files, ignore_errors=True)
            existing.files, existing.sandbox_id = target, sandbox.id
            existing.builds += 1
            return existing
        snap = Snapshot(sid, name, sandbox.id, target, seq=self._next_seq())
        self.snapshot_store[sid] = snap
        return snap

    def delete_template(self, template_id: str) -> bool:
        snap = self.snapshot_store.pop(template_id, None)
        if snap is None:
            return False
        shutil.rmtree(snap.files, ignore_errors=True)
        self.deleted_templates.append(template_id)
        return True

    def _remove(self, sandbox_id: str) -> None:
        sandbox = self.sandboxes.pop(sandbox_id, None)
        if sandbox is not None:
            sandbox.gone = True
            # The VM goes with everything running in it: its commands die (their streams are cut, see
            # start_process) before its files go, so none of them ends normally in a workspace being removed.
            _kill_commands(sandbox)
            shutil.rmtree(sandbox.workspace, ignore_errors=True)

    def kill_commands(self) -> None:
        """Kill every command still running in any sandbox; the sandboxes stay on record (a test may still
        count them as leaks). Commands run in sessions of their own (as in a VM, nothing dies with its
        caller), so the server going away must take them, or a command waiting for something would run for
        good; killing them before the server stops also ends their streams' handlers at once."""
        for sandbox in self.sandboxes.values():
            _kill_commands(sandbox)

    def close(self) -> None:
        self.kill_commands()
        shutil.rmtree(self.root, ignore_errors=True)


def _kill_commands(sandbox: Sandbox) -> None:
    for pgid in sandbox.processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
