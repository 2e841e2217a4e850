"""Issue 36, first slice: fork a run at call N (local provider, SQLite), and who deletes which snapshot.

The source workflow appends a numbered line per call to ``log.txt`` and answers with the line count, keeps
every checkpoint (``keep_checkpoints``) and waits on ``done`` inside its sandbox block, so its sandbox and
snapshots are live when it is forked. A fork's workspace is compared with what the source's calls up to N
make; the ``local`` fixture checks at teardown that no sandbox, snapshot or lease is left.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import durable_sandbox
from durable_sandbox.providers.contract import SandboxHandle
from durable_sandbox.sandboxes import fork_journal
from durable_sandbox.sandboxes.fork import ForkDiverged, ForkRefused
from durable_sandbox.sandboxes.session import SessionState
from tests.unit.fork_support import counter
from tests.unit.sandbox_session_support import Hooked, db, engine_for, local

__all__ = ["db", "local"]  # fixtures


@pytest.fixture
async def engine(db: Path, local: Hooked) -> AsyncIterator[durable_sandbox.Engine]:
    e = engine_for(db, {"local": local})
    yield e
    await e.aclose()


async def workspace_log(engine: durable_sandbox.Engine, local: Hooked, run_id: str) -> str:
    state = SessionState.derive("sandbox", await engine.history(run_id))
    assert state.handle is not None, "the fork has no sandbox"
    path = local.inner.workspace_path(state.handle.id) / "log.txt"
    return path.read_text() if path.exists() else ""


async def finish(engine: durable_sandbox.Engine, *run_ids: str) -> None:
    for run_id in run_ids:
        await engine.signal(run_id, "done", True)
        state = await engine.resume(run_id)
        assert state.status == "succeeded", state


async def source(engine: durable_sandbox.Engine, calls: int = 50, every: int = 10, **spec: Any) -> str:
    state = await engine.run(counter, {"calls": calls, "every": every, **spec}, run_id="src")
    assert state.status == "waiting"
    return "src"


def expected_log(n: int) -> str:
    return "".join(f"{i}\n" for i in range(n))


@pytest.mark.parametrize("after", [0, 17, 40, 45, 50])
async def test_a_fork_has_the_sources_workspace_after_call_n_and_replays_only_since_the_newest_checkpoint(
    engine: durable_sandbox.Engine, local: Hooked, after: int
) -> None:
    await source(engine)
    executed = len(local.calls("execute"))
    forked = await engine.fork("src", after_call=after)
    (fork,) = forked.run_ids
    assert await workspace_log(engine, local, fork) == expected_log(after)
    assert len(local.calls("execute")) - executed == after % 10  # restored at the newest checkpoint <= N
    rows = await engine.history(fork)
    assert rows[0].op_id == "fork" and rows[0].meta is not None
    assert (rows[0].meta["source"], rows[0].meta["afterCall"]) == ("src", after)
    # The fork continues anew from call N in its own workspace: the tail's counts go on from N.
    await finish(engine, fork, "src")
    result = (await engine.inspect(fork)).result
    assert result["counts"] == [str(i + 1) for i in range(50)]


async def test_k_forks_of_one_point_replay_once_and_each_has_its_own_workspace(
    engine: durable_sandbox.Engine, local: Hooked
) -> None:
    await source(engine)
    executed = len(local.calls("execute"))
    forked = await engine.fork("src", after_call=45, count=4)
    assert len(local.calls("execute")) - executed == 5  # one replay for the four
    logs = [await workspace_log(engine, local, f) for f in forked.run_ids]
    assert logs == [expected_log(45)] * 4
    handles = {SessionState.derive("sandbox", await engine.history(f)).handle.id for f in forked.run_ids}  # type: ignore[union-attr]
    assert len(handles) == 4
    await finish(engine, *forked.run_ids, "src")


async def test_the_forks_after_the_first_are_made_at_the_same_time(
    engine: durable_sandbox.Engine, local: Hooked
) -> None:
    """Forks 2-4 each take their own snapshot only once all three are taking it: made one after another, the
    second would wait for the others alone and time out."""
    await source(engine)
    arrived, all_three = [0], asyncio.Event()

    async def hold(handle: SandboxHandle, op: str) -> None:
        arrived[0] += 1
        if arrived[0] == 4:
            all_three.set()
        if arrived[0] > 1:  # the first is the first fork's own snapshot, the others restore from
            await asyncio.wait_for(all_three.wait(), 10)

    local.before_snapshot = hold
    forked = await engine.fork("src", after_call=45, count=4)
    assert [await workspace_log(engine, local, f) for f in forked.run_ids] == [expected_log(45)] * 4
    await finish(engine, *forked.run_ids, "src")


async def test_one_of_the_concurrent_forks_failing_undoes_every_fork_of_the_call(
    engine: durable_sandbox.Engine, local: Hooked
) -> None:
    await source(engine)
    runs_before = {r.run_id for r in await engine.runs()}
    arrived = [0]

    async def fail_third(handle: SandboxHandle, op: str) -> None:
        arrived[0] += 1
        if arrived[0] == 3:
            raise RuntimeError("snapshot store down (test)")

    local.before_snapshot = fail_third
    with pytest.raises(RuntimeError, match="snapshot store down"):
        await engine.fork("src", after_call=45, count=4)
    assert {r.run_id for r in await engine.runs()} == runs_before  # (the teardown: no sandbox or snapshot left)
    local.before_snapshot = None
    await finish(engine, "src")


async def test_a_diverging_replay_fails_the_fork_with_expected_and_actual_and_leaves_nothing(
    engine: durable_sandbox.Engine, local: Hooked
) -> None:
    await source(engine, calls=12, every=10, clock_at=11)
    runs_before = {r.run_id for r in await engine.runs()}
    with pytest.raises(ForkDiverged) as caught:
        await engine.fork("src", after_call=12, count=3)
    message = str(caught.value)
    assert "Expected (the source's journal): exit 0, stdout '" in message and "Actual (replayed): exit 0" in message
    assert {r.run_id for r in await engine.runs()} == runs_before  # no run
    snapshots_of_src = set(local.calls("snapshot"))
    # The source's checkpoints untouched: only the fork's own copy of one was deleted, when the fork was undone.
    assert set(local.calls("delete_snapshot")) == set(local.calls("copy_snapshot")) and not snapshots_of_src & set(
        local.calls("delete_snapshot"))
    assert snapshots_of_src  # (and the teardown finds no sandbox or snapshot of the fork)
    await finish(engine, "src")


async def test_a_fork_point_the_source_never_reached_is_refused_before_anything_is_made(
    engine: durable_sandbox.Engine, local: Hooked
) -> None:
    await source(engine, calls=5, every=0)
    with pytest.raises(ForkRefused, match="completed 5 calls; cannot fork after call 6"):
        await engine.fork("src", after_call=6)
    assert local.calls("restore") == [] and len(local.calls("provision")) == 1
    await finish(engine, "src")


async def test_a_fork_of_a_fork_keeps_the_ids_of_the_calls_it_inherited(
    engine: durable_sandbox.Engine, local: Hooked
) -> None:
    await source(engine, calls=20, every=5)
    (first,) = (await engine.fork("src", after_call=12)).run_ids
    (second,) = (await engine.fork(first, after_call=7)).run_ids
    assert await workspace_log(engine, local, second) == expected_log(7)
    rows = await engine.history(second)
    assert rows[0].meta is not None and rows[0].meta["lineage"] == [[7, "src"], [7, first]]
    await finish(engine, second, first, "src")


@pytest.mark.parametrize("order", list(itertools.permutations(["src", "f1", "f2"])))
async def test_deleting_source_and_forks_in_any_order_deletes_every_snapshot_once_and_none_still_needed(
    engine: durable_sandbox.Engine, local: Hooked, order: tuple[str, ...]
) -> None:
    """Each fork takes its own snapshot first (sandboxes/fork.py): f1 is built from the source's checkpoint at
    40, f2 from f1's own at 45. Whatever is deleted first, the runs left keep every snapshot they name, no
    run names a snapshot of another's once its fork is made, and each snapshot is deleted exactly once."""
    await source(engine)
    await engine.fork("src", after_call=45, count=2, run_ids=["f1", "f2"])
    taken = local.calls("snapshot") + local.calls("copy_snapshot")  # each fork restores from a copy of its own
    assert len(local.calls("copy_snapshot")) == 2
    for run_id in order:
        await engine.delete(run_id, force=True)
        for left in set(order) - set(order[: order.index(run_id) + 1]):
            st = SessionState.derive("sandbox", await engine.history(left))
            assert not [c for c in st.checkpoints if c.borrowed], f"{left} still names a borrowed snapshot"
            for cp in st.checkpoints:
                assert cp.snapshot_id not in local.calls("delete_snapshot"), f"{left}'s {cp.snapshot_id} deleted"
    deleted = local.calls("delete_snapshot")
    assert sorted(deleted) == sorted(set(taken)), "every snapshot deleted exactly once"


