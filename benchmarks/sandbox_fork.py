"""A Sandbox fork (``spec.from``) restored from its own copy of the source's snapshot, against the same fork replaying
every call into its fresh sandbox (issue 36 leftovers: sessions/fork_restore.py).

    python benchmarks/sandbox_fork.py                  # writes benchmarks/results/sandbox_fork.json
    python benchmarks/sandbox_fork.py --calls 45 --every 10 --mb 10 --repeats 3

What runs: this process, the local provider, a SQLite store and the call service's session journal
(sessions/journal.py), with a small stand-in for the Sandbox controller (it provisions each Sandbox's sandbox and,
after a loss or a fork's hand-back, restores the newest snapshot of its session, as kube/sandbox/operations.py
does). A source Sandbox makes ``--calls`` shell calls, each writing its share of a ``--mb`` MB workspace (random
bytes), a snapshot every ``--every`` calls (a Sandbox keeps its newest: after 40 of 45 calls by default). A fork
after its last call is then made: ``restore`` times its first call (the journal seeded, the snapshot at 40 copied
into the fork's own, the fresh sandbox given back and restored from the copy, calls 41 to 45 replayed, then the
call); ``replay`` is the same fork with a provider that cannot copy snapshots (no ``snapshot_copy``): all 45 calls
replayed into the fresh sandbox, then the call. Medians of ``--repeats``; each fork is a new Sandbox.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS_DIR, fmt, machine_info, print_table, ratio, run_in_workdir
from durable_sandbox.kube.sandbox.checkpoints import session_snapshots
from durable_sandbox.providers.contract import (
    Capability,
    ProviderCapabilities,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    ToolCall,
)
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.fork_seed import SourceRef
from durable_sandbox.sessions.journal import SandboxRef, SessionJournal
from durable_sandbox.stores.sqlite import SqliteStore

NAMESPACE = "bench"


class NoCopyProvider(LocalProvider):
    """The local provider without ``snapshot_copy``: a fork replays every call."""

    def capabilities(self) -> ProviderCapabilities:
        caps = super().capabilities()
        return caps.model_copy(update={"supported": caps.supported - {Capability.SNAPSHOT_COPY}})


@dataclass
class Box:
    uid: str
    provider: LocalProvider
    handle: SandboxHandle
    lineage: dict[str, str] = field(default_factory=dict)
    source: SourceRef | None = None


@dataclass
class Controller:
    """The Sandboxes of namespace ``bench`` and what their controller does for a session (kube_gate.py's part)."""

    store: SqliteStore
    every: int
    boxes: dict[str, Box] = field(default_factory=dict)

    async def add(self, name: str, provider: LocalProvider, source: SourceRef | None = None) -> SandboxRef:
        uid = f"uid-{name}"
        handle = await provider.provision(SandboxSpec(owner=f"{NAMESPACE}/{uid}"), lease_seconds=3600)
        self.boxes[name] = Box(uid, provider, handle, {handle.id: ""}, source)
        return await self.find(NAMESPACE, name)

    async def find(self, namespace: str, name: str) -> SandboxRef:
        if name not in self.boxes:
            raise CallRefused(404, "no such Sandbox", where=f"Sandbox {namespace}/{name}", do="create it")
        box = self.boxes[name]
        return SandboxRef(namespace, name, box.uid, snapshot_every=self.every, source=box.source)

    @contextlib.asynccontextmanager
    async def live(self, ref: SandboxRef) -> AsyncIterator[tuple[SandboxHandle, SandboxProvider]]:
        box = self.boxes[ref.name]
        yield box.handle, box.provider

    async def replaced(self, ref: SandboxRef, lost: str) -> SandboxHandle:
        box = self.boxes[ref.name]
        if box.handle.id == lost:
            journals: Any = SimpleNamespace(store_for=lambda _ns: self.store)
            newest = await session_snapshots(journals, ref.namespace, ref.uid)
            source = newest[-1].snapshot_id if newest else None
            spec = SandboxSpec(owner=f"{NAMESPACE}/{box.uid}")
            box.handle = (await box.provider.restore(source, spec, lease_seconds=3600) if source
                          else await box.provider.provision(spec, lease_seconds=3600))
            box.lineage[box.handle.id] = source or ""
        return box.handle

    async def lineage(self, ref: SandboxRef) -> Mapping[str, str]:
        return dict(self.boxes[ref.name].lineage)


def _shell(op: str, command: str) -> ToolCall:
    return ToolCall(operation_id=op, type="shell", args={"command": command})


async def _measure(args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    home = workdir / "home"
    copying, plain = LocalProvider(home), NoCopyProvider(home)
    for provider in (copying, plain):
        provider.snapshot_limit = max(provider.snapshot_limit, (args.mb + 8) * 1024 * 1024)
    store = SqliteStore(workdir / "runs.db")
    ctl = Controller(store, args.every)
    journal = SessionJournal(store, worker_id="bench", lease_ttl=60.0, owned=False)
    per_call = args.mb * 1024 * 1024 // args.calls
    source = await ctl.add("src", copying)
    for i in range(args.calls):
        await journal.call(source, ctl, _shell(f"c{i}", f"head -c {per_call} /dev/urandom > part-{i}.bin"))
    samples: dict[str, list[float]] = {"restore": [], "replay": []}
    for k in range(args.repeats):
        for what, provider in (("restore", copying), ("replay", plain)):
            ref = await ctl.add(f"{what}-{k}", provider, SourceRef("src", None, args.calls))
            started = time.perf_counter()
            answer = await journal.call(ref, ctl, _shell("first", "ls | wc -l"))
            samples[what].append(time.perf_counter() - started)
            assert answer.result.stdout.strip() == str(args.calls), answer
    await journal.aclose()
    return {what: statistics.median(values) for what, values in samples.items()}


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()}}
    res["seconds"] = asyncio.run(_measure(args, workdir))
    res["ratio_replay_over_restore"] = ratio(res["seconds"]["replay"], res["seconds"]["restore"])
    return res


def report(res: dict[str, Any]) -> None:
    s = res["seconds"]
    print_table("a Sandbox fork's first call: restored from its copy vs all calls replayed (median seconds)",
                ["what", "seconds"], [
                    ["restore (copy + restore + calls since the snapshot + the call)", fmt(s["restore"], "", 3)],
                    ["replay (every call replayed into the fresh sandbox + the call)", fmt(s["replay"], "", 3)],
                    ["ratio replay / restore", fmt(res["ratio_replay_over_restore"], "x", 1)],
                ])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=45)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--mb", type=int, default=10, help="the workspace's size after all calls, in MB")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--out", default=str(RESULTS_DIR / "sandbox_fork.json"))
    args = ap.parse_args(argv)
    out: dict[str, Any] = {}

    def go(workdir: Path) -> dict[str, Any]:
        out.update(run(args, workdir))
        return out

    run_in_workdir("sandbox-fork", args.tmp, go, report, Path(args.out))
    return out


if __name__ == "__main__":
    main()
