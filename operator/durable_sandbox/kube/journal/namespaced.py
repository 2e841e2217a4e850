"""One ``JournalObjects`` and ``Sealer`` per namespace, made on first use: what the Sandbox records and the schedule
records each kept a copy of."""

from __future__ import annotations

from durable_sandbox.kube.api.client import KubeClient
from durable_sandbox.kube.journal.journal_objects import JournalObjects
from durable_sandbox.kube.journal.sealing import Sealer

__all__ = ["NamespacedJournals"]


class NamespacedJournals:
    def __init__(self, api: KubeClient, journal_key: bytes | None, field_manager: str) -> None:
        self.api = api
        self._key = journal_key
        self._field_manager = field_manager
        self._namespaces: dict[str, tuple[JournalObjects, Sealer]] = {}

    def of(self, namespace: str) -> tuple[JournalObjects, Sealer]:
        found = self._namespaces.get(namespace)
        if found is None:
            found = self._namespaces[namespace] = (
                JournalObjects(self.api, namespace, field_manager=self._field_manager), Sealer(self._key, namespace))
        return found
