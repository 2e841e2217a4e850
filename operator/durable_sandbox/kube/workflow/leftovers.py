"""What a finished run may have left behind, found by the providers' own owner tags and removed once.

A session's finalization deletes what the journal records; two things it cannot see: a snapshot or sandbox
whose creation answer never reached the journal (a timeout or a crash in between: the provider made it, the
journal only shows the attempt), and a session whose finalization was interrupted after its run's end was
decided. Both would wait for the Workflow's deletion (or the orphan sweep). So when a run is seen finished
here for the first time, the providers its journal pins are asked for this Workflow's sandboxes and snapshots
(tagged ``<namespace>/<uid>`` by the operator itself, never by a user) and everything but the snapshots the
journal says were retained goes. Status is not read: anyone granted ``workflows/status`` writes it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.kube.workflow.runs import RunView
from durable_sandbox.kube.workflow.wing import Wing
from durable_sandbox.providers.contract import Capability, tag_key
from durable_sandbox.sandboxes import journal

__all__ = ["remove_leftovers"]

log = logging.getLogger(__name__)


async def remove_leftovers(wing: Wing, view: RunView) -> int:
    """Destroy this Workflow's sandboxes and delete its snapshots that the journal does not retain, on the
    providers its journal pins; how many went. Never raises: what stays is the finalizer's and the orphan
    sweep's to remove."""
    if (view.latest().get("spec") or {}).get("sandboxRef"):
        return 0  # its calls ran in a Sandbox resource's sandbox: the Sandbox's, not this Workflow's
    try:
        rows = await wing.engines.engine_for(view.namespace).store.load_journal(view.run_id)
    except Exception as exc:  # a journal that cannot be read is said elsewhere (JournalDamaged); nothing to go by
        log.warning("run %s: no leftovers looked for (%s: %s)", view.run_id, type(exc).__name__, exc)
        return 0
    return await _remove(wing, view, rows)


async def _remove(wing: Wing, view: RunView, rows: Sequence[OperationRecord]) -> int:
    providers = {pinned[1] for row in rows if (pinned := journal.pinned_provider(row)) is not None}
    kept = {r.snapshot_id for row in rows if (r := journal.retained(row)) is not None}
    owner, removed = view.owner, 0
    for name in sorted(providers):
        try:
            async with wing.engines.provider_for_once(name) as provider:
                caps = provider.capabilities()
                if caps.supports(Capability.LEASE_RECONCILIATION):
                    for handle in await provider.list_sandboxes(owner):
                        await provider.destroy(handle)
                        removed += 1
                        log.warning("run %s: destroyed sandbox %s that its journal did not show destroyed",
                                    view.run_id, handle.id)
                if caps.supports(Capability.INVENTORY):
                    for entry in await provider.inventory_snapshots(wing.settings.installation_id):
                        if entry.owner_key == tag_key(owner) and entry.id not in kept:
                            await provider.delete_snapshot(entry.id)
                            removed += 1
                            log.warning("run %s: deleted snapshot %s that its journal did not show deleted",
                                        view.run_id, entry.id)
        except Exception as exc:  # the provider is away: the finalizer and the orphan sweep still remove them
            log.warning("run %s: could not look for leftovers on provider %s (%s: %s); the Workflow's deletion "
                        "or the orphan sweep removes them", view.run_id, name, type(exc).__name__, exc)
    return removed
