"""Issue 36 item 2: rewinding a Sandbox's session in place (sessions/rewind.py). ``rewind(to_call=N)`` journals the
calls after N as rewound (their records stay), deletes the checkpoints holding them, replaces the live sandbox by
one restored from the newest snapshot at or before N (or fresh) with the calls up to N replayed and their outcomes
checked, and the next call goes at N under an operation id of its own (a rewound one is refused)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sandboxes.rewind_journal import rewind_of
from durable_sandbox.sandboxes.session import ReconstructionError, SessionState
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.journal import SESSION, calls_run_id
from durable_sandbox.sessions.models import RewindAnswer, RewindRequest, ShellRequest
from durable_sandbox.sessions.rebuild import REBUILD
from durable_sandbox.sessions.service import SessionService
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import NAMESPACE, FakeGate, local_gate, service, serving_call_api


class Died(BaseException):
    """The operator process dying at a point (nothing on the way handles it)."""


class DyingDeletes(LocalProvider):
    """A LocalProvider that dies once when asked to delete a snapshot (the snapshot deleted first)."""

    die = False

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await super().delete_snapshot(snapshot_id)
        if self.die:
            self.die = False
            raise Died


def shell(op: str, command: str) -> ShellRequest:
    return ShellRequest(operationId=op, command=command)


async def setup(tmp_path: Path, every: int, provider: LocalProvider | None = None) -> tuple[FakeGate, SqliteStore, SessionService]:
    gate = await local_gate(tmp_path / "home", provider)
    store = SqliteStore(tmp_path / "runs.db")
    gate.store, gate.snapshot_every = store, every
    return gate, store, service(store, gate)


async def lines(svc: SessionService, *ops: str, command: str = "echo {i} >> notes.txt") -> None:
    for op in ops:
        await svc.call("good-token", NAMESPACE, "box", shell(op, command.format(i=op)))


async def rewind(svc: SessionService, to_call: int, token: str = "good-token") -> RewindAnswer:
    return await svc.rewind(token, NAMESPACE, "box", RewindRequest(toCall=to_call))


def notes(gate: FakeGate) -> list[str]:
    path = Path(gate.handle.metadata["workspace"]) / "notes.txt"
    return path.read_text().splitlines() if path.exists() else []


async def rows(store: SqliteStore) -> list[OperationRecord]:
    return await store.load_journal(calls_run_id("uid-1"))


def snapshots_taken(journal: list[OperationRecord]) -> dict[str, str]:
    """snapshot op id -> the provider's snapshot id, of every snapshot taken (deleted or not)."""
    return {r.op_id: r.result["snapshotId"] for r in journal if r.kind == "sandbox.snapshot" and r.status == "completed"}


async def test_rewind_restores_the_newest_snapshot_at_or_before_n_replays_up_to_n_and_continues_at_n(tmp_path: Path) -> None:
    gate, store, svc = await setup(tmp_path, every=3)
    calls = [f"c{i}" for i in range(8)]
    await lines(svc, *calls)  # checkpoint after 6 calls (the one after 3 superseded)
    stale = gate.handle
    answer = await rewind(svc, 7)
    assert answer.rewound == ["c7"] and answer.toCall == 7
    after_six = snapshots_taken(await rows(store))["calls/snapshot/6"]
    assert gate.replacements == [(stale.id, after_six)]  # the stale sandbox replaced from the snapshot after 6 calls
    assert answer.replayed == ["c6"] and answer.sandboxId == gate.handle.id != stale.id
    assert notes(gate) == calls[:7]
    await lines(svc, "n7", "n8")
    assert notes(gate) == [*calls[:7], "n7", "n8"]
    journal = await rows(store)
    assert [r.status for r in journal if r.op_id == "calls/c7"] == ["started", "completed"]  # never deleted
    state = SessionState.derive(SESSION, journal)
    assert [state.calls[i][0] for i in sorted(state.calls)] == [f"calls/{op}" for op in [*calls[:7], "n7", "n8"]]
    assert state.rewound == {"calls/c7"}
    assert gate.shown == [(7, ["c7"])]  # status.lastRewind


