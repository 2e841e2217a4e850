"""A code-first run continued from a directory its module does not import from is not failed: `dsb resume`,
`dsb signal --resume` exit 2 with one line saying which module was needed and how to get it (run from the
project's directory, or PYTHONPATH), and the run stays as it was, resumable from the right place; `dsb
worker` skips it with one warning, runs the others, and gives the run back when it stops."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.engine import RunClient
from durable_sandbox.stores import SqliteStore
from tests.dsb import ROOT, dsb
from tests.unit import cli_flows

MODULE = "dsb_wrongdir_flow"  # only importable from the project directory the test writes
FLOW = '''
import durable_sandbox as ds


@ds.workflow(name="wrongdir-hello")
async def hello(ctx: ds.Context, who: str) -> dict:
    greeting = await ctx.step("greet", lambda: f"hello {who}")
    approved = await ctx.callback("approve", {"greeting": greeting})
    return {"greeting": greeting, "approved": approved}
'''


def not_runnable(status: str) -> str:
    return (
        f"error: Run 'r1' is not runnable in this process: Cannot import module {MODULE!r} for workflow "
        f"'{MODULE}:hello': No module named {MODULE!r}. It was left as it is ({status}), for a process that can "
        f"import module {MODULE!r}: run from the directory it imports from, or with PYTHONPATH set to that "
        f"directory (or the code installed)."
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    (path / f"{MODULE}.py").write_text(FLOW)
    return path


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path


def record(run_id: str = "r1") -> dict[str, Any]:
    """What the store says of the run: what must not change when it is not runnable here."""
    state = json.loads(dsb("-o", "json", "inspect", run_id).stdout)
    return {k: state.get(k) for k in ("status", "error", "attempt", "result", "pendingCallbacks")} | {
        "operations": len(state["operations"])
    }


def waiting_run(project: Path) -> dict[str, Any]:
    started = dsb("run", f"{MODULE}:hello", "--input", '"Ada"', "--run-id", "r1", cwd=project)
    assert started.exit_code == 3, started.output  # waiting on `approve`
    return record()


def test_resume_from_another_directory_leaves_the_run_as_it_was_and_says_how(project: Path, elsewhere: Path) -> None:
    waiting_run(project)
    assert dsb("signal", "r1", "approve", "true").exit_code == 0  # now resuming it executes its code
    before = record()
    result = dsb("resume", "r1", cwd=elsewhere)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [f"{not_runnable('pending')} Then continue it with `dsb resume r1`."]
    assert record() == before, "the run is not failed, nor changed otherwise"
    done = dsb("-o", "json", "resume", "r1", cwd=project)  # as the message says
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["result"] == {"greeting": "hello Ada", "approved": True}


def test_signal_resume_from_another_directory_keeps_the_signal_and_the_run(project: Path, elsewhere: Path) -> None:
    waiting_run(project)
    result = dsb("signal", "r1", "approve", "true", "--resume", cwd=elsewhere)
    assert result.exit_code == 2, result.output
    assert "signalled approve of run r1" in result.stdout
    assert result.stderr.splitlines() == [f"{not_runnable('pending')} Then continue it with `dsb resume r1`."]
    after = record()
    assert after["status"] == "pending" and after["error"] is None, after  # signalled: runnable, not failed
    done = dsb("-o", "json", "resume", "r1", env={"PYTHONPATH": str(project)}, cwd=elsewhere)  # or PYTHONPATH
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["result"] == {"greeting": "hello Ada", "approved": True}


async def create_other(db: Path) -> None:
    store = SqliteStore(db)
    try:
        await RunClient(store).create(cli_flows.doubler, {"x": 4}, run_id="other")
    finally:
        await store.close()


def test_a_worker_skips_a_run_it_cannot_import_runs_the_others_and_gives_it_back(
    project: Path, elsewhere: Path, home: Path
) -> None:
    waiting_run(project)
    assert dsb("signal", "r1", "approve", "true").exit_code == 0  # runnable now: a worker claims it
    before = record()
    asyncio.run(create_other(home / "runs.db"))
    # tests.unit.cli_flows imports from there (the repository root); the project's module does not.
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    served = dsb("worker", "--until-idle", "--poll-interval", "0.05", cwd=elsewhere, env=env)
    assert served.exit_code == 0, served.output
    warnings = [line for line in served.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, served.stderr  # said once, not once per look
    assert " skips run r1: " in warnings[0] and warnings[0].endswith(not_runnable("pending")[len("error: "):])
    assert "worker executed 1 run(s)" in served.stdout, served.stdout
    assert record("other")["status"] == "succeeded"
    assert record() == before
    # Given back when the worker stopped: continued at once from the project, not after the worker's lease.
    done = dsb("resume", "r1", cwd=project)
    assert done.exit_code == 0, done.output
    assert "taking the run over" not in done.output
