"""The operator's journal choice (kube/store/journals.py): each namespace's schema is its own, and the DSN's password is
never printed."""

from __future__ import annotations

from durable_sandbox.kube.store.journals import ApiServerJournal, PostgresJournal, namespace_schema


def test_each_namespace_has_a_schema_of_its_own_whatever_its_length() -> None:
    assert namespace_schema("dsb", "team-a") == "dsb_ns_team_a"
    long_a, long_b = "a" * 62 + "b", "a" * 62 + "c"
    schemas = {namespace_schema("durable_sandbox", ns) for ns in ("team-a", "teama", long_a, long_b)}
    assert len(schemas) == 4
    assert all(len(s) <= 63 for s in schemas)


def test_the_dsn_password_is_never_printed() -> None:
    choice = PostgresJournal("postgresql://dsb:s3cret@db.example:5432/dsb?schema=ops")
    assert "s3cret" not in str(choice) and "s3cret" not in repr(choice)
    assert "db.example" in str(choice)
    assert str(ApiServerJournal()) == "the API server"


async def test_the_sweeps_finished_runs_in_postgresql_are_the_ends_of_continue_as_new_chains() -> None:
    """A run that continued as new is not finished (its chain's sandbox lives on); a chain's end marks its first
    run (the Workflow's, what the orphan sweep looks up) finished."""
    from typing import Any

    from durable_sandbox.engine.continue_as_new import CHAIN, CONTINUED_FROM, GENERATION
    from durable_sandbox.engine.records import RunRecord, RunStatus
    from durable_sandbox.kube.store import run_key
    from durable_sandbox.kube.store.journals import JournalStores

    def run(run_id: str, status: RunStatus, result: Any = None, chain: str | None = None) -> RunRecord:
        return RunRecord(run_id=run_id, workflow="wf", input=None, status=status, result=result,
                         labels={CHAIN: chain, CONTINUED_FROM: chain, GENERATION: "1"} if chain else {})

    finished = [run("going-1", RunStatus.SUCCEEDED, {"continuedAsNew": "going-1~1"}),
                run("done-2", RunStatus.SUCCEEDED, {"continuedAsNew": "done-2~1"}),
                run("done-2~1", RunStatus.FAILED, chain="done-2"),
                run("plain-3", RunStatus.CANCELLED)]

    class Store:
        async def list_runs(self, **_: Any) -> list[RunRecord]:
            return finished

    stores = JournalStores(PostgresJournal("postgresql://dsb@db/dsb"), None)  # type: ignore[arg-type]
    stores.store_for = lambda namespace: Store()  # type: ignore[method-assign]
    found = await stores.finished_runs("team")
    assert found.ignored == () and found.keys == {run_key("done-2~1"), run_key("done-2"), run_key("plain-3")}
