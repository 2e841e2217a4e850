"""A shared Sandbox changing hands: nothing the previous holder's code left running meets the next holder's calls.

A Sandbox resource's live sandbox serves one Workflow at a time (``kube/holders/holding.py``), one after another. A process
one Workflow's call left behind (``env -i``, ``setsid``, ``nohup``, a double fork: none of them is the call's any
more) would otherwise go on running beside the next holder's calls, and read their per-call env (``/proc/<pid>/
environ``, same user) or their files as they are written. So before a run's first call in a Sandbox it did not
hold last, every process in the sandbox but its keep-alive is ended (the provider's ``reset_processes``), and the
record says for which run and which live sandbox that was done: sealed in the Sandbox's own record
(``kube/journal/sandbox_records.py``), by run id (the Workflow's name and uid), never a label. A crash between the reset
and the record makes the next attempt reset again (it is idempotent); the run's own later attachments (a resume, a
takeover) find the record and keep their processes.

A provider without ``process_reset`` (e2b) cannot do it: there a shared Sandbox is one trust domain, as
docs/kubernetes.md says, and the log says so once per holder.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from durable_sandbox.kube.api.resources import SANDBOXES, CustomObjects
from durable_sandbox.kube.holders.holding import SandboxHeld
from durable_sandbox.kube.journal.sandbox_records import SandboxRecords
from durable_sandbox.providers.contract import Capability, SandboxHandle, SandboxProvider

__all__ = ["CLEARED_FOR", "HolderProcesses"]

log = logging.getLogger(__name__)

CLEARED_FOR = "processesClearedFor"  # {"run": run id, "sandbox": provider id}: whose calls the processes are now
ProviderFor = Callable[[str], contextlib.AbstractAsyncContextManager[SandboxProvider]]


class HolderProcesses:
    def __init__(self, objects: CustomObjects, records: SandboxRecords, provider_for: ProviderFor) -> None:
        self.objects = objects
        self.records = records
        self.provider_for = provider_for

    async def clear_for(self, namespace: str, name: str, workflow: str, run_id: str, handle: SandboxHandle) -> None:
        """Before run ``run_id`` (of Workflow ``workflow``, which holds Sandbox ``name``) reaches ``handle``: end
        every process in it but the keep-alive, unless that was done for this run in this live sandbox already.
        :class:`SandboxHeld` (as from ``Holding.live_handle``) when the Sandbox changed hands meanwhile; a provider
        that fails to end them raises its error: no call of this run starts beside what is left."""
        sandbox = await self.objects.get(SANDBOXES, namespace, name)
        if sandbox is None:
            raise SandboxHeld(f"Sandbox {namespace}/{name} is gone")
        uid = sandbox["metadata"]["uid"]
        mark = {"run": run_id, "sandbox": handle.id}
        record: dict[str, Any] = await self.records.read(namespace, uid)
        if record.get(CLEARED_FOR) == mark:
            return
        async with self.provider_for(handle.provider) as provider:
            if provider.capabilities().supports(Capability.PROCESS_RESET):
                await provider.reset_processes(handle)
            else:
                log.warning("%s/%s: provider %s cannot end the processes earlier holders left in sandbox %s; Workflow "
                            "%s shares it with them (a shared Sandbox of this provider is one trust domain)",
                            namespace, name, handle.provider, handle.id, workflow)
        # Holder unchanged (compare-and-swap): a Sandbox taken by another Workflow meanwhile is not marked as ours.
        if not await self.records.swap_holder(namespace, uid, workflow, workflow, also={CLEARED_FOR: mark}):
            raise SandboxHeld(f"Sandbox {namespace}/{name} changed hands while its processes were being ended")
