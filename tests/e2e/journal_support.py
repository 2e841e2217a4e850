"""Which journal the operators of the e2e harness keep their runs in, and reading it back.

The operator e2e suite runs against the API-server journal (Journal objects) by default. The switch
``DSB_TEST_OPERATOR_JOURNAL=postgres`` (or ``pytest --operator-journal=postgres``) makes every operator the
``operators`` fixture starts use a PostgreSQL journal on the session's test server (tests/postgres), each test
on a base schema of its own (so each of its namespaces gets a schema ``<base>_ns_<namespace>`` of its own,
dropped afterwards). Tests read a run's journal through :class:`OperatorJournal`, whichever it is.

Two markers say how a test relates to the switch:

- ``apiserver_journal(reason)``: the test is about the API-server journal itself (its objects, their RBAC,
  their seal); under the switch it is skipped with ``reason``.
- ``both_journals``: the default run runs the test once per journal (``[apiserver]`` and ``[postgres]``): the
  subset of the suite that CI runs under the PostgreSQL journal too.

Under the switch, e2e tests that start no operator through the harness are skipped: the switch changes
nothing they do.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import pytest

from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.kube.store import KubernetesStore
from durable_sandbox.kube.store.journals import namespace_schema
from durable_sandbox.stores.postgres import PostgresStore, split_dsn

if TYPE_CHECKING:
    from tests.e2e.controlplane import ControlPlane
    from tests.postgres.server import PostgresServer

__all__ = ["JOURNAL_SWITCH", "OperatorJournal", "check_rows", "drop_namespace_schemas", "kube_journal",
           "namespace_dsn", "selected_journal"]

JOURNAL_SWITCH = "DSB_TEST_OPERATOR_JOURNAL"
OPTION = "--operator-journal"
FIXTURE = "operator_journal"
KINDS = ("apiserver", "postgres")
OPERATOR_JOURNAL_ENV = "DSB_OPERATOR_JOURNAL"  # what `dsb operator` reads (the chart's Secret sets it)

Kind = Literal["apiserver", "postgres"]


def selected_journal(config: pytest.Config) -> Kind:
    """The journal of this session's operators: the option, else the environment, else the API server."""
    value = (config.getoption(OPTION.lstrip("-").replace("-", "_"), None) or os.environ.get(JOURNAL_SWITCH)
             or "apiserver").strip().lower()
    if value not in KINDS:
        raise pytest.UsageError(f"{OPTION} / ${JOURNAL_SWITCH}={value!r}: give one of {', '.join(KINDS)}")
    return "postgres" if value == "postgres" else "apiserver"


def check_rows(rows: list[OperationRecord]) -> None:
    """No gap and no duplicate in a journal, and no operation completed twice."""
    assert [r.seq for r in rows] == list(range(1, len(rows) + 1)), "journal has gaps or duplicates"
    completed = [r.op_id for r in rows if r.status == "completed"]
    assert len(completed) == len(set(completed)), "an operation completed twice"


def kube_journal(cp: ControlPlane, ns: str, run_id: str) -> list[OperationRecord]:
    """A run's journal in the API server (KubernetesStore, read with the test's kubeconfig)."""
    async def load() -> list[OperationRecord]:
        store = await KubernetesStore.connect(ns, kubeconfig=str(cp.kubeconfig))
        try:
            return await store.load_journal(run_id)
        finally:
            await store.close()

    return asyncio.run(load())


def namespace_dsn(dsn: str, ns: str) -> str:
    """A DSN naming namespace ``ns``'s schema under ``dsn``'s base schema, to read what the operators wrote."""
    real, base = split_dsn(dsn)
    return f"{real}?schema={namespace_schema(base, ns)}"


def drop_namespace_schemas(server: PostgresServer, base: str) -> None:
    """Drop every namespace schema the operators made under base schema ``base`` (``<base>_ns_*``,
    ``<base>_nh_*``: kube/store/journals.py's ``namespace_schema``)."""
    if not server.running():  # a test that stopped the server and failed before starting it again
        server.start()
    server.sql(
        "DO $$DECLARE s text; BEGIN FOR s IN SELECT nspname FROM pg_namespace "
        f"WHERE starts_with(nspname, '{base}_ns_') OR starts_with(nspname, '{base}_nh_') "
        "LOOP EXECUTE format('DROP SCHEMA %I CASCADE', s); END LOOP; END$$"
    )


