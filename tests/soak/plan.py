"""The soak's seeded plan: which Workflows run (and what their script implies for their end), and the fault
schedule. Everything random comes from one ``random.Random(seed)``, so a seed replays the same plan."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

WorkflowKind = Literal["loss", "e2b", "flow", "delete", "cancel", "suspend"]
FaultKind = Literal["operator-kill", "e2b-fail", "e2b-timeout", "e2b-loss", "apiserver-restart"]
WORKFLOW_KINDS: tuple[WorkflowKind, ...] = ("loss", "e2b", "flow", "delete", "cancel", "suspend")
FAULT_KINDS: tuple[FaultKind, ...] = ("operator-kill", "e2b-fail", "e2b-timeout", "e2b-loss", "apiserver-restart")
# What ends each kind: a Workflow that is deleted mid-run must be gone (its finalizer done), not in a phase.
EXPECTED: dict[WorkflowKind, str] = {
    "loss": "Succeeded", "e2b": "Succeeded", "flow": "Succeeded", "suspend": "Succeeded",
    "cancel": "Cancelled", "delete": "Gone",
}


@dataclass(frozen=True)
class WorkflowScript:
    name: str
    kind: WorkflowKind
    calls: int  # tool calls of a manifest (0 for the entrypoint workflow)
    snapshot_every: int
    loss_after: int | None  # injectLossAfterNCalls (local provider only)
    gate_at: int | None  # index of the call that blocks on the Workflow's gate file (delete, cancel, suspend)
    retain: bool  # retainLatestSnapshot
    provider: Literal["local", "e2b"]
    nap_seconds: float  # the entrypoint workflow's durable timer

    @property
    def expected(self) -> str:
        return EXPECTED[self.kind]


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    after_progress: int  # side effects that must happen after the previous fault before this one
    choice: int  # seeded pick among the candidates when the fault fires (which operator, which sandbox)
    status: int  # e2b-fail: the HTTP status the create answers


@dataclass(frozen=True)
class SoakPlan:
    seed: int
    workflows: tuple[WorkflowScript, ...]
    faults: tuple[Fault, ...]

    def describe(self) -> str:
        kinds = {k: sum(w.kind == k for w in self.workflows) for k in WORKFLOW_KINDS}
        faults = {k: sum(f.kind == k for f in self.faults) for k in FAULT_KINDS}
        return f"seed {self.seed}: {len(self.workflows)} Workflows {kinds}; faults {faults}"


def _workflow(rng: random.Random, i: int, kind: WorkflowKind) -> WorkflowScript:
    name = f"soak-{i:03d}-{kind}"
    calls = rng.randint(4, 6) if kind != "flow" else 0
    # Loss injection needs the local provider; e2b's faults need e2b work throughout, so every other kind runs
    # on either.
    on_e2b = kind == "e2b" or (kind != "loss" and rng.random() < 0.5)
    provider: Literal["local", "e2b"] = "e2b" if on_e2b else "local"
    gate_at = rng.randint(1, calls - 2) if kind in ("delete", "cancel", "suspend") else None
    return WorkflowScript(
        name=name,
        kind=kind,
        calls=calls,
        snapshot_every=rng.choice((1, 2)) if kind != "flow" else 1,
        loss_after=rng.randint(2, calls) if kind == "loss" else None,
        gate_at=gate_at,
        retain=kind in ("loss", "e2b") and rng.random() < 0.3,
        provider=provider,
        nap_seconds=round(rng.uniform(0.5, 3.0), 1),
    )


def make_plan(seed: int, workflows: int, faults_per_kind: int,
              fault_kinds: tuple[FaultKind, ...] = FAULT_KINDS) -> SoakPlan:
    rng = random.Random(seed)
    # Kinds in rounds, shuffled within each round: every kind runs throughout the soak, so e2b faults always
    # have e2b work to hit.
    kinds: list[WorkflowKind] = []
    while len(kinds) < workflows:
        round_: list[WorkflowKind] = [*WORKFLOW_KINDS, "e2b"]  # e2b twice per round: its faults need creates to fire on
        rng.shuffle(round_)
        kinds.extend(round_)
    scripts = tuple(_workflow(rng, i, kind) for i, kind in enumerate(kinds[:workflows]))
    chosen = [k for k in fault_kinds for _ in range(faults_per_kind)]
    rng.shuffle(chosen)
    faults = tuple(
        Fault(kind=k, after_progress=rng.randint(1, 2), choice=rng.randrange(1 << 30),
              status=rng.choice((429, 500, 502, 503)))
        for k in chosen
    )
    return SoakPlan(seed=seed, workflows=scripts, faults=faults)
