"""Issue 25: the operator with its journal in PostgreSQL (`dsb operator --journal`, the DSN from the environment as
the chart gives it). The key behaviours of the API-server journal's suite, on a real PostgreSQL server the harness
starts: hello succeeds with the same status, a signal answers an approval, an operator killed mid-run resumes
with no call run twice, deleting a Workflow deletes its run, a PostgreSQL restart mid-run loses and repeats
nothing, and a run deleted from the database mid-run stops instead of starting over (test_trust_states.py's
deleted Journal object, here). The whole operator e2e suite runs on this journal too: tests/e2e/journal_support.py,
docs/testing.md. Side effects are appended to a log outside the sandboxes, one line per execution of a call."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from durable_sandbox.kube.store.journals import namespace_schema
from durable_sandbox.stores.postgres import split_dsn
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    HELLO,
    condition,
    effect_calls,
    event_reasons,
    events,
    local_sandboxes,
    manifest,
    namespace,
    operators,
    status,
    wait_condition,
    wait_event,
    wait_gone,
    wait_in_flight,
)
from tests.e2e.postgres_journal_support import ENV, check_pg_journal, journal_dsn, pg_run
from tests.e2e.sweep_support import local_provider, sweeps_leftovers
from tests.postgres.server import PostgresServer

__all__ = ["journal_dsn", "namespace", "operators"]  # fixtures

def _password(dsn: str) -> str:
    password = urlsplit(dsn).password
    assert password, "the test server's DSN has a password"
    return password


def test_hello_runs_with_its_journal_in_postgres_and_deleting_it_deletes_the_run(
    control_plane: ControlPlane, namespace: str, operators: Any, journal_dsn: str
) -> None:
    op = operators("--allow-local-provider", env={ENV: journal_dsn})
    control_plane.kubectl("apply", "-n", namespace, "-f", str(HELLO))
    wait_condition(control_plane, namespace, "hello", "Succeeded", timeout=120)

    st = status(control_plane, namespace, "hello")
    assert st["phase"] == "Succeeded" and st["calls"] == {"completed": 4, "total": 4}
    reasons = event_reasons(control_plane, namespace, "hello")
    assert "Provisioned" in reasons and "Succeeded" in reasons
    # The journal is in PostgreSQL, not in the API server.
    check_pg_journal(journal_dsn, namespace, st["runId"])
    assert control_plane.kubectl_json("get", "journals.durable-sandbox.dev", "-n", namespace)["items"] == []
    # The password is in no log, status or Event.
    password = _password(journal_dsn)
    assert password not in op.logs()
    assert password not in json.dumps(st) and password not in json.dumps(events(control_plane, namespace, "hello"))
    assert "journal in PostgreSQL" in op.logs()

    control_plane.kubectl("delete", "-n", namespace, "-f", str(HELLO), "--timeout=60s")
    wait_gone(control_plane, namespace, "hello")
    assert "CleanupDone" in event_reasons(control_plane, namespace, "hello")
    assert pg_run(journal_dsn, namespace, st["runId"]) == (None, [])
    assert local_sandboxes(op.home) == []


def test_a_signal_answers_the_approval(
    control_plane: ControlPlane, namespace: str, operators: Any, journal_dsn: str
) -> None:
    operators("--allow-local-provider", "--workflows", "examples.flows", env={ENV: journal_dsn})
    doc = manifest("approve-me", entrypoint="examples.flows.hello_flow:hello", input={"name": "Ada", "approve": True},
                   toolCalls=None, sandbox=None, snapshotEveryNCalls=None)
    control_plane.apply(doc, "-n", namespace)
    wait_condition(control_plane, namespace, "approve-me", "WaitingForSignal")
    st = status(control_plane, namespace, "approve-me")
    assert st["pendingCallbacks"] == [{"id": "approval", "payload": {"question": "Send 'Hello, Ada!'?"}}]
    control_plane.kubectl("patch", "workflow", "approve-me", "-n", namespace, "--type", "merge",
                          "-p", json.dumps({"spec": {"signals": {"approval": {"approved": True, "by": "grace"}}}}))
    wait_condition(control_plane, namespace, "approve-me", "Succeeded")
    result = status(control_plane, namespace, "approve-me")["result"]
    assert result["approval"] == {"approved": True, "by": "grace"} and result["greeting"] == "Hello, Ada!"


def test_sigkill_mid_run_then_restart_runs_no_committed_call_twice(
    control_plane: ControlPlane, namespace: str, operators: Any, journal_dsn: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    control_plane.apply(manifest("crashy", toolCalls=effect_calls(effects, 6), snapshotEveryNCalls=2), "-n", namespace)
    for i, fault in enumerate(("after:sandbox/c2", "before:sandbox/c4"), 1):
        op = operators("--allow-local-provider", fault=fault, name=f"crash-{i}", env={ENV: journal_dsn})
        assert op.wait_exit(timeout=180) == -signal.SIGKILL, op.logs()[-3000:]
    operators("--allow-local-provider", name="survivor", env={ENV: journal_dsn})
    wait_condition(control_plane, namespace, "crashy", "Succeeded", timeout=180)

    assert effects.read_text().split() == [f"c{i}" for i in range(1, 7)]  # each call exactly once
    st = status(control_plane, namespace, "crashy")
    assert [r["stdout"] for r in st["result"]["toolResults"]] == [f"c{i}\n" for i in range(1, 7)]
    check_pg_journal(journal_dsn, namespace, st["runId"])
    assert local_sandboxes(tmp_path / "home") == []


def test_a_postgres_restart_mid_run_loses_and_repeats_nothing(
    control_plane: ControlPlane, namespace: str, operators: Any, journal_dsn: str, postgres_server: PostgresServer,
    tmp_path: Path
) -> None:
    effects, gate = tmp_path / "effects.log", tmp_path / "gate"
    op = operators("--allow-local-provider", env={ENV: journal_dsn})
    control_plane.apply(manifest("through", toolCalls=effect_calls(effects, 5, gate=gate, gate_at=3),
                                 snapshotEveryNCalls=0), "-n", namespace)
    wait_in_flight(control_plane, namespace, "through", 2)
    # The server goes away as in a crash while call 3 runs; the call finishes meanwhile, and its completion
    # waits (the run pauses at this call boundary) until the server is back.
    postgres_server.stop("immediate")
    try:
        gate.touch()
        wait_until(lambda: effects.exists() and "c3" in effects.read_text().split(), 60, "call 3 to run")
    finally:
        postgres_server.start()
    wait_condition(control_plane, namespace, "through", "Succeeded", timeout=180)

    assert effects.read_text().split() == [f"c{i}" for i in range(1, 6)]  # each call exactly once
    st = status(control_plane, namespace, "through")
    assert [r["stdout"] for r in st["result"]["toolResults"]] == [f"c{i}\n" for i in range(1, 6)]
    check_pg_journal(journal_dsn, namespace, st["runId"])
    assert "unreachable" in op.logs()  # the outage was met, and waited out
    assert _password(journal_dsn) not in op.logs()


def test_a_dsn_that_does_not_reach_postgres_stops_the_operator_at_start_saying_so(
    namespace: str, operators: Any, journal_dsn: str
) -> None:
    real, _ = split_dsn(journal_dsn)
    parts = urlsplit(real)
    wrong = real.replace(f":{parts.port}/", ":1/")  # nothing listens on port 1
    # Its one error line, the refusal to start, is what this test is about.
    op = operators(env={ENV: wrong}, expect_log=[r"^error: --journal: Cannot connect to the PostgreSQL store"])
    assert op.wait_exit(timeout=60) != 0
    logs = op.logs()
    assert "--journal" in logs and "Cannot connect" in logs, logs[-2000:]
    assert _password(journal_dsn) not in logs


def test_the_orphan_sweep_goes_by_the_runs_in_postgres(
    control_plane: ControlPlane, namespace: str, operators: Any, journal_dsn: str, tmp_path: Path
) -> None:
    """The sweep of the API-server journal's test: leftovers of operators killed between create and journal are
    removed, a running Workflow's sandbox is kept, and a finished one's is gone, with the runs in PostgreSQL."""
    provider = local_provider(tmp_path / "home")
    sweeps_leftovers(control_plane, namespace, operators,
                      dataclasses.replace(provider, env={**provider.env, ENV: journal_dsn}), tmp_path)


def test_a_run_deleted_from_postgres_mid_run_stops_instead_of_starting_over(
    control_plane: ControlPlane, namespace: str, operators: Any, journal_dsn: str, postgres_server: PostgresServer,
    tmp_path: Path
) -> None:
    """A database administrator's mistake: the run's row deleted while it runs, its journal rows left (as
    test_trust_states.py deletes a run's head Journal object). Starting afresh would run the committed first
    call again; the Workflow fails saying its journal is gone, and still deletes."""
    cp = control_plane
    effects, gate = tmp_path / "effects.log", tmp_path / "gate"
    operators("--allow-local-provider", env={ENV: journal_dsn})
    calls = [{"type": "shell", "command": f"echo c1 >> {effects}"},
             {"type": "shell", "command": f"while [ ! -e {gate} ]; do sleep 0.05; done; echo c2 >> {effects}"}]
    cp.apply(manifest("lost", toolCalls=calls, snapshotEveryNCalls=0), "-n", namespace)
    wait_in_flight(cp, namespace, "lost", 1)
    run_id = status(cp, namespace, "lost")["runId"]
    schema = namespace_schema(split_dsn(journal_dsn)[1], namespace)
    postgres_server.sql(f"DELETE FROM {schema}.runs WHERE run_id = '{run_id}'")
    gate.touch()
    wait_condition(cp, namespace, "lost", "Failed", timeout=120)
    failed = condition(cp, namespace, "lost", "Failed")
    assert failed is not None and failed["reason"] == "JournalLost", failed
    assert schema in failed["message"] and "Journal " not in failed["message"], failed["message"]
    wait_event(cp, namespace, "lost", "JournalLost")  # Events are written in the background
    assert effects.read_text().split().count("c1") == 1, "the committed first call did not run again"
    cp.kubectl("delete", "workflow", "lost", "-n", namespace, "--timeout=120s")
    wait_gone(cp, namespace, "lost")