@dataclass
class OperatorJournal:
    """The journal the test's operators use: ``env`` is what each one is started with; ``load``/``check``
    read a run's journal back; ``run_holders`` says which replicas hold a claim on a run."""

    kind: Kind
    cp: ControlPlane
    dsn: str | None = field(default=None, repr=False)  # PostgreSQL's, with its password and ?schema=<base>

    @property
    def env(self) -> dict[str, str]:
        return {OPERATOR_JOURNAL_ENV: self.dsn} if self.dsn else {}

    def store_dsn(self, ns: str) -> str:
        assert self.dsn is not None, "the API-server journal has no DSN"
        return namespace_dsn(self.dsn, ns)

    def load(self, ns: str, run_id: str) -> list[OperationRecord]:
        if self.dsn is None:
            return kube_journal(self.cp, ns, run_id)

        async def read() -> list[OperationRecord]:
            store = await PostgresStore.connect(self.store_dsn(ns), pool_size=1)
            try:
                return await store.load_journal(run_id)
            finally:
                await store.close()

        return asyncio.run(read())

    def check(self, ns: str, run_id: str) -> None:
        rows = self.load(ns, run_id)
        assert rows, f"run {ns}/{run_id} has no journal in {self.kind}"
        check_rows(rows)

    def run_holders(self, ns: str) -> list[str]:
        """The holders (``<worker-id>:<nonce>``) of the live claims on ``ns``'s runs: the run leases (Journal
        objects) in the API server; the runs' ``lease_owner`` in PostgreSQL (no Lease objects there)."""
        if self.dsn is None:
            items = self.cp.kubectl_json("get", "journals", "-n", ns, "-l",
                                         "durable-sandbox.dev/part=lease,durable-sandbox.dev/run-id")["items"]
            return [str(h) for h in (item["data"].get("holder") for item in items) if h]

        async def read() -> list[str]:
            store = await PostgresStore.connect(self.store_dsn(ns), pool_size=1)
            try:
                runs = await store.list_runs(limit=10_000)
            finally:
                await store.close()
            return [r.lease_owner for r in runs if r.lease_owner]

        return asyncio.run(read())


@pytest.fixture
def operator_journal(request: pytest.FixtureRequest, control_plane: ControlPlane) -> Iterator[OperatorJournal]:
    """The journal of the test's operators: the API server's by default, PostgreSQL under
    ``DSB_TEST_OPERATOR_JOURNAL=postgres`` or as a ``both_journals`` test's second run (the parameter of a
    ``both_journals`` test, else the session's choice). tests/e2e/conftest.py and the soak import it."""
    cp = control_plane
    kind: Kind = getattr(request, "param", None) or selected_journal(request.config)
    if kind == "apiserver":
        yield OperatorJournal("apiserver", cp)
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    dsn: str = request.getfixturevalue("postgres_dsn")  # ?schema=t_<hex>: this test's own base schema
    try:
        yield OperatorJournal("postgres", cp, dsn)
    finally:
        drop_namespace_schemas(server, split_dsn(dsn)[1])


def journal_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Collection: mark the tests that will use the PostgreSQL server (so it is installed before the first),
    and under the switch skip those it does not concern."""
    chosen = selected_journal(config)
    for item in items:
        uses_operators = FIXTURE in getattr(item, "fixturenames", ())
        param = getattr(getattr(item, "callspec", None), "params", {}).get(FIXTURE)
        if uses_operators and (param or chosen) == "postgres":
            item.add_marker(pytest.mark.postgres)
        if chosen != "postgres":
            continue
        only = item.get_closest_marker("apiserver_journal")
        if only is not None:
            reason = only.args[0] if only.args else only.kwargs.get("reason", "")
            item.add_marker(pytest.mark.skip(reason=f"API-server journal only: {reason}"))
        elif not uses_operators:
            item.add_marker(pytest.mark.skip(
                reason=f"{JOURNAL_SWITCH}=postgres: starts no operator through the harness (nothing to switch)"))


def parametrize_both(metafunc: pytest.Metafunc) -> None:
    """``both_journals`` tests run once per journal in the default run; under the switch only under it."""
    if (FIXTURE in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_journals")
            and selected_journal(metafunc.config) == "apiserver"):
        metafunc.parametrize(FIXTURE, list(KINDS), indirect=True)
