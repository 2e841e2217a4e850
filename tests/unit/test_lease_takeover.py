"""Leases after a crash, through the real `dsb`: a run whose worker died on this host is taken over by
`dsb resume` at once (not after the lease's TTL); a live worker is never displaced: `dsb resume` exits 4
saying who holds the run and for how long, and `dsb resume --wait` waits for it. `dsb runs` shows a run
whose worker is gone as stale.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.dsb import DSB, ROOT, dsb


def _dsb_cmd(store: Path, *args: str) -> list[str]:
    return [DSB, "--store", str(store), *args]


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "DURABLE_SANDBOX_HOME": str(home)}
    env.pop("DURABLE_SANDBOX_FAULT", None)
    return env


def start(home: Path, store: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(_dsb_cmd(store, *args), cwd=ROOT, env=_env(home), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_file(path: Path, proc: subprocess.Popen[str], deadline: float = 60) -> None:
    # Until a whole line is there, not just the file: a SIGKILL between the file's creation and its write
    # would leave the step's mark unwritten.
    give_up = time.monotonic() + deadline
    while not (path.exists() and path.read_text().endswith("\n")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < give_up, f"{path} never got its line"
        time.sleep(0.02)


def gated_run(tmp_path: Path, run_id: str) -> tuple[tuple[str, ...], Path, Path]:
    flag, go = tmp_path / "entered", tmp_path / "go"
    args = ("run", "tests.unit.cli_flows:gated", "--input", json.dumps({"flag": str(flag), "go": str(go)}),
            "--run-id", run_id)
    return args, flag, go


def statuses(home: Path, store: Path) -> dict[str, tuple[str, bool]]:
    listed = dsb("-o", "json", "runs", home=home, store=store, process=True)
    assert listed.returncode == 0, listed.stderr
    return {r["runId"]: (r["status"], r["stale"]) for r in json.loads(listed.stdout)}


def test_after_sigkill_dsb_resume_takes_the_run_over_at_once(tmp_path: Path, home: Path) -> None:
    store = tmp_path / "runs.db"
    args, flag, go = gated_run(tmp_path, "killed")
    worker = start(home, store, *args)
    try:
        wait_for_file(flag, worker)
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
    finally:
        worker.kill()
        worker.communicate()
    assert statuses(home, store)["killed"] == ("running", True), "shown as stale, not just running"
    go.touch()
    resumed = dsb("resume", "killed", home=home, store=store, process=True)  # immediately: the 30 s lease has not expired
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "run killed succeeded" in resumed.stdout and '"through"' in resumed.stdout
    assert flag.read_text() == "entered\nentered\n", "the interrupted step ran again (at least once), once"


def test_a_live_worker_is_never_displaced_and_resume_wait_waits_for_it(tmp_path: Path, home: Path) -> None:
    store = tmp_path / "runs.db"
    args, flag, go = gated_run(tmp_path, "alive")
    worker = start(home, store, *args)
    waiter = None
    try:
        wait_for_file(flag, worker)
        refused = dsb("resume", "alive", home=home, store=store, process=True)
        assert refused.returncode == 4, refused.stdout + refused.stderr
        assert f"(process {worker.pid} on " in refused.stderr and "its lease runs for another" in refused.stderr
        assert "resume --wait alive" in refused.stderr
        assert statuses(home, store)["alive"] == ("running", False)
        waiter = start(home, store, "resume", "--wait", "alive")
        # The waiter says it waits (on stderr) before the gate opens: read that line first.
        assert waiter.stderr is not None
        assert "waiting for it" in waiter.stderr.readline()
        go.touch()
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, out + err
        out, err = waiter.communicate(timeout=120)
        assert waiter.returncode == 0, out + err
        assert "run alive succeeded" in out
    finally:
        for proc in (worker, waiter):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert flag.read_text() == "entered\n", "the live worker's step ran once; nobody else ran it"
