"""`dsb --store postgresql://...` (and $DSB_STORE) for the local commands and `dsb worker`, as processes: runs on
the PostgreSQL test server, two workers sharing the work without a run done twice, a server restart under a
running `dsb run`, and a password that never shows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import durable_sandbox.stores.postgres_connection as postgres_connection
from durable_sandbox.cli.main import cli
from tests.postgres.server import PostgresServer
from tests.unit.process_support import pids_with_env

ROOT = Path(__file__).resolve().parents[2]
DSB = str(Path(sys.executable).parent / "dsb")
FLOWS = "tests.postgres.flows"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "DURABLE_SANDBOX_HOME": str(tmp_path / "home"), **extra}
    env.pop("DURABLE_SANDBOX_FAULT", None)
    env.pop("DSB_STORE", None)
    return {**env, **extra}


def _dsb(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DSB, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _log_lines(log: Path) -> list[tuple[str, int, int]]:
    return [(run, int(step), int(pid)) for run, step, pid in
            (line.split() for line in log.read_text().splitlines())] if log.exists() else []


def _no_secret(password: str, *outputs: str) -> None:
    for text in outputs:
        assert password not in text, f"the DSN's password was printed:\n{text}"


def test_local_commands_work_on_a_postgresql_store_and_never_print_its_password(
    postgres_server: PostgresServer, postgres_dsn: str, tmp_path: Path
) -> None:
    env = _env(tmp_path)
    password = postgres_server.password
    ran = _dsb(env, "--store", postgres_dsn, "-o", "json", "run", "examples/hello-workflow.yaml")
    assert ran.returncode == 0, ran.stderr
    state = json.loads(ran.stdout)
    assert state["status"] == "succeeded"
    run_id = state["runId"]
    outputs = [ran.stdout, ran.stderr]
    for args in (["runs"], ["inspect", run_id], ["history", run_id], ["logs", run_id]):
        done = _dsb(env, "--store", postgres_dsn, *args)
        assert done.returncode == 0, (args, done.stderr)
        outputs += [done.stdout, done.stderr]
    listed = _dsb(env, "-o", "json", "runs", "--store", postgres_dsn)  # --store after the command too
    assert [r["runId"] for r in json.loads(listed.stdout)] == [run_id]
    # $DSB_STORE instead of --store; running the manifest again continues the same run (nothing re-run).
    again = _dsb(_env(tmp_path, DSB_STORE=postgres_dsn), "-o", "json", "run", "examples/hello-workflow.yaml")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["runId"] == run_id
    history = json.loads(_dsb(env, "--store", postgres_dsn, "-o", "json", "history", run_id).stdout)
    assert len(history) == len(json.loads(_dsb(env, "--store", postgres_dsn, "-o", "json", "history", run_id).stdout))
    assert Counter((h["opId"], h["status"]) for h in history).most_common(1)[0][1] == 1, "an operation ran twice"
    # A command that prints a follow-up command names the store without the password.
    waiting = _dsb(env, "--store", postgres_dsn, "run", "examples.flows.hello_flow:hello", "--input",
                   '{"name": "Bo", "approve": true}', "--run-id", "p1")
    assert waiting.returncode == 3, waiting.stderr
    assert "dsb --store 'postgresql://***@127.0.0.1:" in waiting.stderr
    outputs += [waiting.stdout, waiting.stderr]
    _no_secret(password, *outputs)
    assert _dsb(env, "--store", postgres_dsn, "signal", "p1", "approval", '{"approved": true}').returncode == 0
    resumed = _dsb(env, "--store", postgres_dsn, "-o", "json", "resume", "p1")
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["status"] == "succeeded", resumed.stderr


def test_an_unreachable_or_refusing_server_is_a_usage_error_without_the_password(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    env = _env(tmp_path)
    wrong = postgres_server.dsn().replace(postgres_server.password, "Wr0ng-s3cret-pw")
    refused = _dsb(env, "--store", wrong, "runs")
    assert refused.returncode == 2, refused.stderr
    assert "password authentication failed" in refused.stderr and "Wr0ng-s3cret-pw" not in refused.stderr
    assert "postgresql://***@127.0.0.1" in refused.stderr
    closed = _dsb(env, "--store", "postgresql://u:Wr0ng-s3cret-pw@127.0.0.1:1/db", "runs")
    assert closed.returncode == 2 and "Cannot connect to the PostgreSQL store" in closed.stderr, closed.stderr
    assert "Wr0ng-s3cret-pw" not in closed.stderr + closed.stdout


def test_two_workers_in_two_processes_share_the_runs_and_never_run_one_twice(
    postgres_dsn: str, tmp_path: Path
) -> None:
    env = _env(tmp_path, DSB_STORE=postgres_dsn)
    log = tmp_path / "steps.log"
    runs = [f"shared-{i}" for i in range(6)]
    # Pending runs, created through the store API as another client would.
    _create_pending(postgres_dsn, runs, log)
    workers = [subprocess.Popen([DSB, "-o", "json", "worker", "--until-idle", "--concurrency", "1",
                                 "--poll-interval", "0.05"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    reports = []
    for w in workers:
        out, err = w.communicate(timeout=240)
        assert w.returncode == 0, err
        reports.append([r["runId"] for r in json.loads(out)])
    lines = _log_lines(log)
    assert sorted((run, step) for run, step, _ in lines) == sorted((r, s) for r in runs for s in range(3)), \
        "every step of every run executed exactly once"
    by_pid = Counter(pid for _, _, pid in lines)
    assert len(by_pid) == 2, f"both workers executed steps: {by_pid}"
    assert sorted(reports[0] + reports[1]) == sorted(runs), f"each run executed by one worker: {reports}"
    for run_id in runs:
        state = json.loads(_dsb(env, "-o", "json", "inspect", run_id).stdout)
        assert state["status"] == "succeeded" and state["result"] == {"steps": [0, 1, 2]}, state


def _create_pending(dsn: str, runs: list[str], log: Path) -> None:
    script = (
        "import asyncio, json, sys\n"
        "from durable_sandbox.engine.records import RunRecord\n"
        "from durable_sandbox.stores.postgres import PostgresStore\n"
        "async def main():\n"
        "    store = await PostgresStore.connect(sys.argv[1])\n"
        "    for run_id in json.loads(sys.argv[2]):\n"
        f"        await store.create_run(RunRecord(run_id=run_id, workflow='{FLOWS}:counted', "
        f"workflow_ref='{FLOWS}:counted', input={{'log': sys.argv[3], 'steps': 3, 'share': True}}))\n"
        "    await store.close()\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", script, dsn, json.dumps(runs), str(log)], cwd=ROOT, check=True, timeout=60)


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] == "T"


def _wait(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_server_restart_under_a_running_dsb_run_loses_and_repeats_nothing(
    postgres_server: PostgresServer, postgres_dsn: str, tmp_path: Path, mode: str
) -> None:
    """`dsb run` stops itself right after step s2 committed (the fault point, SIGSTOP); the server restarts
    (cleanly, or as a crash); `dsb run` goes on: its pool's connections are dead, the next commit waits for
    and reconnects to the new server. Every step ran once, and the journal has each operation once."""
    log = tmp_path / "steps.log"
    env = _env(tmp_path, DURABLE_SANDBOX_FAULT="after:s2!SIGSTOP")
    proc = subprocess.Popen([DSB, "--store", postgres_dsn, "-o", "json", "run", f"{FLOWS}:counted", "--run-id", "rs",
                             "--input", json.dumps({"log": str(log), "steps": 6})], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: _stopped(proc.pid) or proc.poll() is not None, "dsb run to reach the fault point")
        assert proc.poll() is None, proc.communicate()
        postgres_server.restart(mode)
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert json.loads(out)["result"] == {"steps": [0, 1, 2, 3, 4, 5]}
    assert [(run, step) for run, step, _ in _log_lines(log)] == [("rs", i) for i in range(6)]
    history = json.loads(_dsb(_env(tmp_path), "--store", postgres_dsn, "-o", "json", "history", "rs").stdout)
    steps = [(h["opId"], h["status"]) for h in history if h["opId"].startswith("s")]
    assert all(n == 1 for n in Counter(steps).values()), f"an operation was recorded twice: {steps}"
    assert {op for op, status in steps if status == "completed"} == {f"s{i}" for i in range(6)}
    assert "unreachable" in err, "the run met the restart (the store waited for the server)"


def test_a_server_down_longer_than_the_store_waits_ends_dsb_run_resumably(
    postgres_server: PostgresServer, postgres_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step stops the server; its result cannot be committed, and after the store's wait (1 s here) `dsb run`
    ends saying how to continue, without the password. Once the server is back and the run's lease has lapsed,
    `dsb resume` finishes the run: the steps before and after ran once; the step in flight ran again (it is
    idempotent here), as its result was never recorded."""
    monkeypatch.setattr(postgres_connection, "OUTAGE_TIMEOUT", 1.0)
    monkeypatch.setenv("DURABLE_SANDBOX_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(ROOT)
    log = tmp_path / "steps.log"
    data = {"log": str(log), "server": str(postgres_server.directory), "marker": str(tmp_path / "stopped")}
    runner = CliRunner()
    try:
        ended = runner.invoke(cli, ["--store", postgres_dsn, "run", f"{FLOWS}:stops_the_server", "--run-id", "down",
                                    "--input", json.dumps(data)])
    finally:
        postgres_server.start()
    assert ended.exit_code == 1, ended.output
    assert "did not answer for 1s" in ended.stderr, ended.stderr
    assert "continue it with `dsb --store 'postgresql://***@127.0.0.1:" in ended.stderr and "resume down`" in ended.stderr
    _no_secret(postgres_server.password, ended.stdout, ended.stderr)
    # The run's lease lapses (it could not be released while the server was down): time passing, made now.
    schema = postgres_dsn.rsplit("schema=", 1)[1]
    postgres_server.sql(f"UPDATE {schema}.runs SET lease_expires_at = 0 WHERE run_id = 'down'")
    resumed = runner.invoke(cli, ["--store", postgres_dsn, "-o", "json", "resume", "down"])
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["result"] == {"steps": [0, 2]}
    assert [(run, step) for run, step, _ in _log_lines(log)] == [("down", 0), ("down", 2)]


def test_dsb_run_detach_hands_the_store_to_its_child_outside_the_command_line(
    postgres_server: PostgresServer, postgres_dsn: str, tmp_path: Path
) -> None:
    """`dsb run --detach` on a PostgreSQL store: the background `dsb run` finishes the run; the URL reaches it in
    $DSB_STORE, never in its argv (which `ps` shows to every user), and its log sits under
    $DURABLE_SANDBOX_HOME, free of the password."""
    env = _env(tmp_path)
    gate = tmp_path / "gate"
    started = _dsb(env, "--store", postgres_dsn, "-o", "json", "run", "--detach", f"{FLOWS}:waits_for_file",
                   "--input", json.dumps({"path": str(gate)}), "--run-id", "bg")
    assert started.returncode == 0, started.stderr
    schema = postgres_dsn.rsplit("schema=", 1)[1]  # unique to this test: finds the child by its environment
    children: list[int] = []

    def child_found() -> bool:
        children[:] = [pid for pid in pids_with_env(schema) if pid != os.getpid()]
        return bool(children)

    _wait(child_found, "the background dsb run")
    for pid in children:
        assert postgres_server.password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), \
            "the store's URL (with its password) is on the background process's command line"
    gate.write_text("open")
    waited = _dsb(env, "--store", postgres_dsn, "-o", "json", "wait", "bg")
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["result"] == "open"
    logs = list((tmp_path / "home").glob("postgres-*.detached.log"))
    assert len(logs) == 1, logs
    _no_secret(postgres_server.password, started.stdout, started.stderr, waited.stdout, logs[0].read_text())
