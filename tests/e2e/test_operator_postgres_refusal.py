"""Issue 25: a PostgreSQL journal that answers but refuses for good (here: the operator's role made read-only, as
a standby or `default_transaction_read_only` does) is not an outage and not the run's failure. The Workflow says
so (Ready=False, JournalWriteRefused naming the SQLSTATE, a Warning Event), the run is held where it is with the
refused call's result in memory, and once the server takes writes again it is recorded and the run goes on: every
call ran once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    condition,
    effect_calls,
    events,
    manifest,
    namespace,
    operators,
    status,
    wait_condition,
    wait_in_flight,
)
from tests.e2e.postgres_journal_support import ENV, check_pg_journal, journal_dsn
from tests.postgres.server import PostgresServer

__all__ = ["journal_dsn", "namespace", "operators"]  # fixtures

READ_ONLY = "ALTER ROLE postgres IN DATABASE postgres SET default_transaction_read_only = on"
# Run from another database: sessions on `postgres` itself are read-only by then.
READ_WRITE = "ALTER ROLE postgres IN DATABASE postgres RESET default_transaction_read_only"
KICK = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'durable-sandbox' AND pid <> pg_backend_pid()")


def test_a_read_only_journal_is_said_on_the_workflow_and_the_run_goes_on_once_it_takes_writes(
    control_plane: ControlPlane, namespace: str, operators: Any, journal_dsn: str, postgres_server: PostgresServer,
    tmp_path: Path
) -> None:
    cp, ns = control_plane, namespace
    effects, gate = tmp_path / "effects.log", tmp_path / "gate"
    op = operators("--allow-local-provider", env={ENV: journal_dsn})
    cp.apply(manifest("refused", toolCalls=effect_calls(effects, 4, gate=gate, gate_at=3), snapshotEveryNCalls=0),
             "-n", ns)
    wait_in_flight(cp, ns, "refused", 2)
    try:
        postgres_server.sql(READ_ONLY, database="template1")
        postgres_server.sql(KICK, database="template1")  # the operator's sessions start again, read-only
        gate.touch()  # call 3 finishes; its completion is refused
        try:
            wait_until(lambda: (condition(cp, ns, "refused", "Ready") or {}).get("reason") == "JournalWriteRefused",
                       120, "Ready=False with JournalWriteRefused")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{op.logs()[-4000:]}") from None
        ready = condition(cp, ns, "refused", "Ready") or {}
        assert ready.get("status") == "False" and "SQLSTATE 25006" in ready.get("message", ""), ready
        assert any(e["reason"] == "JournalWriteRefused" and e["type"] == "Warning" for e in events(cp, ns, "refused"))
        assert status(cp, ns, "refused").get("phase") not in ("Failed", "Succeeded")
    finally:
        postgres_server.sql(READ_WRITE, database="template1")
    wait_condition(cp, ns, "refused", "Succeeded", timeout=180)
    # Calls 1 and 2 were committed: never again. Call 3's completion was refused: the run was held at that
    # boundary with it in memory (engine/refusals.py) and recorded it once the server took writes (issue 32
    # item 9; it used to run again at every retry); 4 once.
    assert effects.read_text().split() == ["c1", "c2", "c3", "c4"]
    reasons = [e["reason"] for e in events(cp, ns, "refused")]
    assert "JournalWriteAccepted" in reasons, reasons
    check_pg_journal(journal_dsn, ns, status(cp, ns, "refused")["runId"])
    assert "Traceback" not in op.logs()
