"""The agent-sandbox provider's test world: the provider wired to the fakes of agent-sandbox's API
(tests/fakes/agent_sandbox_objects.py) and of the core API's Pods and exec (tests/fakes/core_pods.py), shared by
its unit tests."""

from __future__ import annotations

import time
from typing import Any, cast

from durable_sandbox.providers.agent_sandbox import AgentSandboxProvider
from durable_sandbox.providers.agent_sandbox_settings import AgentSandboxSettings
from durable_sandbox.providers.contract import INSTALLATION_LABEL, SandboxHandle, SandboxSpec, ToolCall
from durable_sandbox.providers.kubernetes_pool import derive_pool_key
from durable_sandbox.providers.s3_snapshots import S3Config
from durable_sandbox.testing import FakeClock
from tests.fakes.agent_sandbox_objects import FakeClaimObjects
from tests.fakes.core_pods import FakeCore, FakeExec

NS = "team-a"
OWNER = f"{NS}/uid-owner"
INSTALLATION = "inst-1"
KEY = derive_pool_key(b"k" * 32)


def spec(operation: str = "op-1", **extra: Any) -> SandboxSpec:
    fields: dict[str, Any] = {"template": "warm", "owner": OWNER, "operation_id": operation,
                              "labels": {INSTALLATION_LABEL: INSTALLATION}, **extra}
    return SandboxSpec(**fields)


def shell(command: str = "echo hi", op: str = "c1") -> ToolCall:
    return ToolCall(operation_id=op, type="shell", args={"command": command})


class World:
    def __init__(self, clock: FakeClock | None = None, *, store: S3Config | None = None) -> None:
        self.core = FakeCore()
        self.objects = FakeClaimObjects(self.core)
        self.exec = FakeExec()
        self.provider = AgentSandboxProvider(namespace=NS, environ={}, pool_key=KEY, clock=clock or time.time,
                                             store=store, settings=AgentSandboxSettings(ready_timeout=2))
        self.provider._core = self.core
        self.provider._exec = cast(Any, self.exec)
        self.provider._claims = self.objects

    def claim_of(self, handle: SandboxHandle) -> dict[str, Any]:
        claim = self.objects.claim(NS, handle.id.split("/")[1])
        assert claim is not None
        return claim
