"""Issue 13, acceptance 3: the orphan sweep of `dsb operator --sweep-interval/--sweep-grace`, for the local provider
and for e2b (the fake E2B server's inventory).

Leftovers are made the way they happen: an operator SIGKILLed between the provider's create and the journal
commit (fault point ``provisioned:sandbox/provision``), another between a snapshot and its journal record
(``snapshot-taken:sandbox/snapshot/1``), each Workflow then deleted without its cleanup (finalizer removed, as
by hand or a force-cleaned namespace). Beside them in the same provider: a sandbox and a snapshot with no
installation label, and ones of another installation. A sweeping operator removes exactly the leftovers within
its sweep period plus grace, while a Workflow it is running keeps its sandbox; everything else is untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.controlplane import ControlPlane
from tests.e2e.operator_support import fake_e2b, namespace, operators
from tests.e2e.sweep_support import e2b_provider, local_provider, sweeps_leftovers
from tests.fakes.e2b_state import FakeState

__all__ = ["fake_e2b", "namespace", "operators"]  # fixtures


def test_orphan_sweeplocal_provider(control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path) -> None:
    sweeps_leftovers(control_plane, namespace, operators, local_provider(tmp_path / "home"), tmp_path)


def test_orphan_sweepe2b_provider(fake_e2b: FakeState, control_plane: ControlPlane, namespace: str, operators: Any,
                          tmp_path: Path) -> None:
    # fake_e2b first: it is torn down last, after the operators that talk to it have stopped.
    sweeps_leftovers(control_plane, namespace, operators, e2b_provider(fake_e2b), tmp_path)
