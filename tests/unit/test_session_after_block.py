"""A run that waits (or crashes) after its `async with ctx.sandbox(...)` block has ended replays the
finished session from the journal: completed calls return their results, nothing is re-provisioned,
and the snapshot whose ownership passed to the caller is not touched again."""

from __future__ import annotations

from pathlib import Path

import pytest

import durable_sandbox as ds
from durable_sandbox.engine.errors import InvalidInput, RunNotFound
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.stores import SqliteStore


@ds.workflow(name="tests.session_after_block")
async def build_then_approve(ctx: ds.Context) -> dict[str, object]:
    async with ctx.sandbox("ws", provider="local", snapshot_every=1, retain_latest_snapshot=True) as sbx:
        await sbx.shell("echo built > artifact.txt")
        out = await sbx.read_file("artifact.txt")
    verdict = await ctx.callback("approve", {"artifact": out.stdout})
    return {"artifact": out.stdout, "verdict": verdict, "snapshot": sbx.result()["latestSnapshot"]}


async def test_replay_after_the_block_keeps_the_transferred_snapshot(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "home")
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": provider})
    state = await engine.run(build_then_approve, run_id="after")
    assert state.status == "waiting"
    [kept] = provider.list_snapshots()
    journal_before = len(await engine.history("after"))

    await engine.signal("after", "approve", "yes")
    state = await engine.resume("after")
    assert state.status == "succeeded", state.error
    assert state.result == {"artifact": "built\n", "verdict": "yes", "snapshot": kept}
    assert provider.list_snapshots() == [kept], "the transferred snapshot is the caller's: never deleted"
    new_rows = (await engine.history("after"))[journal_before:]
    assert [r.kind for r in new_rows] == ["callback"], "replaying the finished session wrote nothing"
    await provider.delete_snapshot(kept)
    assert provider.leftovers() == []
    await engine.aclose()


@ds.workflow(name="tests.session_after_block.fails_later")
async def build_then_fail(ctx: ds.Context) -> None:
    async with ctx.sandbox("ws", provider="local", snapshot_every=1, retain_latest_snapshot=True) as sbx:
        await sbx.shell("echo built > artifact.txt")
    raise RuntimeError("the release failed after the sandbox work")


async def test_a_retained_snapshot_is_deleted_when_the_run_fails_after_the_block(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "home")
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": provider})
    state = await engine.run(build_then_fail, run_id="late-failure")
    assert state.status == "failed"
    assert "the release failed" in state.error["message"]
    assert provider.leftovers() == [], "ownership passes to the caller only when the run succeeds"
    assert state.snapshots == []
    await engine.aclose()


async def test_reserved_operation_ids_are_rejected_before_provisioning(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "home")
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": provider})
    spec = {"toolCalls": [{"type": "shell", "command": "true", "operationId": "provision"}]}
    with pytest.raises(InvalidInput, match="'provision' is reserved"):
        await engine.run("sandbox-agent", spec, run_id="reserved")
    with pytest.raises(RunNotFound):
        await engine.inspect("reserved")  # rejected before a run existed
    assert provider.leftovers() == []
    await engine.aclose()
