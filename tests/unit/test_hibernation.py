"""Hibernation (DESIGN section 6): a run holding a sandbox that waits longer than ``hibernate_after``
has its sandbox snapshotted and destroyed, and restored when it continues — no live sandbox while it
waits, the files intact afterwards, nothing leaked at the end."""

from __future__ import annotations

from pathlib import Path

import durable_sandbox as ds
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.stores import SqliteStore
from tests.clock import Clock
from tests.dsb import Ran, dsb


@ds.workflow(name="tests.hibernation.approve")
async def approve_flow(ctx: ds.Context) -> dict[str, str]:
    async with ctx.sandbox("ws", provider="local") as sbx:
        await sbx.write_file("notes.txt", "before the wait\n")
        verdict = await ctx.callback("approve", {"what": "deploy"})
        await sbx.shell(f"echo {verdict} >> notes.txt")
        out = await sbx.read_file("notes.txt")
    return {"notes": out.stdout}


@ds.workflow(name="tests.hibernation.sleep")
async def sleepy_flow(ctx: ds.Context) -> str:
    async with ctx.sandbox("ws", provider="local") as sbx:
        await sbx.write_file("a.txt", "kept\n")
        await ctx.sleep("nap", 3600)
        return (await sbx.read_file("a.txt")).stdout


def live_workspaces(provider: LocalProvider) -> list[Path]:
    return sorted(p for p in provider.workspaces_dir.iterdir() if not p.name.startswith("."))


async def test_idle_waiting_run_is_hibernated_by_the_sweep_and_restored_on_resume(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "home")
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": provider}, hibernate_after=300)

    state = await engine.run(approve_flow, run_id="h1")
    assert state.status == "waiting"
    assert len(live_workspaces(provider)) == 1, "below hibernate_after the sandbox stays up"

    # The sweep hibernates only runs idle for longer than its threshold.
    assert await engine.hibernate_idle(older_than=3600) == []
    assert len(live_workspaces(provider)) == 1
    assert await engine.hibernate_idle(older_than=0) == ["h1"]
    assert live_workspaces(provider) == [], "a hibernated run holds no live sandbox"
    assert len(provider.list_snapshots()) == 1, "its workspace is kept as one snapshot"
    kinds = [r.kind for r in await engine.history("h1")]
    assert "sandbox.snapshot" in kinds and "sandbox.destroy" in kinds

    await engine.signal("h1", "approve", "approved")
    state = await engine.resume("h1")
    assert state.status == "succeeded", state.error
    assert state.result == {"notes": "before the wait\napproved\n"}, "files intact after the restore"
    restores = [o for o in state.operations if o.kind == "sandbox.restore"]
    assert [o.meta["reason"] for o in restores] == ["resume"]
    assert state.recovery_count == 0, "waking from hibernation is not a recovery"
    assert provider.leftovers() == [], "finalization removed the sandbox and every snapshot"
    await engine.aclose()


async def test_hibernate_after_zero_hibernates_as_the_run_starts_waiting(tmp_path: Path, clock: Clock) -> None:
    provider = LocalProvider(tmp_path / "home")
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": provider}, hibernate_after=0)

    state = await engine.run(sleepy_flow, run_id="h2")
    assert state.status == "waiting" and state.wake_at is not None
    assert live_workspaces(provider) == []
    assert len(provider.list_snapshots()) == 1

    clock.advance(3601)  # the timer is due: resuming restores the workspace and finishes
    state = await engine.resume("h2")
    assert state.status == "succeeded", state.error
    assert state.result == "kept\n"
    assert provider.leftovers() == []
    await engine.aclose()


async def test_cancelling_a_hibernated_run_deletes_its_snapshot(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "home")
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": provider}, hibernate_after=0)
    state = await engine.run(approve_flow, run_id="h3")
    assert state.status == "waiting"
    assert len(provider.list_snapshots()) == 1
    state = await engine.cancel("h3", "not needed")
    assert state.status == "cancelled"
    assert provider.leftovers() == []
    await engine.aclose()


async def test_a_worker_finalizes_a_waiting_run_cancelled_from_elsewhere(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "home")
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": provider}, hibernate_after=300)
    state = await engine.run(approve_flow, run_id="h4")
    assert state.status == "waiting" and len(live_workspaces(provider)) == 1
    # Another process only records the request (as `dsb cancel` does when it cannot take the lease).
    await engine.store.update_run("h4", {"cancel_requested": "superseded by a newer change"})
    await engine.worker(idle_exit=True, poll_interval=0.01)
    state = await engine.inspect("h4")
    assert state.status == "cancelled"
    assert state.error is not None and state.error["message"] == "superseded by a newer change"
    assert provider.leftovers() == [], "the worker finalized the sandbox of the cancelled run"
    await engine.aclose()


def test_dsb_run_exiting_3_hibernates_the_waiting_runs_sandbox(tmp_path: Path) -> None:
    """DESIGN 6: the process driving a run stops while the run waits (`dsb run` exits 3) -> it hibernates
    the sandbox first, whatever hibernate_after says; `dsb signal` + `dsb resume` restore it."""
    home = tmp_path / "home"

    def run(*args: str) -> Ran:
        return dsb(*args, home=home, process=True)

    waited = run("run", "tests.unit.test_hibernation:approve_flow", "--run-id", "cli-h")
    assert waited.returncode == 3, waited.stdout + waited.stderr
    provider = LocalProvider(home)
    assert live_workspaces(provider) == [], "no live sandbox while the run waits for its approval"
    assert len(provider.list_snapshots()) == 1

    assert run("signal", "cli-h", "approve", '"approved"').returncode == 0
    resumed = run("-o", "json", "resume", "cli-h")
    assert resumed.returncode == 0, resumed.stderr
    assert '"notes": "before the wait\\napproved\\n"' in resumed.stdout
    assert provider.leftovers() == []
