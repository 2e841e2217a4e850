"""The PostgreSQL journal's per-namespace roles (stores/postgres_grants.py, `dsb store grant-namespace`), against a
real server: a hostile worker of namespace A, logged in with its own login (a member of A's role), executes A's
runs and cannot see, claim, commit or steer namespace B's, nor take B's role, nor grant itself anything; each
refusal is PostgreSQL's, by the connection's role, not a setting the worker could change."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from click.testing import CliRunner

from durable_sandbox.cli.main import cli
from durable_sandbox.engine import Engine, StoreError
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.kube.store.journals import namespace_schema
from durable_sandbox.stores.postgres import PostgresStore, split_dsn
from tests.postgres.server import PostgresServer

PASSWORD = "worker-login-pw"  # a throwaway login of the test server


@pytest.fixture
def team(postgres_server: PostgresServer, postgres_dsn: str) -> Iterator[dict[str, Any]]:
    real, base = split_dsn(postgres_dsn)
    tag = uuid.uuid4().hex[:8]
    t: dict[str, Any] = {"admin": postgres_dsn, "real": real, "port": postgres_server.port}
    for ns in ("a", "b"):
        t[f"schema_{ns}"] = namespace_schema(base, f"team-{ns}")
        t[f"role_{ns}"] = f"dsb_team_{ns}_{tag}"
        t[f"login_{ns}"] = f"worker_{ns}_{tag}"
    yield t
    for ns in ("a", "b"):
        postgres_server.sql(f"DROP SCHEMA IF EXISTS {t[f'schema_{ns}']} CASCADE")
        postgres_server.sql(f"DROP ROLE IF EXISTS {t[f'login_{ns}']}")
        postgres_server.sql(f"DROP ROLE IF EXISTS {t[f'role_{ns}']}")


def _grant(admin: str, namespace: str, role: str) -> Any:
    return CliRunner().invoke(cli, ["--store", admin, "store", "grant-namespace", namespace, "--role", role])


def _login_dsn(t: dict[str, Any], ns: str, schema: str) -> str:
    return f"postgresql://{t[f'login_{ns}']}:{PASSWORD}@127.0.0.1:{t['port']}/postgres?schema={schema}"


async def _admit(admin_real: str, schema: str, run_id: str) -> None:
    """What the operator's admission does: the run, pending, in its namespace's schema (the schema's owner)."""
    store = await PostgresStore.connect(f"{admin_real}?schema={schema}")
    try:
        await store.create_run(RunRecord(run_id=run_id, workflow="tests.postgres.flows:counted",
                                         input={"log": "/dev/null", "run": run_id, "steps": 2}))
    finally:
        await store.close()


async def test_a_worker_role_of_namespace_a_cannot_see_claim_or_commit_namespace_b_runs(
        team: dict[str, Any], postgres_server: PostgresServer) -> None:
    t = team
    for ns in ("a", "b"):
        result = await asyncio.to_thread(_grant, t["admin"], f"team-{ns}", t[f"role_{ns}"])  # the CLI runs its own loop
        assert result.exit_code == 0, result.output
        assert f"schema {t[f'schema_{ns}']}" in result.output and "GRANT" in result.output
        postgres_server.sql(f"CREATE ROLE {t[f'login_{ns}']} LOGIN PASSWORD '{PASSWORD}' IN ROLE {t[f'role_{ns}']}")
    await _admit(t["real"], t["schema_a"], "a-run")
    await _admit(t["real"], t["schema_b"], "b-run")

    # A's worker, with A's login, executes A's run: the role holds what a worker needs.
    own = await PostgresStore.connect(_login_dsn(t, "a", t["schema_a"]))
    engine = Engine(own, worker_id="worker-a")
    try:
        assert await engine.worker(idle_exit=True, poll_interval=0.01) == ["a-run"]
        assert (await engine.inspect("a-run")).status == "succeeded"
    finally:
        await engine.aclose()
        await own.close()

    # The same login on B's schema: refused when the store opens, visibly.
    with pytest.raises(StoreError, match="permission denied"):
        await PostgresStore.connect(_login_dsn(t, "a", t["schema_b"]))

    # Whatever SQL it sends: PostgreSQL refuses each by the connection's role.
    conn = await asyncpg.connect(_login_dsn(t, "a", "x").split("?")[0])
    b = t["schema_b"]
    try:
        for statement in (f"SELECT * FROM {b}.runs",
                          f"UPDATE {b}.runs SET lease_owner = 'worker-a', fence = fence + 1",
                          f"INSERT INTO {b}.ops (run_id, seq, op_id, kind, name, status, attempt, ts) "
                          f"VALUES ('b-run', 1, 'x', 'step', 'x', 'completed', 1, 0)",
                          f"INSERT INTO {b}.signals VALUES ('b-run', 'approve', 'true', 0)",
                          f"DELETE FROM {b}.runs",
                          f"SET ROLE {t['role_b']}",
                          f"GRANT USAGE ON SCHEMA {b} TO {t['role_a']}",
                          f"ALTER ROLE {t['role_a']} BYPASSRLS",
                          f"CREATE SCHEMA {b}_mine"):
            with pytest.raises(asyncpg.PostgresError) as refused:
                await conn.execute(statement)
            assert "permission denied" in str(refused.value) or "must" in str(refused.value), (statement, refused.value)
    finally:
        await conn.close()

    # B's run is as the operator admitted it: unread, unclaimed, no record.
    admin = await PostgresStore.connect(f"{t['real']}?schema={b}")
    try:
        run = await admin.get_run("b-run")
        assert run is not None and run.status == RunStatus.PENDING and run.fence == 0 and run.lease_owner is None
        assert await admin.load_journal("b-run") == [] and await admin.get_signals("b-run") == {}
    finally:
        await admin.close()


def test_grant_namespace_refuses_a_superuser_role_and_a_non_postgres_store(
        team: dict[str, Any], postgres_server: PostgresServer, tmp_path: Any) -> None:
    result = _grant(team["admin"], "team-a", "postgres")
    assert result.exit_code != 0 and "superuser" in result.output and "role of its own" in result.output, result.output
    assert PASSWORD not in result.output and postgres_server.password not in result.output
    result = _grant(str(tmp_path / "runs.db"), "team-a", "dsb_x")
    assert result.exit_code != 0 and "PostgreSQL journal" in result.output
    result = _grant(team["admin"], "team-a", "Bad-Role")
    assert result.exit_code != 0 and "not a lowercase SQL identifier" in result.output
