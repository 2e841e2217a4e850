"""What one soak run is: its seed, its size and the faults it injects (from options or the environment, read by
the ``soak_settings`` fixture of tests/soak/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.soak.plan import FAULT_KINDS, FaultKind

__all__ = ["SoakSettings"]


@dataclass(frozen=True)
class SoakSettings:
    seed: int
    workflows: int
    faults_per_kind: int
    fault_kinds: tuple[FaultKind, ...] = FAULT_KINDS  # --soak-fault-kinds picks fewer, e.g. to replay a seed