async def test_rewind_below_every_snapshot_deletes_them_and_rebuilds_a_fresh_sandbox(tmp_path: Path) -> None:
    gate, store, svc = await setup(tmp_path, every=3)
    await lines(svc, *(f"c{i}" for i in range(7)))
    taken = snapshots_taken(await rows(store))
    answer = await rewind(svc, 2)
    assert answer.rewound == ["c2", "c3", "c4", "c5", "c6"] and answer.replayed == ["c0", "c1"]
    assert gate.replacements[-1][1] is None  # no snapshot at or before call 2: provisioned fresh
    assert not any(gate.provider._snapshot_path(s).exists() for s in taken.values())  # none left behind
    assert notes(gate) == ["c0", "c1"]
    # New checkpoints take ids of their own (the rewound ones' are taken): one after 3 calls again, then 6.
    await lines(svc, *(f"n{i}" for i in range(2, 7)))
    again = {op: s for op, s in snapshots_taken(await rows(store)).items() if op not in taken}
    assert sorted(again) == ["calls/snapshot/3~r1", "calls/snapshot/6~r1"]
    assert gate.provider._snapshot_path(again["calls/snapshot/6~r1"]).exists()
    assert notes(gate) == ["c0", "c1", "n2", "n3", "n4", "n5", "n6"]


async def test_a_rewound_operation_id_is_refused_and_a_kept_one_still_answers_from_the_journal(tmp_path: Path) -> None:
    gate, _, svc = await setup(tmp_path, every=0)
    await lines(svc, "a", "b", "c")
    await rewind(svc, 1)
    with pytest.raises(CallRefused) as refused:
        await lines(svc, "b")
    assert refused.value.status == 409 and "rewound" in refused.value.body.what
    [kept] = [await svc.call("good-token", NAMESPACE, "box", shell("a", "echo a >> notes.txt"))]
    assert kept.replayed
    assert notes(gate) == ["a"]


async def test_rewind_is_refused_past_the_calls_completed_and_to_who_may_not_update_the_sandbox(tmp_path: Path) -> None:
    gate, _, svc = await setup(tmp_path, every=0)
    await lines(svc, "a", "b")
    with pytest.raises(CallRefused) as past:
        await rewind(svc, 3)
    assert past.value.status == 409 and "between 0 and 2" in past.value.body.do
    svc.auth.rights["bob"] = {(NAMESPACE, "box")}  # type: ignore[attr-defined]  # bob may call, not update
    with pytest.raises(CallRefused) as denied:
        await rewind(svc, 1, token="other-token")
    assert denied.value.status == 403
    assert notes(gate) == ["a", "b"]
    same = gate.handle
    nothing = await rewind(svc, 2)  # to where it is: nothing rewound, nothing written, the sandbox kept
    assert nothing.rewound == [] and gate.handle is same


async def test_a_crash_before_the_rewind_is_committed_leaves_the_session_as_it_was(tmp_path: Path) -> None:
    provider = DyingDeletes(tmp_path / "home")
    gate, store, svc = await setup(tmp_path, every=2, provider=provider)
    await lines(svc, "a", "b", "c")
    provider.die = True
    with pytest.raises(Died):
        await rewind(svc, 1)  # the checkpoint after 2 calls deleted, the rewind never committed
    assert not any(rewind_of(r) for r in await rows(store))
    svc = service(store, gate)  # the operator started again
    await lines(svc, "d")
    assert notes(gate) == ["a", "b", "c", "d"]
    again = await rewind(svc, 1)  # asked again: done
    assert again.rewound == ["b", "c", "d"] and notes(gate) == ["a"]


async def test_a_crash_after_the_rewind_is_committed_is_finished_by_the_next_call(tmp_path: Path) -> None:
    gate, store, svc = await setup(tmp_path, every=0)
    await lines(svc, "a", "b")

    async def died(_ref: Any, _lost: str) -> Any:
        raise Died  # the stale sandbox destroyed; the operator dies waiting for its replacement

    replaced, gate.replaced = gate.replaced, died  # type: ignore[method-assign]
    with pytest.raises(Died):
        await rewind(svc, 1)
    gate.replaced = replaced  # type: ignore[method-assign]
    svc = service(store, gate)
    await lines(svc, "c")
    assert notes(gate) == ["a", "c"]
    assert [r.result for r in await rows(store) if r.op_id.startswith(REBUILD + "/") and r.status == "completed"][-1] \
        == {"replayed": ["a"]}


async def test_a_diverging_replay_fails_the_rewind_with_expected_and_actual_and_an_earlier_rewind_recovers(
        tmp_path: Path) -> None:
    gate, _, svc = await setup(tmp_path, every=0)
    await lines(svc, "a")
    await svc.call("good-token", NAMESPACE, "box", shell("clock", "date +%s%N >> notes.txt; date +%s%N"))
    await lines(svc, "b")
    with pytest.raises(ReconstructionError) as diverged:
        await rewind(svc, 2)  # replaying the clock call gives another output
    assert "clock" in str(diverged.value)
    # The rewind was committed (b rewound) before its replay diverged: the session stays rewound, and its calls
    # are refused the same way until it is rewound before the clock call, which works.
    with pytest.raises(ReconstructionError):
        await lines(svc, "c")
    answer = await rewind(svc, 1)
    assert answer.rewound == ["clock"] and notes(gate) == ["a"]
    await lines(svc, "c")
    assert notes(gate) == ["a", "c"]


