"""Issue 35 item 6: a checkpointed agent's tools call the run's sandbox. A tool's calls are named after the tool
call's own op id (``<tool op>/sbx/<k>``); a resumed agent replays committed tools from the journal without making
their calls, and that shifts no other call; concurrent tools' calls run one at a time and a rebuilt sandbox replays
them in their journaled order; a lost sandbox is rebuilt before the agent's next call. No sandbox call runs twice
in one sandbox, and one runs in a replacement only as the restore's journaled replay."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("strands")

import durable_sandbox
from durable_sandbox.engine import RunStatus
from durable_sandbox.providers.contract import SandboxHandle, ToolCall, ToolResult
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.stores import SqliteStore
from durable_sandbox.workflows.agents import DurableAgentRun
from tests.unit.agent_sandbox_support import SESSION, agent_tools_flow, engine, executed, hand_written_loop
from tests.unit.lease_support import wait_for_lease_expiry

ROOT = Path(__file__).resolve().parents[2]
TOOL_CALLS = [  # every sandbox call the agent's tools make, by tool call, in each tool's order
    "coder/tool/1-edit/sbx/1", "coder/tool/1-edit/sbx/2", "coder/tool/2-edit/sbx/1", "coder/tool/2-edit/sbx/2",
    "coder/tool/3-append/sbx/1", "coder/tool/3-append/sbx/2", "coder/tool/3-append/sbx/3", "coder/tool/4-build/sbx/1",
]


async def run_undisturbed(tmp_path: Path, params: dict[str, Any]) -> dict[str, Any]:
    eng = engine(tmp_path / "plain.db", tmp_path / "plain-home", tmp_path / "plain.log")
    try:
        state = await eng.run(agent_tools_flow, params, run_id="plain")
    finally:
        await eng.aclose()
    assert state.status == RunStatus.SUCCEEDED, state.error
    return state.result


async def journal_of(db: Path, run_id: str) -> list[Any]:
    store = SqliteStore(db)
    try:
        return await store.load_journal(run_id)
    finally:
        await store.close()


def replayed_by_restores(rows: list[Any]) -> Counter[str]:
    """How many times each call was replayed into a replacement, as the completed restores say."""
    counts: Counter[str] = Counter()
    for r in rows:
        if r.kind == "sandbox.restore" and r.status == "completed":
            counts.update(op[len(SESSION) + 1:] for op in (r.meta or {}).get("replayed", []))
    return counts


def assert_one_place_per_call(rows: list[Any]) -> None:
    """Every call journaled at one index, every index held by one call, none left out: replayed tools, which
    make no calls, shifted nothing (a rebuilt sandbox replays the calls in the order they ran)."""
    places = {(r.op_id, r.meta["index"]) for r in rows if r.kind == "sandbox.call" and "index" in (r.meta or {})}
    ops = [op for op, _ in places]
    indexes = sorted(i for _, i in places)
    assert len(set(ops)) == len(ops) and indexes == list(range(len(indexes))), sorted(places, key=lambda p: p[1])


def assert_no_call_ran_twice(log: list[dict[str, str]], rows: list[Any]) -> None:
    """No call ran twice in one sandbox; beyond its first run, a call ran only as a restore's journaled replay."""
    pairs = Counter((e["op"], e["sandbox"]) for e in log)
    assert [p for p, n in pairs.items() if n > 1] == []
    runs = Counter(e["op"] for e in log)
    replays = replayed_by_restores(rows)
    assert {op: n - 1 for op, n in runs.items() if n > 1} == {op: n for op, n in replays.items() if n}


def test_a_tools_calls_are_named_after_the_tool_call() -> None:
    from durable_sandbox.sandboxes.call_scope import call_scope, current_call_scope

    assert current_call_scope() is None
    with call_scope("coder/tool/2-edit") as scope:
        assert current_call_scope() is scope
        assert [scope.next_operation_id(), scope.next_operation_id()] == ["coder/tool/2-edit/sbx/1", "coder/tool/2-edit/sbx/2"]
    assert current_call_scope() is None