async def test_the_fork_journal_names_no_sandbox_or_snapshot_of_the_source_as_its_own(
    engine: durable_sandbox.Engine, local: Hooked
) -> None:
    await source(engine, calls=25, every=10)
    src_state = SessionState.derive("sandbox", await engine.history("src"))
    (fork,) = (await engine.fork("src", after_call=22)).run_ids
    st = SessionState.derive("sandbox", await engine.history(fork))
    assert st.handle is not None and src_state.handle is not None and st.handle.id != src_state.handle.id
    assert {c.snapshot_id for c in st.checkpoints}.isdisjoint({c.snapshot_id for c in src_state.checkpoints})
    assert fork_journal.lineage({r.op_id: r for r in await engine.history(fork)}) == [(22, "src")]
    await finish(engine, fork, "src")


def test_dsb_fork_makes_k_forks_and_resume_continues_them_from_call_n(home: Path) -> None:
    from tests.dsb import dsb

    ran = dsb("run", "tests.unit.fork_support:counter", "--input", '{"calls": 6, "every": 2}', "--run-id", "src")
    assert ran.exit_code == 3, ran.output  # waiting on "done", its sandbox and checkpoints live
    made = dsb("-o", "json", "fork", "src", "--after", "3", "--count", "2")
    assert made.exit_code == 0, made.output
    doc = json.loads(made.stdout)
    assert (doc["source"], doc["afterCall"], doc["session"], len(doc["runs"])) == ("src", 3, "sandbox", 2)
    assert doc["restoredFrom"] is not None  # the checkpoint after call 2
    for fork in doc["runs"]:
        assert dsb("signal", fork, "done", "true", "--resume").exit_code == 0
        shown = json.loads(dsb("-o", "json", "inspect", fork).stdout)
        assert shown["result"]["counts"] == ["1", "2", "3", "4", "5", "6"], shown
    refused = dsb("fork", "src", "--after", "7")
    assert refused.exit_code != 0 and "completed 6 calls; cannot fork after call 7" in refused.output
    assert dsb("signal", "src", "done", "true", "--resume").exit_code == 0