async def test_the_call_api_serves_rewind(tmp_path: Path) -> None:
    async with serving_call_api(tmp_path) as (port, gate):
        url = f"http://127.0.0.1:{port}/v1/namespaces/{NAMESPACE}/sandboxes/box"
        headers = {"Authorization": "Bearer good-token"}
        async with httpx.AsyncClient(headers=headers) as http:
            for op in ("a", "b"):
                done = await http.post(f"{url}/shell", json={"operationId": op, "command": f"echo {op} >> notes.txt"})
                assert done.status_code == 200
            answer = await http.post(f"{url}/rewind", json={"toCall": 1})
            assert answer.status_code == 200 and answer.json()["rewound"] == ["b"]
            bad = await http.post(f"{url}/rewind", json={"toCall": -1})
            assert bad.status_code == 400 and "toCall" in bad.json()["error"]["what"]
        assert notes(gate) == ["a"]


async def test_the_python_client_and_dsb_sandbox_rewind(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from durable_sandbox.cli.main import cli
    from durable_sandbox.client import AsyncSandboxClient

    async with serving_call_api(tmp_path) as (port, gate):
        url = f"http://127.0.0.1:{port}"
        async with AsyncSandboxClient.attach("box", namespace=NAMESPACE, url=url, token="good-token") as box:
            for op in ("a", "b", "c"):
                await box.run(f"echo {op} >> notes.txt", operation_id=op)
            done = await box.rewind(2)
            assert done["rewound"] == ["c"] and done["toCall"] == 2
            await box.run("echo d >> notes.txt", operation_id="d")
        assert notes(gate) == ["a", "b", "d"]
        result = await asyncio.to_thread(CliRunner().invoke, cli, [
            "-n", NAMESPACE, "sandbox", "rewind", "box", "--to-call", "1", "--url", url, "--token", "good-token"])
        assert result.exit_code == 0, result.output
        assert "rewound to after call 1: 2 call(s) rewound (b, d)" in result.output
        assert notes(gate) == ["a"]


async def test_the_history_shows_the_rewind_and_keeps_the_rewound_calls(tmp_path: Path) -> None:
    from durable_sandbox.cli.render import op_detail

    _, store, svc = await setup(tmp_path, every=0)
    await lines(svc, "a", "b", "c")
    await rewind(svc, 1)
    journal = await rows(store)
    [done] = [r for r in journal if rewind_of(r) is not None]
    assert op_detail(done.kind, done.status, done.result, None, done.meta) == \
        "rewound to after call 1: 2 call(s) rewound (b, c)"
    assert {r.op_id for r in journal} >= {"calls/a", "calls/b", "calls/c"}


def test_the_docs_rewind_code_and_commands_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/forks.md, "Rewind a Sandbox's session": its Python code, then its commands, as written but for the
    Sandbox's name (the test's call API serves Sandbox box)."""
    asyncio.run(_docs_rewind(tmp_path, monkeypatch))


async def _docs_rewind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib
    import io
    import os
    import re
    import subprocess
    import sys

    from tests.docs_commands import REWIND, ROOT, commands_run_by

    doc = (ROOT / "docs" / "forks.md").read_text()
    [code] = [c for c in re.findall(r"```python\n(.*?)```", doc, re.S) if ".rewind(" in c]
    commands = commands_run_by(REWIND, "docs/forks.md")
    assert len(commands) == 2
    async with serving_call_api(tmp_path) as (port, gate):
        monkeypatch.setenv("DSB_SESSION_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("DSB_SESSION_TOKEN", "good-token")
        printed = io.StringIO()

        def run_code() -> None:
            with contextlib.redirect_stdout(printed):
                exec(compile(code.replace('"dev-box"', '"box"'), "forks.md", "exec"), {})

        await asyncio.to_thread(run_code)
        shown = printed.getvalue()
        assert "'rewound': ['step-5', 'step-6', 'step-7']" in shown, shown
        assert shown.rstrip().endswith("step 0\nstep 1\nstep 2\nstep 3\nstep 4\nanother way"), shown
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        ran = [await asyncio.to_thread(subprocess.run, ["bash", "-c", c.text.replace("dev-box", "box")], env=env,
                                       capture_output=True, text=True, timeout=120, check=False) for c in commands]
        assert [r.returncode for r in ran] == [0, 0], [r.stderr for r in ran]
        assert "4 call(s) rewound (step-3, step-4, alt-5, look)" in ran[0].stdout, ran[0].stdout
        assert '"rewound":["step-2"]' in ran[1].stdout, ran[1].stdout
        assert notes(gate) == ["step 0", "step 1"]
