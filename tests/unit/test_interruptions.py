"""An interruption is not an ending: Ctrl-C (SIGINT) or SIGTERM while `dsb run` drives a sandbox run
leaves the run resumable (sandbox hibernated, lease released, status not running), prints the real run
id, and `dsb resume` then finishes with the same tool results as an uninterrupted run, leaking nothing.

The signal is sent by the process to itself at a named fault point (DURABLE_SANDBOX_FAULT ...!SIGINT):
``before:<call>`` while that call is in flight, ``after:<call>`` at the boundary after it was recorded.
The code-first path (``ctx.sandbox``) is interrupted the way a process shutdown does it: its task is
cancelled without a user cancel.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

import durable_sandbox
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sandboxes.session import derived_operation_id
from tests.dsb import DSB, ROOT, dsb
from tests.unit.sandbox_session_support import Hooked, engine_for

CALLS = [
    {"type": "write_file", "path": "notes.txt", "contents": "one\n"},
    {"type": "shell", "command": "echo two >> notes.txt; cat notes.txt"},
    {"type": "shell", "command": "sleep 0.2; echo three >> notes.txt; wc -l < notes.txt"},
    {"type": "shell", "command": "ls missing; echo four >> notes.txt"},
    {"type": "read_file", "path": "notes.txt"},
]


def manifest(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow", "metadata": {"name": name},
        "spec": {"sandbox": {"provider": "local"}, "snapshotEveryNCalls": 2, "toolCalls": CALLS},
    }))
    return path


def tool_results(state: dict[str, Any]) -> list[tuple[int, str, str]]:
    return [(r["exitCode"], r["stdout"], r["stderr"]) for r in state["result"]["toolResults"]]


def leftovers(home: Path) -> list[Path]:
    return LocalProvider(home).leftovers()


@pytest.mark.parametrize(("sig", "where", "index"), [
    ("SIGINT", "before", 2),   # Ctrl-C while call 2 runs
    ("SIGTERM", "before", 2),  # a shutdown while call 2 runs
    ("SIGINT", "after", 1),    # Ctrl-C right after call 1 was recorded (before its snapshot)
    ("SIGTERM", "after", 3),
])
def test_a_signal_during_dsb_run_keeps_the_run_resumable(tmp_path: Path, sig: str, where: str, index: int) -> None:
    home, store = tmp_path / "home", tmp_path / "runs.db"
    baseline = dsb("-o", "json", "run", str(manifest(tmp_path, "baseline")), "--run-id", "baseline", home=home, store=store, process=True)
    assert baseline.returncode == 0, baseline.stderr
    expected = tool_results(json.loads(baseline.stdout))

    run_id = "interrupted"
    op = derived_operation_id(run_id, "sandbox", index)
    first = dsb("run", str(manifest(tmp_path, "work")), "--run-id", run_id,
                fault=f"{where}:sandbox/{op}!{sig}", home=home, store=store, process=True)
    assert first.returncode == 128 + signal.Signals[sig], first.stdout + first.stderr
    assert f"resume {run_id}" in first.stderr and "resume RUN" not in first.stderr, first.stderr

    listed = dsb("-o", "json", "runs", home=home, store=store, process=True)
    statuses = {r["runId"]: r["status"] for r in json.loads(listed.stdout)}
    assert statuses[run_id] == "pending", "an interrupted run is runnable again, not running"
    history = json.loads(dsb("-o", "json", "history", run_id, home=home, store=store, process=True).stdout)
    ops = [(r["opId"], r["status"]) for r in history]
    assert not any(o.startswith("sandbox/finalize") for o, _ in ops), "an interruption is not an ending"
    provider = LocalProvider(home)
    assert [p.name for p in provider.workspaces_dir.iterdir()] == [], "the sandbox was hibernated"
    assert len(provider.list_snapshots()) == 1, "...into one snapshot"

    resumed = dsb("-o", "json", "resume", run_id, home=home, store=store, process=True)
    assert resumed.returncode == 0, resumed.stderr
    state = json.loads(resumed.stdout)
    assert state["status"] == "succeeded"
    assert tool_results(state) == expected, "the same results as the uninterrupted run"
    assert leftovers(home) == [], "nothing leaked"


# ------------------------------------------------------------------------------------------ code-first


@durable_sandbox.workflow(name="test-interrupt-code-first")
async def code_first(ctx: durable_sandbox.Context, spec: dict[str, Any]) -> dict[str, Any]:
    async with ctx.sandbox("ws", provider="local", snapshot_every=2) as sbx:
        await sbx.write_file("a.txt", "a\n")
        await sbx.shell("echo b >> a.txt")
        await sbx.shell(f"echo started > {spec['flag']}; while [ ! -e {spec['go']} ]; do sleep 0.05; done; "
                        "echo c >> a.txt")
        out = await sbx.read_file("a.txt")
    return {"out": out.stdout}


async def test_cancelling_the_task_of_a_code_first_run_hibernates_instead_of_finalizing(tmp_path: Path) -> None:
    home = Path(os.environ["DURABLE_SANDBOX_HOME"])
    provider = Hooked(LocalProvider(home))
    flag, go = tmp_path / "started", tmp_path / "go"
    engine = engine_for(tmp_path / "runs.db", {"local": provider})
    try:
        task = asyncio.create_task(engine.run(code_first, {"flag": str(flag), "go": str(go)}, run_id="cf"))
        while not flag.exists():  # the third call is in flight
            await asyncio.wait([task], timeout=0.02)
            assert not task.done(), task
        task.cancel()  # what asyncio.run does on Ctrl-C, or a server on shutdown: not a user cancel
        with pytest.raises(asyncio.CancelledError):
            await task
        state = await engine.inspect("cf")
        assert state.status == "pending"
        rows = await engine.history("cf")
        assert not [r for r in rows if r.op_id.startswith("ws/finalize")]
        assert [p.name for p in provider.inner.workspaces_dir.iterdir()] == [], "hibernated, not left running"
        go.touch()
        state = await engine.resume("cf")
    finally:
        await engine.aclose()
    assert state.status == "succeeded", state.error
    assert state.result == {"out": "a\nb\nc\n"}, "the abandoned call ran again, once, in the restored workspace"
    assert provider.inner.leftovers() == []


# ------------------------------------------------------------------------------------------ failed, then retried


def _fail_once(flag: str) -> str:
    if not os.path.exists(flag):
        with open(flag, "w") as f:
            f.write("failed once\n")
        raise RuntimeError("a step inside the sandbox block failed")
    return "ok"


@durable_sandbox.workflow(name="test-interrupt-fails-inside")
async def fails_inside(ctx: durable_sandbox.Context, spec: dict[str, Any]) -> dict[str, Any]:
    async with ctx.sandbox("ws", provider="local", snapshot_every=2) as sbx:
        await sbx.write_file("a.txt", "a\n")
        await sbx.shell("echo b >> a.txt")
        await sbx.shell("echo c >> a.txt; wc -l < a.txt")
        verdict = await ctx.step("check", _fail_once, spec["flag"])
        await sbx.shell("echo d >> a.txt")
        out = await sbx.read_file("a.txt")
    return {"verdict": verdict, "out": out.stdout, "results": [r["stdout"] for r in sbx.result()["toolResults"]]}


async def test_a_run_failed_inside_a_sandbox_block_is_retried_into_a_rebuilt_sandbox(tmp_path: Path) -> None:
    home = Path(os.environ["DURABLE_SANDBOX_HOME"])
    provider = Hooked(LocalProvider(home))
    engine = engine_for(tmp_path / "runs.db", {"local": provider})
    try:
        failed = await engine.run(fails_inside, {"flag": str(tmp_path / "flag")}, run_id="fi")
        assert failed.status == "failed" and "failed" in str(failed.error)
        assert provider.inner.leftovers() == [], "a failed run leaks nothing, retried or not"
        state = await engine.resume("fi")  # documented as a retry
        rows = await engine.history("fi")
    finally:
        await engine.aclose()
    assert state.status == "succeeded", state.error
    assert state.result == {"verdict": "ok", "out": "a\nb\nc\nd\n",
                            "results": ["wrote a.txt 2 bytes", "", "3\n", "", "a\nb\nc\nd\n"]}
    [rebuild] = [r for r in rows if r.kind == "sandbox.restore" and r.status == "completed"]
    assert rebuild.meta["reason"] == "resume" and rebuild.meta["snapshotId"] is None
    assert rebuild.meta["replayed"] == [f"ws/{derived_operation_id('fi', 'ws', i)}" for i in range(3)], (
        "the failed attempt's calls were replayed into a fresh sandbox, outcomes checked")
    assert provider.inner.leftovers() == []


# ------------------------------------------------------------------------------------------ dsb worker


async def test_sigterm_to_dsb_worker_hibernates_its_runs_and_leaves_them_pending(tmp_path: Path) -> None:
    """A rolling update sends SIGTERM to the process driving many runs: each stays resumable."""
    home, store = Path(os.environ["DURABLE_SANDBOX_HOME"]), tmp_path / "runs.db"
    flag, go = tmp_path / "in-flight", tmp_path / "go"
    calls = [*CALLS[:2], {"type": "shell", "command": f"echo in > {flag}; while [ ! -e {go} ]; do sleep 0.05; done; "
                                                    "echo gated >> notes.txt"}, CALLS[4]]
    engine = engine_for(store, {"local": LocalProvider(home)})
    try:
        await engine.create("sandbox-agent", {"toolCalls": calls, "snapshotEveryNCalls": 2}, run_id="served")
    finally:
        await engine.aclose()
    env = {**os.environ, "DURABLE_SANDBOX_HOME": str(home)}
    env.pop("DURABLE_SANDBOX_FAULT", None)
    worker = await asyncio.create_subprocess_exec(
        DSB, "--store", str(store), "worker", "--poll-interval", "0.05", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        while not flag.exists():  # the gated call is in flight
            assert worker.returncode is None, await worker.communicate()
            await asyncio.sleep(0.02)
        worker.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(worker.communicate(), 120)
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    assert worker.returncode == 0, err.decode()
    state = json.loads(dsb("-o", "json", "inspect", "served", home=home, store=store, process=True).stdout)
    assert state["status"] == "pending", "back to runnable, not running and not finalized"
    assert not [o for o in state["operations"] if o["opId"].startswith("sandbox/finalize")]
    provider = LocalProvider(home)
    assert [p.name for p in provider.workspaces_dir.iterdir()] == [], "its sandbox was hibernated"
    go.touch()
    resumed = dsb("-o", "json", "resume", "served", home=home, store=store, process=True)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["result"]["toolResults"][-1]["stdout"] == "one\ntwo\ngated\n"
    assert provider.leftovers() == []