def test_the_docs_fork_commands_and_code_work(tmp_path: Path) -> None:
    """docs/forks.md: its workflow saved as forkdemo.py, its commands as written (the run waits: exit 3; the
    forks are made; the resumed one waits on done with its tail's count), then its Python code."""
    import re
    import shlex
    import subprocess
    import sys

    from tests.docs_commands import FORKS, ROOT, commands_run_by
    from tests.dsb import dsb

    doc = (ROOT / "docs" / "forks.md").read_text()
    code = re.findall(r"```python\n(.*?)```", doc, re.S)
    (tmp_path / "forkdemo.py").write_text(code[0])
    (tmp_path / "fork_api.py").write_text(code[1])
    home = tmp_path / "home"
    commands = commands_run_by(FORKS, "docs/forks.md")
    assert [shlex.split(c.text)[1] for c in commands] == ["run", "fork", "fork"]
    ran = [dsb(*shlex.split(c.text)[1:], home=home, cwd=tmp_path) for c in commands]
    assert [r.returncode for r in ran] == [3, 0, 0], [r.output for r in ran]
    made = [line.split()[0] for line in ran[1].stdout.splitlines() if "fork of base after call 3: pending" in line]
    assert len(made) == 2, ran[1].stdout
    assert "fork of base after call 3: waiting" in ran[2].stdout, ran[2].stdout
    # `dsb run` hibernated the waiting run on exit (a snapshot, the sandbox destroyed): its checkpoints were kept.
    forked = [r for r in json.loads(dsb("-o", "json", "runs", home=home).stdout) if r["runId"] not in ("base", *made)]
    shown = dsb("history", forked[0]["runId"], home=home).stdout
    assert "sandbox/snapshot/borrowed-2" in shown and "fresh" not in shown, shown
    api = subprocess.run([sys.executable, "fork_api.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "DURABLE_SANDBOX_HOME": str(home)}, check=False)
    assert api.returncode == 0, api.stderr
    assert "restored from lsnap-" in api.stdout and api.stdout.count(" waiting") == 2, api.stdout


def child(db: Path, *args: str, fault: str | None = None) -> int:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DURABLE_SANDBOX_FAULT"}
    if fault is not None:
        env["DURABLE_SANDBOX_FAULT"] = fault
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "tests.unit.fork_child", str(db), *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    return done.returncode


@pytest.mark.parametrize("fault", [
    "provisioned:sandbox/restore/1",  # the fork's sandbox made, not yet journaled
    "snapshot-recorded:sandbox/snapshot/45",  # its own snapshot recorded, the borrowed one not yet let go
    "fork-ready:f1",  # made, not yet runnable
])
@pytest.mark.parametrize("source_first", [True, False])
async def test_a_fork_killed_half_way_is_never_driven_and_deleting_it_and_its_source_in_either_order_leaks_nothing(
    engine: durable_sandbox.Engine, local: Hooked, db: Path, fault: str, source_first: bool
) -> None:
    """The maker of a fork is SIGKILLed at a fault point; the half-made fork waits on nothing (no worker drives
    it) and its source's checkpoints are untouched. Then source and fork are deleted, each in a child process
    SIGKILLed at its first snapshot deletion and deleted again: the ``local`` fixture finds no sandbox, snapshot or
    lease left, and no snapshot of the source's is deleted before the source is."""
    import signal

    await source(engine)
    src_snapshots = {c.snapshot_id for c in SessionState.derive("sandbox", await engine.history("src")).checkpoints}
    assert child(db, "fork", "src", "45", "f1", fault=fault) == -signal.SIGKILL
    assert (await engine.inspect("f1")).status == "waiting"
    assert await engine.worker(idle_exit=True) == []  # nothing runnable: the half-made fork is not driven
    assert src_snapshots <= snapshots_on_disk(local), "a checkpoint of the source was deleted by its fork"
    for run_id in (["src", "f1"] if source_first else ["f1", "src"]):
        first = "sandbox/snapshot/10/delete" if run_id == "src" else "sandbox/snapshot/45/delete"
        killed = child(db, "delete", run_id, fault=f"snapshot-deleted:{first}")
        assert killed == -signal.SIGKILL or run_id == "f1", "the source's delete did not reach its fault point"
        if await engine.store.get_run(run_id) is not None:
            assert child(db, "delete", run_id) == 0
        if run_id == "f1" and not source_first:
            assert src_snapshots <= snapshots_on_disk(local), "the fork's deletion deleted a snapshot of the source"
    assert [r.run_id for r in await engine.runs()] == []
    assert snapshots_on_disk(local) == set()


def snapshots_on_disk(local: Hooked) -> set[str]:
    return {p.stem for p in local.inner.snapshots_dir.glob("*.tar")}


def test_dsb_run_fork_of_runs_a_new_tail_from_call_n_in_the_restored_workspace(home: Path) -> None:
    from tests.dsb import dsb

    ran = dsb("run", "tests.unit.fork_support:counter", "--input", '{"calls": 25, "every": 10}', "--run-id", "src")
    assert ran.exit_code == 3, ran.output
    forked = dsb("-o", "json", "run", "tests.unit.fork_support:tail", "--fork-of", "src", "--after", "23",
                 "--input", '{"calls": 26, "from": 23}', "--run-id", "new-tail")
    assert forked.exit_code == 0, forked.output
    doc = json.loads(forked.stdout)
    assert doc["status"] == "succeeded" and doc["result"]["log"] == expected_log(23) + "tail23\ntail24\ntail25\n"
    diverging = dsb("run", "tests.unit.fork_support:tail", "--fork-of", "src", "--after", "23",
                    "--input", '{"calls": 26, "from": 20}')
    assert diverging.exit_code != 0 and "NonDeterminism" in diverging.output, diverging.output
    assert dsb("signal", "src", "done", "true", "--resume").exit_code == 0


async def test_a_fork_honours_on_replay_skip_is_not_executed_and_ask_waits_for_its_answer(
    engine: durable_sandbox.Engine, local: Hooked
) -> None:
    """Call 13 is journaled ask, call 14 skip: the fork at 15 restores the checkpoint at 10; 13 waits for
    ``replay:<op>`` before anything is made; answered rerun, it is replayed, and 14 is not executed again (its
    line is missing from the fork's workspace); the run goes on from call 15."""
    await source(engine, calls=20, every=10, policies={"13": "ask", "14": "skip"})
    forked = await engine.fork("src", after_call=15)
    (fork,) = forked.run_ids
    (ask,) = forked.waiting_for[fork]
    assert ask.startswith("replay:sandbox/dsv1_")
    state = await engine.resume(fork)
    assert state.status == "waiting" and [c.id for c in state.pending_callbacks] == [ask]
    await engine.signal(fork, ask, "rerun")
    state = await engine.resume(fork)
    assert state.status == "waiting" and [c.id for c in state.pending_callbacks] == ["done"]
    lines = (await workspace_log(engine, local, fork)).splitlines()
    assert lines[:15] == [*[str(i) for i in range(14)], "15"]
    await finish(engine, fork, "src")
