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