async def test_undisturbed_run_names_each_tools_calls_after_it_and_runs_each_once(tmp_path: Path) -> None:
    result = await run_undisturbed(tmp_path, {})
    assert result["answer"] == "Done: a and b edited, built."
    assert result["workspace"] == ("== a.txt\nalpha\nmore\n== a.txt.note\nedited a.txt\n== b.txt\nbeta\n"
                                   "== b.txt.note\nedited b.txt\n== history\nappended a.txt\n"
                                   "== out.txt\nalpha\nmore\nbeta\n")
    log = executed(tmp_path / "plain.log")
    agent_ops = [e["op"] for e in log if "/sbx/" in e["op"]]
    assert sorted(agent_ops) == sorted(TOOL_CALLS) and len(set(agent_ops)) == len(agent_ops)
    rows = await journal_of(tmp_path / "plain.db", "plain")
    indexes = {r.op_id[len(SESSION) + 1:]: r.meta["index"] for r in rows
               if r.kind == "sandbox.call" and r.status == "completed"}
    # One call at a time, in the order the sandbox ran them: the indexes are that order, with no gap.
    assert sorted(indexes.values()) == list(range(len(TOOL_CALLS) + 1))
    assert [indexes[e["op"]] for e in log] == list(range(len(log)))


@pytest.mark.parametrize(("fault", "params"), [
    # killed inside tool 3, after its first call was committed; the loss after call 6 replays from scratch,
    # the calls of tools 1 and 2 (replayed from the journal, never re-issued) from their journal records
    ("before:ws/coder/tool/3-append/sbx/2", {"inject_loss_after": 6}),
    # killed while the two concurrent tools run; snapshots every 3 calls, the loss after call 5
    ("before:ws/coder/tool/2-edit/sbx/2", {"inject_loss_after": 5, "snapshot_every": 3}),
])
async def test_killed_mid_run_and_resumed_with_a_loss_no_call_runs_twice(
        tmp_path: Path, fault: str, params: dict[str, Any]) -> None:
    plain = await run_undisturbed(tmp_path, {})
    db, log, home = tmp_path / "runs.db", tmp_path / "effects.jsonl", tmp_path / "home"
    env = {**os.environ, "DURABLE_SANDBOX_FAULT": fault, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(  # noqa: ASYNC221 - the child must finish (be killed) before the test goes on
        [sys.executable, "-m", "tests.unit.agent_sandbox_support", str(db), "killed", str(log), str(home),
         json.dumps(params)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]
    before = executed(log)
    killed_at = fault.split(":", 1)[1][len(SESSION) + 1:]
    assert killed_at not in [e["op"] for e in before]  # killed before the provider ran it

    await wait_for_lease_expiry(str(db), "killed")  # the child is dead; its lease must run out
    eng = engine(db, home, log, worker_id="second-worker")
    try:
        await eng.worker(idle_exit=True, poll_interval=0.05)
        state = await eng.inspect("killed")
    finally:
        await eng.aclose()
    assert state.status == RunStatus.SUCCEEDED, state.error
    assert state.result == plain  # same answer, same workspace as the undisturbed run
    rows = await journal_of(db, "killed")
    everything = executed(log)
    assert_no_call_ran_twice(everything, rows)
    assert_one_place_per_call(rows)
    after = [e["op"] for e in everything[len(before):]]
    assert not set(after) & {e["op"] for e in before} - set(replayed_by_restores(rows))
    assert set(TOOL_CALLS) <= {e["op"] for e in everything}
    assert replayed_by_restores(rows)  # the loss was recovered by replaying calls into a replacement


async def test_a_sandbox_lost_while_the_run_was_down_is_rebuilt_before_the_agents_next_call(tmp_path: Path) -> None:
    plain = await run_undisturbed(tmp_path, {})
    db, log, home = tmp_path / "runs.db", tmp_path / "effects.jsonl", tmp_path / "home"
    env = {**os.environ, "DURABLE_SANDBOX_FAULT": "before:ws/coder/tool/3-append/sbx/1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(  # noqa: ASYNC221 - the child must finish (be killed) before the test goes on
        [sys.executable, "-m", "tests.unit.agent_sandbox_support", str(db), "killed", str(log), str(home), "{}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]
    rows = await journal_of(db, "killed")
    [provisioned] = [r for r in rows if r.op_id == f"{SESSION}/provision" and r.status == "completed"]
    await LocalProvider(home).inject_loss(SandboxHandle.model_validate(provisioned.result))  # lost while down
    before = executed(log)

    await wait_for_lease_expiry(str(db), "killed")
    eng = engine(db, home, log, worker_id="second-worker")
    try:
        await eng.worker(idle_exit=True, poll_interval=0.05)
        state = await eng.inspect("killed")
    finally:
        await eng.aclose()
    assert state.status == RunStatus.SUCCEEDED, state.error
    assert state.result == plain
    rows = await journal_of(db, "killed")
    assert_no_call_ran_twice(executed(log), rows)
    assert_one_place_per_call(rows)
    after = executed(log)[len(before):]
    # The interrupted call found the sandbox gone; every call before it was replayed into a replacement first.
    replayed = [e["op"] for e in after[:len(before)]]
    assert replayed == [e["op"] for e in before]
    assert after[len(before)]["op"] == "coder/tool/3-append/sbx/1"


async def test_a_hand_written_loop_resumed_after_its_tools_were_journaled_makes_no_call_again(tmp_path: Path) -> None:
    eng = engine(tmp_path / "runs.db", tmp_path / "home", tmp_path / "effects.jsonl")
    try:
        first = await eng.run(hand_written_loop, {"inject_loss_after": 4}, run_id="loop")
        again = await eng.resume("loop")  # a finished run: everything from the journal
    finally:
        await eng.aclose()
    assert first.status == RunStatus.SUCCEEDED, first.error
    assert first.result == again.result == {"workspace": "== counter\n0\n1\n2\n"}
    rows = await journal_of(tmp_path / "runs.db", "loop")
    assert_no_call_ran_twice(executed(tmp_path / "effects.jsonl"), rows)
    calls = [r.op_id for r in rows if r.kind == "sandbox.call" and r.status == "completed"]
    assert calls[:2] == [f"{SESSION}/loop/tool/1-write/sbx/1", f"{SESSION}/loop/tool/1-write/sbx/2"]


class Overlaps(LocalProvider):
    """Counts calls executing at once; each yields to the event loop in between, so two unserialized calls overlap."""

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.active = self.most = 0

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        self.active += 1
        self.most = max(self.most, self.active)
        try:
            for _ in range(5):
                await asyncio.sleep(0)  # a yield, not a wait: the other tool's task gets to run here
            return await super().execute(handle, call)
        finally:
            self.active -= 1


@durable_sandbox.workflow(name="tests.agent-sandbox-gather")
async def gathered_tools(ctx: durable_sandbox.Context, params: dict[str, Any]) -> list[str]:
    async with ctx.sandbox(SESSION, provider="local") as sbx:
        run = DurableAgentRun(ctx, "g")

        async def touch(name: str) -> str:
            for k in range(3):
                await sbx.shell(f"echo {k} >> {name}")
            return name

        return list(await asyncio.gather(*(run.tool_call("touch", lambda n=n: touch(n), call_id=n) for n in ("x", "y"))))


async def test_concurrent_tools_calls_run_one_at_a_time_in_the_sandbox(tmp_path: Path) -> None:
    provider = Overlaps(tmp_path / "home")
    eng = durable_sandbox.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": provider})
    try:
        state = await eng.run(gathered_tools, {}, run_id="gather")
    finally:
        await eng.aclose()
    assert state.status == RunStatus.SUCCEEDED, state.error
    assert provider.most == 1
    rows = await journal_of(tmp_path / "runs.db", "gather")
    calls = [r for r in rows if r.kind == "sandbox.call" and r.status == "completed"]
    assert [r.meta["index"] for r in calls] == list(range(6))  # indexes in the order the sandbox ran them
    assert {r.op_id for r in calls} == {f"{SESSION}/g/tool/{n}-touch/sbx/{k}" for n in (1, 2) for k in (1, 2, 3)}
