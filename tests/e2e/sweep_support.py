"""The orphan sweep's e2e scenario (issue 13, acceptance 3: `dsb operator --sweep-interval/--sweep-grace`), for
any provider (local, and e2b through the fake E2B server's inventory) and either journal (the operator's env).

Leftovers are made the way they happen: an operator SIGKILLed between the provider's create and the journal
commit (fault point ``provisioned:sandbox/provision``), another between a snapshot and its journal record
(``snapshot-taken:sandbox/snapshot/1``), each Workflow then deleted without its cleanup (finalizer removed, as
by hand or a force-cleaned namespace). Beside them in the same provider: a sandbox and a snapshot with no
installation label, and ones of another installation. A sweeping operator removes exactly the leftovers within
its sweep period plus grace, while a Workflow it is running keeps its sandbox; everything else is untouched.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from durable_sandbox.providers.contract import INSTALLATION_LABEL, SandboxProvider, SandboxSpec
from durable_sandbox.providers.e2b import E2BProvider
from durable_sandbox.providers.local import LocalProvider
from tests.builders import workflow
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    get,
    http_get,
    scrape,
    status,
    total,
    wait_condition,
    wait_gone,
)
from tests.fakes.e2b_state import FakeState
from tests.ports import free_port

__all__ = ["SWEEP", "Provider", "e2b_provider", "local_provider", "sweeps_leftovers"]

T = TypeVar("T")
SWEEP = ("--sweep-interval", "1", "--sweep-grace", "3")


def _run(make: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(make())


@dataclass
class Provider:
    """How the test sees one provider: the operator's settings for it and the provider's whole inventory."""

    name: str
    sandbox: dict[str, Any]  # a Workflow's spec.sandbox
    env: dict[str, str]
    args: tuple[str, ...]
    make: Callable[[], SandboxProvider]  # the test's own client of the same provider
    sandboxes: Callable[[], set[str]]  # every sandbox that exists, ours or not
    snapshots: Callable[[], set[str]]

    async def _ours(self, installation: str) -> tuple[set[str], set[str]]:
        provider = self.make()
        try:
            sandboxes = {h.id for h in await provider.inventory_sandboxes(installation)}
            snapshots = {s.id for s in await provider.inventory_snapshots(installation)}
            return sandboxes, snapshots
        finally:
            await provider.aclose()

    def ours(self, installation: str) -> tuple[set[str], set[str]]:
        return _run(lambda: self._ours(installation))

    async def _others(self, installation: str | None) -> tuple[str, str]:
        provider = self.make()
        labels = {INSTALLATION_LABEL: installation} if installation else {}
        try:
            handle = await provider.provision(SandboxSpec(owner="someone/else", labels=labels), lease_seconds=600)
            return handle.id, await provider.snapshot(handle, operation_id=f"not-ours-{installation}")
        finally:
            await provider.aclose()

    def others(self, installation: str | None) -> tuple[str, str]:
        """A sandbox and a snapshot of it, made outside the operator: unlabelled, or of ``installation``."""
        return _run(lambda: self._others(installation))


def local_provider(home: Path) -> Provider:
    def ids(sub: str, suffix: str) -> set[str]:
        d = home / "local" / sub
        return {p.name.removesuffix(suffix) for p in d.iterdir() if not p.name.startswith(".")} if d.is_dir() else set()

    return Provider("local", {"provider": "local"}, {}, ("--allow-local-provider",), lambda: LocalProvider(home=home),
                    lambda: ids("workspaces", ""), lambda: ids("snapshots", ".tar"))


def e2b_provider(fake: FakeState) -> Provider:
    env = {"E2B_API_KEY": fake.api_key, "E2B_API_URL": fake.api_url, "E2B_SANDBOX_URL": fake.sandbox_url}
    return Provider("e2b", {"provider": "e2b", "template": "base"}, env, (),
                    lambda: E2BProvider(environ=env), lambda: set(fake.live_sandboxes()),
                    lambda: {s.id for s in fake.snapshots()})


def _workflow(name: str, sandbox: dict[str, Any], calls: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return workflow(name, sandbox=sandbox, toolCalls=calls, **spec)


def _deleted_without_cleanup(cp: ControlPlane, ns: str, name: str) -> None:
    cp.kubectl("delete", "workflow", name, "-n", ns, "--wait=false")
    cp.kubectl("patch", "workflow", name, "-n", ns, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
    wait_gone(cp, ns, name, timeout=60)


def _killed(op: Any, point: str) -> None:
    code = op.wait_exit(timeout=180)
    assert code == -signal.SIGKILL, f"the operator was to die at {point}; exit {code}:\n{op.logs()[-3000:]}"


def sweeps_leftovers(cp: ControlPlane, ns: str, operators: Any, provider: Provider, tmp_path: Path) -> None:
    installation = f"e2e/{ns}"
    args = (*provider.args, "--installation-id", installation)
    echo = [{"type": "shell", "command": "echo hi > out.txt"}, {"type": "shell", "command": "cat out.txt"}]

    # Leftovers: a sandbox made but not journaled, then a sandbox and a snapshot not journaled, of deleted Workflows.
    point = "provisioned:sandbox/provision"
    crashed = operators(*args, "--sweep-interval", "0", env=provider.env, fault=point, name="killed-at-provision")
    cp.apply(_workflow("made-not-journaled", provider.sandbox, echo), "-n", ns)
    _killed(crashed, point)
    _deleted_without_cleanup(cp, ns, "made-not-journaled")
    point = "snapshot-taken:sandbox/snapshot/1"
    crashed = operators(*args, "--sweep-interval", "0", env=provider.env, fault=point, name="killed-at-snapshot")
    cp.apply(_workflow("snapshot-not-journaled", provider.sandbox, echo, snapshotEveryNCalls=1), "-n", ns)
    _killed(crashed, point)
    _deleted_without_cleanup(cp, ns, "snapshot-not-journaled")
    leaked_sandboxes, leaked_snapshots = provider.ours(installation)
    assert len(leaked_sandboxes) == 2 and len(leaked_snapshots) == 1, (leaked_sandboxes, leaked_snapshots)
    untagged = provider.others(None)
    foreign = provider.others("e2e/another-installation")
    kept_sandboxes = provider.sandboxes() - leaked_sandboxes
    kept_snapshots = provider.snapshots() - leaked_snapshots
    assert {untagged[0], foreign[0]} <= kept_sandboxes and {untagged[1], foreign[1]} <= kept_snapshots

    # The sweeping operator, running a Workflow whose sandbox it must keep while sweeping.
    log, gate = tmp_path / "live.log", tmp_path / "gate"
    port = free_port()
    sweeper = operators(*args, *SWEEP, "--metrics-port", str(port), env=provider.env, name="sweeper")
    gated = [{"type": "shell", "command": f"echo started >> {log}; while [ ! -e {gate} ]; do sleep 0.05; done"}]
    cp.apply(_workflow("live", provider.sandbox, gated), "-n", ns)
    wait_until(lambda: http_get(port, "/healthz")[0] == 200, 60, "the sweeping operator's /healthz")
    try:
        wait_until(log.exists, 120, "the live Workflow's call to start")
        live_sandbox = wait_until(lambda: (status(cp, ns, "live").get("sandbox") or {}).get("providerId"), 60,
                                  "the live Workflow's sandbox in its status")
        try:
            wait_until(lambda: not (leaked_sandboxes & provider.sandboxes() or leaked_snapshots & provider.snapshots()),
                       120, "the orphan sweep to remove the leftovers")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; sweeper log:\n{sweeper.logs()[-4000:]}") from None
        logs = sweeper.logs()
        for kind, ids in (("sandbox", leaked_sandboxes), ("snapshot", leaked_snapshots)):
            for item in ids:
                assert f"orphan sweep: destroyed {kind} {item} of provider {provider.name}: its owner" in logs, logs[-4000:]
        metrics = scrape(port)
        assert total(metrics, "durable_sandbox_orphan_sandboxes_destroyed_total", provider=provider.name) == 2
        assert total(metrics, "durable_sandbox_orphan_snapshots_destroyed_total", provider=provider.name) == 1
        # Sweeps that began after the live Workflow's sandbox was in its status (so they listed it), grace and more.
        sweeps = total(metrics, "durable_sandbox_orphan_sweeps_total", outcome="ok")
        wait_until(lambda: total(scrape(port), "durable_sandbox_orphan_sweeps_total", outcome="ok") >= sweeps + 5, 120,
                   "five more sweeps")
        assert live_sandbox in provider.sandboxes(), "a running Workflow's sandbox is never swept"
        assert kept_sandboxes <= provider.sandboxes() and kept_snapshots <= provider.snapshots(), \
            "nothing without our installation label is touched"
        assert get(cp, ns, "live") is not None
    finally:
        gate.touch()
    wait_condition(cp, ns, "live", "Succeeded", timeout=120)
    assert provider.ours(installation) == (set(), set())
