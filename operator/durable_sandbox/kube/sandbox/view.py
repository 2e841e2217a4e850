"""One Sandbox resource as the Sandbox controller serves it, and the controller's settings."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.kube.api.objects import ObjectView
from durable_sandbox.kube.journal.leases import HeldLease
from durable_sandbox.kube.spec.provider_choice import LOCAL, PINNED
from durable_sandbox.providers.contract import SandboxHandle


def calls_run_id(uid: str) -> str:
    """The run holding a Sandbox's own session calls (sessions/journal.py). Its ``.calls`` tail is no Workflow's run
    id (those end ``-<8 hex>``). Named here, beside the Sandbox, because its deletion goes with the Sandbox's."""
    return f"dsbx.{uid}.calls"


CALLS_SESSION = "calls"  # the session id of a Sandbox's own calls in that run (op ids ``calls/<operationId>``)

__all__ = ["CALLS_SESSION", "LOSS_REPORTED", "OPERATION_LABEL", "SANDBOX_LABEL", "SandboxControllerSettings", "SandboxView"]

LOSS_REPORTED = "lossReported"  # status: a session call's hint that the live sandbox is gone (kube_gate.py)
SANDBOX_LABEL = "durable-sandbox.dev/sandbox"  # on the provider's sandbox: the Sandbox resource it is
OPERATION_LABEL = "durable-sandbox.dev/operation"  # ... and the operation that made it (to adopt it after a crash)


@dataclass
class SandboxControllerSettings:
    retry: float = 5.0  # after a transient provider error
    failed_retry: float = 60.0  # after a refused provision (the spec may change meanwhile)
    held_retry: float = 2.0  # deletion of a Sandbox a Workflow holds looks again this often
    idle_poll: float = 30.0  # an idle-suspended Sandbox looks for a Workflow that took it this often (else: woken)
    cleanup_backoff: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
    worker_id: str = "durable-sandbox"  # this replica's name in the Sandboxes' Leases
    lease_ttl: float = 15.0  # a dead replica's Sandboxes are taken over after this long
    default_provider: str = LOCAL  # a Sandbox's provider when its spec names none (pinned in its record)
    allow_local_provider: bool = False  # the operator's policy, for a Sandbox that gets local by default


@dataclass(kw_only=True)
class SandboxView(ObjectView):
    """One Sandbox as this process serves it: the newest body and the status it wrote last."""

    status: dict[str, Any]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    lease: HeldLease | None = None  # this replica's claim to reconcile the Sandbox
    turn: asyncio.Task[float | None] | None = None  # the reconciliation in progress (stopped if the lease is lost)
    waiting_on: str | None = None  # the replica holding the lease while this one waits
    seen_holder: str | None = None  # status.holder in the newest body seen (a wake-up hint only)
    seen_loss: str | None = None  # status.lossReported in the newest body seen (a hint only)
    check_live: bool = False  # check the live sandbox with the provider on the next turn, renewal due or not

    def notice(self, body: Mapping[str, Any]) -> None:
        """As every object's (a spec change or deletion wakes the daemon), and also a change of ``status.holder``:
        a Workflow took or let go of the Sandbox, which an idle-suspended one resumes for and the idle timer
        counts from. Only a hint (anyone granted sandboxes/status can write it): the turn it wakes reads the
        Sandbox's record."""
        super().notice(body)
        shown = (body.get("status") or {}).get("holder")
        holder = shown if isinstance(shown, str) else None
        if holder != self.seen_holder:
            self.seen_holder = holder
            self.wake.set()
        # A session call met a lost (or unusable) sandbox: check it now. Only a hint (anyone granted
        # sandboxes/status can write it): the check asks the provider, the turn acts on its answer alone.
        loss = (body.get("status") or {}).get(LOSS_REPORTED)
        if isinstance(loss, str) and loss != self.seen_loss:
            self.seen_loss = loss
            self.check_live = True
            self.wake.set()

    @property
    def snapshots(self) -> list[str]:
        return list(self.status.get("snapshots") or [])

    def handle(self) -> SandboxHandle | None:
        pid = self.status.get("providerId")
        if not pid:
            return None
        # A live sandbox always has its provider pinned (or, made before pins existed, named by the spec, which the
        # CRD then defaulted to local).
        return SandboxHandle(id=pid, provider=self.provider_name or LOCAL, metadata=dict(self.status.get("handle") or {}))

    @property
    def provider_name(self) -> str | None:
        """The provider of this Sandbox's sandboxes and snapshots: the one its record pins (``status`` holds the
        record's fields, never the API server's status); before anything was pinned, the one its spec names
        (a record written before pins existed); None when neither (nothing was made)."""
        pinned = self.status.get(PINNED)
        return str(pinned) if pinned else (self.body.get("spec") or {}).get("provider") or None
