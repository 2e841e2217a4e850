"""What both SQL stores decide the same way (stores/sql_rules.py): the parameters each names its own way, the run
fields a change may set (SQLite, too, refuses any other before writing), the runnable condition."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from durable_sandbox.engine.builds import BuildClaims
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.stores import SqliteStore
from durable_sandbox.stores.sql_rules import (
    NumberedParams,
    QmarkParams,
    list_runs_sql,
    runnable_sql,
    set_columns,
)
from durable_sandbox.stores.sqlite_leases import label_sql


def test_each_store_names_the_same_parameters_its_own_way() -> None:
    for params, expected in ((QmarkParams(), "WHERE status IN (?,?) AND workflow = ? ORDER BY created_at DESC LIMIT ?"),
                             (NumberedParams(), "WHERE status = ANY($1::text[]) AND workflow = $2 ORDER BY created_at "
                                                "DESC LIMIT $3")):
        sql = list_runs_sql("runs", "run_id", params, status=[RunStatus.PENDING, RunStatus.WAITING], workflow="w",
                            limit=5)
        assert sql == f"SELECT run_id FROM runs {expected}"
    numbered = NumberedParams(taken=2)
    condition = runnable_sql(numbered, 10.0, lease_clock="server_now()", workflows=["a"])
    assert "lease_expires_at < server_now()" in condition and "wake_at <= $3" in condition
    assert condition.endswith("AND workflow = ANY($4::text[])") and numbered.values == [10.0, ["a"]]


def test_a_change_sets_only_run_fields_then_updated_at() -> None:
    assert set_columns(["status", "labels"]) == ["status", "labels", "updated_at"]
    for key in ("fence", "run_id", "last_seq", "updated_at", "status=status; DROP TABLE runs; --"):
        with pytest.raises(ValueError, match="not a run field that can be changed"):
            set_columns([key])


async def test_sqlite_refuses_a_change_of_what_is_not_a_run_field_and_writes_nothing(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    try:
        run, _ = await store.create_run(RunRecord(run_id="r", workflow="w"))
        with pytest.raises(ValueError, match="'fence'"):
            await store.update_run("r", {"status": RunStatus.FAILED, "fence": 99})
        got = await store.get_run("r")
        assert got is not None and (got.status, got.fence) == (RunStatus.PENDING, run.fence)
    finally:
        await store.close()


async def test_the_build_condition_keeps_the_claim_on_the_runnable_index(tmp_path: Path) -> None:
    # A worker's build adds a conjunct after the lease and status conditions: SQLite still searches runs_status
    # for the runnable statuses (never a scan of every run, finished ones included), as without a build.
    store = SqliteStore(tmp_path / "plan.db")
    await store.create_run(RunRecord(run_id="r", workflow="w", input={}))
    await store.close()

    def plan(build: BuildClaims | None) -> list[str]:
        params = QmarkParams()
        condition = runnable_sql(params, 0.0, build=build, label=label_sql)
        with sqlite3.connect(tmp_path / "plan.db") as db:
            rows = db.execute(f"EXPLAIN QUERY PLAN SELECT run_id FROM runs WHERE {condition} ORDER BY updated_at "
                              f"LIMIT 1", params.values).fetchall()
        return [str(row[3]) for row in rows]

    with_build = plan(BuildClaims("v1", frozenset({"w"})))
    assert with_build == plan(None)
    assert any("USING INDEX runs_status" in step for step in with_build), with_build
    assert not any(step.startswith("SCAN runs") for step in with_build), with_build
    with pytest.raises(ValueError, match="needs the store's `label`"):
        runnable_sql(QmarkParams(), 0.0, build=BuildClaims("v1"))
