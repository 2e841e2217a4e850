"""A fake of :class:`durable_sandbox.kube.api.client.KubeClient` for starting the operator's application without a
cluster: discovery serves every resource of the operator (and every LIST answers, empty), Events are recorded
in ``events``. Custom objects are :class:`tests.fakes.custom_objects.FakeCustomObjects`, given beside it."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from durable_sandbox.kube.api.apiserver_away import ApiServerAway
from durable_sandbox.kube.api.discovery import VERBS
from durable_sandbox.kube.api.resources import GROUP, JOURNALS, SERVED, VERSION
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics


class FakeApis:
    async def get_api_versions(self) -> Any:
        return SimpleNamespace(groups=[SimpleNamespace(name=GROUP, versions=[SimpleNamespace(version=VERSION)])])


class FakeCustomApi:
    """Discovery of the operator's group, and LISTs (the operator's start lists each resource once)."""

    def __init__(self) -> None:
        self.listed: list[str] = []

    async def get_api_resources(self, group: str, version: str) -> Any:
        return SimpleNamespace(resources=[SimpleNamespace(name=p, verbs=sorted(VERBS)) for p in (*SERVED, JOURNALS)])

    async def list_cluster_custom_object(self, group: str, version: str, plural: str, **_: Any) -> dict[str, Any]:
        self.listed.append(plural)
        return {"items": []}

    async def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                            **_: Any) -> dict[str, Any]:
        self.listed.append(plural)
        return {"items": []}


class FakeCore:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def create_namespaced_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.events.append(body)


@dataclass
class FakeKubeClient:
    core: FakeCore = field(default_factory=FakeCore)
    custom: FakeCustomApi = field(default_factory=FakeCustomApi)
    apis: FakeApis = field(default_factory=FakeApis)
    away: ApiServerAway = field(default_factory=ApiServerAway)
    metrics: OperatorMetrics | None = None
    closed: bool = False

    async def close(self) -> None:
        self.closed = True
