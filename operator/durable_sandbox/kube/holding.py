"""Who holds a Sandbox resource: one Workflow at a time runs its calls in a Sandbox's live sandbox.

The holder is ``status.holder`` of the Sandbox (a Workflow name in the same namespace), taken and let go
with patches conditional on the object's ``resourceVersion``, so two Workflows can never both take it.
A holder that no longer runs (finished, deleted) holds nothing: the next Workflow takes the Sandbox over.
"""

from __future__ import annotations

from typing import Any

from durable_sandbox.kube.client import is_conflict
from durable_sandbox.kube.resources import SANDBOXES, WORKFLOWS, CustomObjects
from durable_sandbox.providers.contract import SandboxHandle

FINISHED = frozenset({"Succeeded", "Failed", "Cancelled"})


async def running_holder(objects: CustomObjects, namespace: str, sandbox: dict[str, Any]) -> str | None:
    """The Workflow holding ``sandbox`` if it still runs (exists, not finished), else None."""
    holder = (sandbox.get("status") or {}).get("holder")
    if not holder:
        return None
    wf = await objects.get(WORKFLOWS, namespace, holder)
    if wf is None or (wf.get("status") or {}).get("phase") in FINISHED:
        return None
    return str(holder)


async def _set_holder(objects: CustomObjects, namespace: str, sandbox: dict[str, Any], holder: str | None) -> bool:
    meta = sandbox["metadata"]
    try:
        written = await objects.patch_status(SANDBOXES, namespace, meta["name"], {"holder": holder},
                                             precondition=meta["resourceVersion"])
    except Exception as exc:
        if is_conflict(exc):
            return False
        raise
    return written is not None  # None: the Sandbox is gone


async def hold(objects: CustomObjects, namespace: str, name: str, workflow: str) -> str | None:
    """Take Sandbox ``name`` for ``workflow``; None when it is held, else why the Workflow must wait."""
    for _ in range(3):
        sandbox = await objects.get(SANDBOXES, namespace, name)
        if sandbox is None:
            return f"spec.sandboxRef: Sandbox {name!r} does not exist in this namespace; create it (the run starts then)"
        status = sandbox.get("status") or {}
        if status.get("holder") == workflow:
            return None
        holder = await running_holder(objects, namespace, sandbox)
        if holder is not None:
            return (f"spec.sandboxRef: Sandbox {name!r} is held by Workflow {holder!r}; this run starts when that "
                    f"Workflow finishes or is cancelled")
        if status.get("phase") != "Ready" or not status.get("providerId"):
            return (f"spec.sandboxRef: Sandbox {name!r} is not Ready (phase {status.get('phase') or 'Pending'}); "
                    f"this run starts when it is")
        if await _set_holder(objects, namespace, sandbox, workflow):
            return None
    return f"spec.sandboxRef: Sandbox {name!r} changed while being taken; trying again"


async def release(objects: CustomObjects, namespace: str, name: str, workflow: str) -> None:
    """Let go of Sandbox ``name`` if ``workflow`` holds it (idempotent)."""
    for _ in range(3):
        sandbox = await objects.get(SANDBOXES, namespace, name)
        if sandbox is None or (sandbox.get("status") or {}).get("holder") != workflow:
            return
        if await _set_holder(objects, namespace, sandbox, None):
            return


async def live_handle(objects: CustomObjects, namespace: str, name: str) -> SandboxHandle:
    """The live sandbox of Sandbox ``name``, as its status records it."""
    sandbox = await objects.get(SANDBOXES, namespace, name)
    status = (sandbox or {}).get("status") or {}
    if sandbox is None or not status.get("providerId"):
        phase = status.get("phase") or "missing"
        raise LookupError(f"Sandbox {namespace}/{name} has no live sandbox (phase {phase}); set spec.suspend to false "
                          f"and run the Workflow again")
    return SandboxHandle(id=status["providerId"], provider=sandbox["spec"].get("provider", "local"),
                         metadata=dict(status.get("handle") or {}))
