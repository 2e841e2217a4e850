"""Who holds a Sandbox resource: one Workflow at a time runs its calls in a Sandbox's live sandbox.

The holder is kept in the Sandbox's own record (``kube/journal/sandbox_records.py``: a sealed Journal object no
namespace role grants), taken and let go with a compare-and-swap of that one value, so two Workflows can never
both take it; ``status.holder`` only shows it. A holder that no longer runs holds nothing, and whether it runs
is judged from its own journal (its run finished, or never will), never from its status: anyone granted
``workflows/status`` could otherwise declare a running holder finished and put a second Workflow's calls into
its sandbox. Every path to a Sandbox's live sandbox (``spec.sandboxRef``, an entrypoint's ``sandboxRef``
input) goes through :meth:`Holding.live_handle`, which refuses a Workflow that does not hold it.

Idle suspension (``spec.idleSuspendAfterSeconds``) is a holder too: the Sandbox controller takes the holder
``IDLE_CLAIM`` with the same compare-and-swap before it snapshots and destroys an idle sandbox, and lets go once
it is suspended, so a Workflow either takes the Sandbox first (and the idle timer leaves it alone) or waits for
the suspend to end; then it takes the idle-suspended Sandbox, which makes the controller resume it, and its run
starts once the Sandbox is Ready again. Taking and letting go stamps ``lastActiveAt`` in the record in the same
patch: the idle timer counts from it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from durable_sandbox.kube.api.resources import SANDBOXES, CustomObjects
from durable_sandbox.kube.journal.sandbox_records import (
    ACTIVE_AT,
    HOLDER,
    IDLE_CLAIM,
    IDLE_SUSPENDED,
    SandboxRecords,
)
from durable_sandbox.kube.spec.provider_choice import LOCAL, sandbox_choice
from durable_sandbox.providers.contract import SandboxHandle

__all__ = ["SESSION_CLAIM", "SESSION_HOLD_SECONDS", "Holding", "RunLive", "SandboxHeld"]

# The holder while a session call (``sessions/``: an agent calling the Sandbox directly) runs: taken with the same
# compare-and-swap before the call and let go after it, so a Workflow and a session call never share the sandbox.
# It has no run to ask whether it still goes: it holds until let go or for SESSION_HOLD_SECONDS after it was taken
# (``lastActiveAt``), the longest call plus a margin, so an operator killed mid-call holds nothing for ever.
SESSION_CLAIM = "(session)"
SESSION_HOLD_SECONDS = 3600.0 + 60.0

# (namespace, Workflow name) -> whether that Workflow exists and its run has not finished (from its journal).
RunLive = Callable[[str, str], Awaitable[bool]]


class SandboxHeld(LookupError):
    """The Sandbox is held by another running Workflow (or is not ready): the run must wait for it."""


class Holding:
    def __init__(self, objects: CustomObjects, records: SandboxRecords, run_live: RunLive) -> None:
        self.objects = objects
        self.records = records
        self.run_live = run_live

    async def _sandbox(self, namespace: str, name: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The Sandbox object (its uid, spec and display status) and its record (what the operator acts on)."""
        sandbox = await self.objects.get(SANDBOXES, namespace, name)
        if sandbox is None:
            return None, {}
        return sandbox, await self.records.read(namespace, sandbox["metadata"]["uid"])

    async def running_holder(self, namespace: str, record: dict[str, Any]) -> str | None:
        """The Workflow holding the Sandbox of ``record`` if its run still goes, else None (also while the idle
        timer holds it: that claim is the Sandbox controller's own, let go when its suspend ends)."""
        holder = record.get(HOLDER)
        if holder == SESSION_CLAIM:
            return holder if time.time() - float(record.get(ACTIVE_AT) or 0) < SESSION_HOLD_SECONDS else None
        if not holder or holder == IDLE_CLAIM or not await self.run_live(namespace, str(holder)):
            return None
        return str(holder)

    async def hold(self, namespace: str, name: str, workflow: str) -> str | None:
        """Take Sandbox ``name`` for ``workflow``; None when it holds it and its sandbox is live, else why the
        Workflow must wait (taking an idle-suspended Sandbox is what resumes it)."""
        for _ in range(3):
            sandbox, record = await self._sandbox(namespace, name)
            if sandbox is None:
                return f"spec.sandboxRef: Sandbox {name!r} does not exist in this namespace; create it (the run starts then)"
            current = record.get(HOLDER)
            if current == workflow:
                return None if record.get("providerId") else _resuming(name, record)
            if current == IDLE_CLAIM:
                return (f"spec.sandboxRef: Sandbox {name!r} is being suspended (no call for "
                        f"spec.idleSuspendAfterSeconds); this run resumes it once that is done, then starts")
            holder = await self.running_holder(namespace, record)
            if holder is not None:
                return (f"spec.sandboxRef: Sandbox {name!r} is held by Workflow {holder!r}; this run starts when that "
                        f"Workflow finishes or is cancelled")
            idle = bool(record.get(IDLE_SUSPENDED)) and not (sandbox.get("spec") or {}).get("suspend")
            if not idle and (record.get("phase") != "Ready" or not record.get("providerId")):
                return (f"spec.sandboxRef: Sandbox {name!r} is not Ready (phase {record.get('phase') or 'Pending'}); "
                        f"this run starts when it is")
            if await self.records.swap_holder(namespace, sandbox["metadata"]["uid"], current, workflow,
                                              also={ACTIVE_AT: time.time()}):
                await self._show(namespace, name, workflow)
                return _resuming(name, record) if idle else None
        return f"spec.sandboxRef: Sandbox {name!r} changed while being taken; trying again"

    async def release(self, namespace: str, name: str, workflow: str) -> None:
        """Let go of Sandbox ``name`` if ``workflow`` holds it (idempotent)."""
        for _ in range(3):
            sandbox, record = await self._sandbox(namespace, name)
            if sandbox is None or record.get(HOLDER) != workflow:
                return
            if await self.records.swap_holder(namespace, sandbox["metadata"]["uid"], workflow, None,
                                              also={ACTIVE_AT: time.time()}):
                await self._show(namespace, name, None)
                return

    async def live_handle(self, namespace: str, name: str, workflow: str) -> SandboxHandle:
        """The live sandbox of Sandbox ``name`` for ``workflow``, taking the Sandbox for it if it is free;
        :class:`SandboxHeld` while another running Workflow holds it or it has no live sandbox."""
        waits = await self.hold(namespace, name, workflow)
        if waits is not None:
            raise SandboxHeld(waits)
        sandbox, record = await self._sandbox(namespace, name)
        if sandbox is None or not record.get("providerId"):
            raise SandboxHeld(f"Sandbox {namespace}/{name} has no live sandbox (phase {record.get('phase') or 'missing'}); "
                              f"set its spec.suspend to false and run the Workflow again")
        # The provider its record pins (a live sandbox always has one; one made before pins existed, its spec's,
        # which the CRD then defaulted to local); never its status.
        provider = sandbox_choice(record, (sandbox.get("spec") or {}).get("provider"), LOCAL).name
        return SandboxHandle(id=str(record["providerId"]), provider=provider, metadata=dict(record.get("handle") or {}))

    async def _show(self, namespace: str, name: str, holder: str | None) -> None:
        """status.holder, for people (``kubectl get dsbx``); nothing reads it back."""
        await self.objects.patch_status(SANDBOXES, namespace, name, {HOLDER: holder})


def _resuming(name: str, record: dict[str, Any]) -> str:
    """Why a Workflow holding Sandbox ``name`` still waits: its sandbox is not live (yet)."""
    if record.get(IDLE_SUSPENDED):
        return (f"spec.sandboxRef: Sandbox {name!r} was suspended for idleness (spec.idleSuspendAfterSeconds); it is "
                f"resuming from its snapshot for this run, which starts when it is Ready")
    return (f"spec.sandboxRef: Sandbox {name!r} has no live sandbox (phase {record.get('phase') or 'Pending'}); this "
            f"run starts when it is Ready")
