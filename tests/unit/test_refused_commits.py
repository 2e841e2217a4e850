"""A journal write the store refuses (issue 32 item 9: a quota, an admission policy, a read-only database) holds the
run at that boundary with a ``RefusalHold`` (engine/refusals.py): the completed call's result is kept and offered
again until the store takes it, so the call runs exactly once; without a hold the refusal stops the run as before.
A real SQLite store refusing chosen commits, the real local provider, a side-effect log."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import durable_sandbox
from durable_sandbox import Context, workflow
from durable_sandbox.engine import RunStatus, StoreRefused
from durable_sandbox.engine.records import Commit
from durable_sandbox.engine.refusals import RefusalHold
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.stores import SqliteStore


@workflow(name="test-refused-commits")
async def two_calls(ctx: Context, effects: str) -> list[str]:
    async with ctx.sandbox("ws", provider="local", snapshot_every=0) as sbx:
        first = await sbx.shell(f"echo c1 >> {effects}; echo one")
        second = await sbx.shell(f"echo c2 >> {effects}; echo two")
    return [first.stdout.strip(), second.stdout.strip()]


def completes_call(index: int) -> Callable[[Commit], bool]:
    """A commit that carries the completion of the session's call ``index``."""
    return lambda commit: any(r.kind == "sandbox.call" and r.status == "completed" and (r.meta or {}).get("index") == index
                              for r in commit.records)


class Refusing(SqliteStore):
    """Refuses ``times`` commits that ``which`` picks, as a quota would (nothing written)."""

    def __init__(self, path: Path, which: Callable[[Commit], bool], times: int) -> None:
        super().__init__(path)
        self.which, self.left = which, times

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        if self.left and self.which(commit):
            self.left -= 1
            raise StoreRefused("journal writes are refused here (test quota); lift the quota")
        await super().commit(run_id, fence, commit)


class Watcher:
    def __init__(self, on_held: Callable[[int], None] = lambda attempt: None) -> None:
        self.said: list[tuple[str, Any]] = []
        self.on_held = on_held

    def held(self, run_id: str, refusal: StoreRefused, attempt: int, retry_in: float) -> None:
        assert "test quota" in str(refusal)
        self.said.append(("held", attempt))
        self.on_held(attempt)

    def lifted(self, run_id: str, attempts: int) -> None:
        self.said.append(("lifted", attempts))


def _engine(store: SqliteStore, home: Path, watcher: Watcher | None) -> durable_sandbox.Engine:
    hold = [RefusalHold(watcher, first_delay=0.01, max_delay=0.05)] if watcher is not None else []
    return durable_sandbox.Engine(store, providers={"local": LocalProvider(home)}, extensions=hold,
                                  worker_id="test-worker", lease_ttl=10.0)


@pytest.mark.parametrize("index", [0, 1], ids=["rides-on-the-next-start", "rides-on-the-final-commit"])
async def test_a_refused_completion_is_held_and_the_call_runs_once(tmp_path: Path, home: Path, index: int) -> None:
    effects = tmp_path / "effects.log"
    store = Refusing(tmp_path / "runs.db", completes_call(index), times=3)
    watcher = Watcher()
    engine = _engine(store, home, watcher)
    try:
        state = await engine.run(two_calls, str(effects), run_id="held")
    finally:
        await engine.aclose()
        await store.close()
    assert state.status == RunStatus.SUCCEEDED.value and state.result == ["one", "two"]
    assert effects.read_text().split() == ["c1", "c2"], "each call ran exactly once"
    assert watcher.said == [("held", 1), ("held", 2), ("held", 3), ("lifted", 3)]


async def test_without_a_hold_a_refusal_stops_the_run_and_resuming_runs_the_call_again(tmp_path: Path, home: Path) -> None:
    """What ``dsb run`` keeps (a person is told at once) and what the operator's hold exists to avoid."""
    effects = tmp_path / "effects.log"
    store = Refusing(tmp_path / "runs.db", completes_call(0), times=1)
    engine = _engine(store, home, None)
    try:
        with pytest.raises(StoreRefused, match="test quota"):
            await engine.run(two_calls, str(effects), run_id="stopped")
        resumed = await engine.resume("stopped")
        assert resumed.result == ["one", "two"], resumed.error
    finally:
        await engine.aclose()
        await store.close()
    assert effects.read_text().split() == ["c1", "c1", "c2"]


async def test_a_handover_ends_the_hold_with_the_refusal(tmp_path: Path, home: Path) -> None:
    """An operator replica stopping (or a suspend) hands the run over at its next boundary: a held run does not
    wait for the store meanwhile; the refusal ends its execution here and the next one goes on from the journal."""
    effects = tmp_path / "effects.log"
    store = Refusing(tmp_path / "runs.db", completes_call(0), times=100)
    engine = _engine(store, home, None)
    watcher = Watcher(on_held=lambda attempt: attempt == 2 and engine.executor.hand_over("handed", "stopping") and None)
    engine = _engine(store, home, watcher)
    try:
        with pytest.raises(StoreRefused):
            await engine.run(two_calls, str(effects), run_id="handed")
        run = await store.get_run("handed")
    finally:
        await engine.aclose()
        await store.close()
    assert watcher.said == [("held", 1), ("held", 2)]
    assert run is not None and not run.status.terminal
    assert effects.read_text().split() == ["c1"]
