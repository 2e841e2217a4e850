"""A Sandbox's own call journal (sessions/) goes with the Sandbox: a PostgreSQL-like journal, which has no owner
reference to go by, is deleted by the Sandbox's finalizer; the API server's Journal objects are left to the garbage
collector (they are owned by the Sandbox), so the finalizer deletes nothing there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from durable_sandbox.kube.sandbox import SandboxController
from durable_sandbox.kube.sandbox.view import SandboxView
from durable_sandbox.sessions.journal import SESSION, calls_run_id
from durable_sandbox.sessions.models import ShellRequest
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import NAMESPACE, local_gate, service


@dataclass
class Journals:
    """What the finalizer asks of the operator's journal stores (kube/store/journals.py's JournalStores)."""

    store: SqliteStore
    collected_with_workflow: bool

    def store_for(self, namespace: str) -> SqliteStore:
        assert namespace == NAMESPACE
        return self.store


@pytest.mark.parametrize("collected", [False, True], ids=["postgres-like", "apiserver-like"])
async def test_the_sandboxs_call_journal_goes_with_it(tmp_path: Path, collected: bool) -> None:
    gate = await local_gate(tmp_path / "home")
    store = SqliteStore(tmp_path / "runs.db")
    answer = await service(store, gate).call("good-token", NAMESPACE, "box",
                                             ShellRequest(operationId="c1", command="echo hi"))
    assert answer.exitCode == 0
    run_id = calls_run_id("uid-1")
    assert [r.op_id for r in await store.load_journal(run_id) if r.status == "completed"].count(f"{SESSION}/c1") == 1

    controller = SandboxController(cast(Any, None), cast(Any, None), lambda _: cast(Any, None),
                                   records=cast(Any, None), holding=cast(Any, None),
                                   journals=cast(Any, Journals(store, collected)))
    view = SandboxView(namespace=NAMESPACE, name="box", uid="uid-1", body={"metadata": {"namespace": NAMESPACE}},
                       status={})
    await controller.forget_calls(view)

    remaining = await SqliteStore(tmp_path / "runs.db").get_run(run_id)
    assert (remaining is None) is (not collected)
