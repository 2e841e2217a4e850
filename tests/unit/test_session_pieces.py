"""The session's pieces serve on their own (issue 34, for a Sandbox's own session calls): a ``Checkpointer`` and a
``Recoverer`` over a ``SessionScope`` (a journal of completed calls and a provider) rebuild a lost sandbox without a
``SandboxSession``: fresh with every call replayed, then from their own checkpoint with nothing replayed; the journal
says so as it says it for a session, and finalization leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

from durable_sandbox.engine.executor import RunExecutor
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.providers.contract import ToolCall
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sandboxes import journal
from durable_sandbox.sandboxes.checkpoints import Checkpointer
from durable_sandbox.sandboxes.provisioning import Provisioner, sandbox_spec
from durable_sandbox.sandboxes.recovery import Recoverer
from durable_sandbox.sandboxes.replay_policy import ReplayPlanner
from durable_sandbox.sandboxes.scope import SessionScope
from durable_sandbox.sandboxes.session import SandboxSession
from durable_sandbox.sandboxes.teardown import Teardown
from durable_sandbox.stores import SqliteStore

SID = "box"


async def _runtime(executor: RunExecutor, run: RunRecord) -> RunRuntime:
    return await executor.open_runtime(run, await executor.claim(run.run_id))


async def test_a_checkpointer_and_a_recoverer_rebuild_a_lost_sandbox_without_a_session(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "home")
    store = SqliteStore(tmp_path / "runs.db")
    executor = RunExecutor(store, worker_id="w", lease_ttl=30.0)
    run, _ = await store.create_run(RunRecord(run_id="pieces", workflow="pieces", status=RunStatus.RUNNING))
    rt = await _runtime(executor, run)
    # The journal of completed calls, written the usual way.
    session = await SandboxSession(rt, SID, provider).__aenter__()
    await session.write_file("a.txt", "one\n")
    await session.shell("echo two >> a.txt")
    await session.shell("echo three >> a.txt")
    await rt.write()

    # From here on only the pieces, over the journal as another execution reads it.
    rt = await _runtime(executor, run)
    scope = SessionScope.open(rt, SID, provider)
    assert scope.state.completed == 3 and scope.state.handle is not None
    provisioner = Provisioner(scope, sandbox_spec(rt, SID), lease_seconds=3600, attach=None)
    recoverer = Recoverer(scope, provisioner, ReplayPlanner(scope))
    checkpointer = Checkpointer(scope, recoverer)

    lost = scope.state.handle
    await provider.inject_loss(lost)
    await recoverer.recover("lost in the test")  # no checkpoint yet: fresh, all three calls replayed
    first = scope.state.handle
    assert first is not None and first.id != lost.id
    read = ToolCall(operation_id="read", type="read_file", args={"path": "a.txt"})
    assert (await provider.execute(first, read)).stdout == "one\ntwo\nthree\n"

    await checkpointer.checkpoint(3)
    await provider.inject_loss(first)
    await recoverer.recover("lost again")  # from the checkpoint: nothing to replay
    second = scope.state.handle
    assert second is not None and second.id != first.id
    assert (await provider.execute(second, read)).stdout == "one\ntwo\nthree\n"

    restores = [r for r in rt.known_rows() if r.op_id.startswith(f"{SID}/restore/") and r.status == "completed"]
    assert [(r.meta or {}).get(journal.META_REPLAYED) for r in restores] == [
        [journal.call_id(SID, session.operation_id(i)) for i in range(3)], []]
    assert (restores[1].meta or {}).get(journal.META_SNAPSHOT_ID) == scope.state.latest.snapshot_id  # type: ignore[union-attr]
    assert (scope.state.recoveries, scope.state.recovery_attempts) == (2, 2)

    await Teardown(scope, provisioner, checkpointer).finalize(succeeded=True, retain_latest_snapshot=False)
    await rt.write()
    assert provider.leftovers() == []
    await store.close()
