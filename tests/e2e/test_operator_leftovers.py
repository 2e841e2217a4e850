"""A finished run's leftovers on its provider go when its end is seen (kube/workflow/leftovers.py), not at the
Workflow's deletion: a snapshot and a sandbox that the provider made for this Workflow but its journal does not
record (what a create whose answer was lost leaves) are removed once the run succeeds; the snapshot the journal
retains stays, and so does another Workflow's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from durable_sandbox.kube.sweep.sweeper import default_installation_id
from durable_sandbox.providers.contract import INSTALLATION_LABEL, SandboxSpec
from durable_sandbox.providers.local import LocalProvider
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    get,
    local_sandboxes,
    manifest,
    namespace,
    operators,
    status,
    wait_condition,
)

__all__ = ["namespace", "operators"]  # fixtures


async def _made_behind_the_journal(home: Path, namespace: str, owner: str, name: str) -> tuple[str, str]:
    """A live sandbox and a snapshot of it, tagged for ``owner`` by the operator's installation (an operator
    serving ``namespace``): (sandbox id, snapshot id)."""
    provider = LocalProvider(home=home)
    installation = default_installation_id([namespace])
    try:
        handle = await provider.provision(SandboxSpec(owner=owner, labels={INSTALLATION_LABEL: installation},
                                                      operation_id=f"lost-answer/{name}"), lease_seconds=600)
        return handle.id, await provider.snapshot(handle, operation_id=f"lost-answer/{name}/snapshot")
    finally:
        await provider.aclose()


def test_what_a_finished_run_left_unrecorded_goes_and_what_it_retains_stays(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    cp, home, gate, effects = control_plane, tmp_path / "home", tmp_path / "gate", tmp_path / "effects"
    operators("--allow-local-provider")
    calls = [{"type": "shell", "command": f"echo c1 >> {effects}"},
             {"type": "shell", "command": f"while [ ! -e {gate} ]; do sleep 0.05; done; echo c2 >> {effects}"}]
    cp.apply(manifest("leaves", toolCalls=calls, snapshotEveryNCalls=1, retainLatestSnapshot=True), "-n", namespace)
    wait_until(lambda: effects.exists() and effects.read_text().split() == ["c1"], 120, "the first call")
    uid = (get(cp, namespace, "leaves") or {})["metadata"]["uid"]
    stray_box, stray_snap = asyncio.run(_made_behind_the_journal(home, namespace, f"{namespace}/{uid}", "ours"))
    other_box, other_snap = asyncio.run(_made_behind_the_journal(home, namespace, f"{namespace}/another-uid", "theirs"))
    assert {f"local/workspaces/{stray_box}", f"local/workspaces/{other_box}"} <= set(local_sandboxes(home))

    gate.touch()
    wait_condition(cp, namespace, "leaves", "Succeeded")
    kept = status(cp, namespace, "leaves")["latestSnapshot"]
    assert kept and kept not in (stray_snap, other_snap)

    def stray_gone() -> bool:
        left = "\n".join(local_sandboxes(home))
        return stray_box not in left and stray_snap not in left
    wait_until(stray_gone, 60, f"the unrecorded sandbox and snapshot to go ({local_sandboxes(home)})")
    left = "\n".join(local_sandboxes(home))
    assert kept in left, "the retained snapshot stays until the Workflow is deleted"
    assert other_box in left and other_snap in left, "another Workflow's are not this run's to remove"
    assert effects.read_text().split() == ["c1", "c2"]
