"""A Sandbox's record and its holding in memory, for the unit tests of ``Holding`` and what reads the record
(``tests/unit/kube/test_idle.py``, ``tests/unit/kube/test_holder_processes.py``): the real ``SandboxRecords`` over a
Journal object kept in memory (``journal_heads_support.MemoryObjects``: JSON Patch ``test`` ops honoured as the
API server honours them)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from durable_sandbox.kube.holders.holding import Holding
from durable_sandbox.kube.journal.sandbox_records import ACTIVE_AT, HOLDER, IDLE_CLAIM, SandboxRecords
from durable_sandbox.kube.journal.sealing import Sealer
from tests.unit.kube.journal_heads_support import MemoryObjects

NS, NAME, UID = "demo", "dev-box", "0123abcd-uid"


class Objects:
    """The Sandbox object, as ``CustomObjects`` gives it; status patches are kept to look at."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.body = {"metadata": {"name": NAME, "namespace": NS, "uid": UID}, "spec": spec}
        self.shown: list[Any] = []

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.body) if name == NAME else None

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.shown.append(status.get(HOLDER))


class World:
    def __init__(self, record: dict[str, Any], *, spec: dict[str, Any] | None = None,
                 running: frozenset[str] = frozenset()) -> None:
        self.records = SandboxRecords(None, b"k" * 32)  # type: ignore[arg-type]  # no API: the journal is in memory
        self.journal = MemoryObjects(NS)
        self.records._journals._namespaces[NS] = (self.journal, Sealer(b"k" * 32, NS))  # type: ignore[assignment]
        self.objects = Objects(spec or {"provider": "local", "idleSuspendAfterSeconds": 5})
        self.running = set(running)

        async def run_live(namespace: str, workflow: str) -> bool:
            return workflow in self.running

        self.holding = Holding(self.objects, self.records, run_live)  # type: ignore[arg-type]
        asyncio.run(self.records.write(NS, NAME, UID, record))

    def record(self) -> dict[str, Any]:
        return asyncio.run(self.records.read(NS, UID))

    def hold(self, workflow: str) -> str | None:
        self.running.add(workflow)  # a Workflow being admitted: its run is live
        return asyncio.run(self.holding.hold(NS, NAME, workflow))

    def claim(self, seen: dict[str, Any]) -> bool:
        """The idle timer's claim, as the controller makes it from the record it read (``seen``)."""
        return asyncio.run(self.records.swap_holder(NS, UID, seen.get(HOLDER), IDLE_CLAIM,
                                                    unchanged={ACTIVE_AT: seen.get(ACTIVE_AT)}))


LIVE = {"phase": "Ready", "providerId": "lsb-1", ACTIVE_AT: 1000.0}
