"""The soak's driver: applies the plan's Workflows a few at a time, steers each one as its script says (delete,
cancel, suspend and resume, signal), and injects the plan's faults in order, each once enough side effects
happened since the previous one. One loop polls the cluster (through the control plane's own apiserver, which
the soak never restarts) and the host files; it waits on conditions, never on time."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.e2e.conftest import ControlPlane
from tests.e2e.operator_support import OperatorProcess
from tests.fakes.e2b_state import FakeState
from tests.soak.apiserver import RestartableAPIServer
from tests.soak.plan import FAULT_KINDS, Fault, SoakPlan, WorkflowScript
from tests.soak.workloads import gate_file, signal_value, workflow_manifest

T = TypeVar("T")
POLL_S = 0.3
FAULT_DEADLINE_S = 240.0  # a fault must fire, and the next become due, within this


class SoakFailure(AssertionError):
    pass


@dataclass
class Tracked:
    script: WorkflowScript
    applied: bool = False
    done: bool = False
    acted: bool = False  # the script's action (delete, cancel, suspend) was taken
    resumed: bool = False
    signalled: bool = False
    saw_suspended: bool = False
    gone: bool = False
    final: dict[str, Any] | None = None  # the object when it was seen done


@dataclass
class FakeE2B:
    """The fake E2B's state and the event loop thread it is served from: every mutation runs on that loop."""

    state: FakeState
    loop: asyncio.AbstractEventLoop

    def call(self, fn: Callable[[FakeState], T]) -> T:
        async def run() -> T:
            return fn(self.state)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)


@dataclass
class Soak:
    plan: SoakPlan
    cp: ControlPlane
    namespace: str
    apiserver: RestartableAPIServer
    fake: FakeE2B
    operators: list[OperatorProcess]
    effects_dir: Path
    gates_dir: Path
    max_active: int
    log: Callable[[str], None]
    tracked: dict[str, Tracked] = field(default_factory=dict)
    injected: dict[str, int] = field(default_factory=lambda: {k: 0 for k in FAULT_KINDS})
    unexpected_exits: list[str] = field(default_factory=list)
    next_fault: int = 0
    progress_at_fault: int = 0
    fault_due_since: float = field(default_factory=time.monotonic)
    restarts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tracked = {w.name: Tracked(w) for w in self.plan.workflows}
        self.effects_dir.mkdir(parents=True, exist_ok=True)
        self.gates_dir.mkdir(parents=True, exist_ok=True)

    def fail(self, message: str) -> SoakFailure:
        return SoakFailure(f"[soak seed {self.plan.seed}] {message}")

    # ------------------------------------------------------------------------------------------- observing

    def progress(self) -> int:
        """Side effects so far: executions of calls and steps, summed over every Workflow's effects file."""
        total = 0
        for path in self.effects_dir.iterdir():
            total += path.read_bytes().count(b"\n")
        return total

    def workflows(self) -> dict[str, dict[str, Any]]:
        out = self.cp.kubectl_json("get", "workflows", "-n", self.namespace)
        return {o["metadata"]["name"]: o for o in out["items"]}

    # ------------------------------------------------------------------------------------------- steering

    def patch(self, name: str, patch: dict[str, Any]) -> None:
        self.cp.kubectl("patch", "workflow", name, "-n", self.namespace, "--type", "merge", "-p", json.dumps(patch))

    def steer(self, objs: dict[str, dict[str, Any]]) -> None:
        for t in self.tracked.values():
            if not t.applied or t.done:
                continue
            s = t.script
            obj = objs.get(s.name)
            if obj is None:
                t.gone = t.done = True
                continue
            st = obj.get("status") or {}
            phase = st.get("phase")
            in_flight = (st.get("currentCall") or {}).get("index")
            if s.kind in ("delete", "cancel", "suspend") and not t.acted and in_flight == s.gate_at:
                t.acted = True
                if s.kind == "delete":
                    self.cp.kubectl("delete", "workflow", s.name, "-n", self.namespace, "--wait=false")
                elif s.kind == "cancel":
                    self.patch(s.name, {"spec": {"cancel": True}})
                else:
                    self.patch(s.name, {"spec": {"suspend": True}})
                    gate_file(self.gates_dir, s).touch()  # the call in flight ends; the run stops at the boundary
                continue
            if s.kind == "suspend" and t.acted and not t.resumed and phase == "Suspended":
                t.saw_suspended = t.resumed = True
                self.patch(s.name, {"spec": {"suspend": False}})
                continue
            if s.kind == "flow" and not t.signalled and any(
                    c.get("id") == "approval" for c in st.get("pendingCallbacks") or []):
                t.signalled = True
                self.patch(s.name, {"spec": {"signals": {"approval": signal_value(s)}}})
                continue
            if phase in ("Succeeded", "Failed", "Cancelled") and not (s.kind == "delete" and t.acted):
                t.done, t.final = True, obj

    def starved(self) -> bool:
        """Whether the faults in play (the next one, and the last one until it took effect) have nothing to hit:
        no Workflow running (for progress), or none on e2b for an e2b fault."""
        kinds = [f.kind for f in self.plan.faults[max(0, self.next_fault - 1):self.next_fault + 1]]
        active = [t for t in self.tracked.values() if t.applied and not t.done]
        if any(k.startswith("e2b-") for k in kinds) and not any(t.script.provider == "e2b" for t in active):
            return True
        return not active

    def apply_more(self) -> None:
        """Keep ``max_active`` Workflows applied and not yet ended, in the plan's order."""
        active = sum(t.applied and not t.done for t in self.tracked.values())
        for t in self.tracked.values():
            if active >= self.max_active:
                return
            if t.applied:
                continue
            self.cp.apply(workflow_manifest(t.script, self.effects_dir, self.gates_dir), "-n", self.namespace)
            t.applied = True
            active += 1

    def supervise(self) -> None:
        """An operator that exited without being killed is noted (with its exit code) and restarted."""
        for op in self.operators:
            if op.process is not None and not op.alive():
                self.unexpected_exits.append(f"{op.log_path.stem} exited {op.process.returncode}")
                self.log(f"operator {op.log_path.stem} exited on its own with {op.process.returncode}; restarting it")
                self.restart(op)

    def restart(self, op: OperatorProcess) -> None:
        # A new process gets a new identity, as a restarted Pod's default worker id (host:pid:random) would.
        name = op.log_path.stem
        self.restarts[name] = self.restarts.get(name, 0) + 1
        op.args[op.args.index("--worker-id") + 1] = f"{name}-gen{self.restarts[name]}"
        op.start()

    # ------------------------------------------------------------------------------------------- faults

    def fired(self, fault: Fault) -> bool:
        """Whether an armed fault has taken effect (a kill or a restart does at once)."""
        if fault.kind == "e2b-fail":
            return self.fake.call(lambda s: not s.request_faults)
        if fault.kind == "e2b-timeout":
            return self.fake.call(lambda s: s.request_stalls == 0)
        return True

    def inject(self, fault: Fault) -> bool:
        """Inject ``fault``; False when it cannot be yet (no live sandbox to lose)."""
        if fault.kind == "operator-kill":
            alive = [op for op in self.operators if op.alive()]
            victim = alive[fault.choice % len(alive)]
            victim.kill()
            self.restart(victim)
        elif fault.kind == "apiserver-restart":
            self.apiserver.restart()
        elif fault.kind == "e2b-fail":
            retry_after = "0" if fault.status in (429, 503) else None
            self.fake.call(lambda s: s.fail_requests(fault.status, retry_after=retry_after))
        elif fault.kind == "e2b-timeout":
            self.fake.call(lambda s: s.stall_requests())
        elif fault.kind == "e2b-loss":
            running = self.fake.call(lambda s: sorted(i for i, sb in s.sandboxes.items() if sb.state == "running"))
            if not running:
                return False
            victim_id = running[fault.choice % len(running)]
            self.fake.call(lambda s: s.kill(victim_id))
        self.injected[fault.kind] += 1
        return True

    def maybe_inject(self) -> None:
        if self.next_fault >= len(self.plan.faults):
            return
        now = time.monotonic()
        if self.next_fault > 0 and not self.fired(self.plan.faults[self.next_fault - 1]):
            self.check_fault_deadline(now, "to take effect", self.plan.faults[self.next_fault - 1])
            return
        fault = self.plan.faults[self.next_fault]
        progress = self.progress()
        if progress - self.progress_at_fault < fault.after_progress or not self.inject(fault):
            self.check_fault_deadline(now, "to become due", fault)
            return
        self.log(f"fault {self.next_fault + 1}/{len(self.plan.faults)}: {fault.kind} (progress {progress})")
        self.next_fault += 1
        self.progress_at_fault = progress
        self.fault_due_since = now

    def check_fault_deadline(self, now: float, what: str, fault: Fault) -> None:
        if now - self.fault_due_since > FAULT_DEADLINE_S:
            raise self.fail(f"fault {self.next_fault} ({fault.kind}) waited over {FAULT_DEADLINE_S:.0f}s {what}; "
                            f"{self.summary()}")

    # ------------------------------------------------------------------------------------------- loop

    def summary(self) -> str:
        pending = [f"{t.script.name}(applied={t.applied})" for t in self.tracked.values() if not t.done]
        return (f"faults injected {self.injected}, {self.next_fault}/{len(self.plan.faults)} of the schedule; "
                f"not done: {pending[:20]}")

    def run(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.supervise()
            try:
                objs = self.workflows()
            except (AssertionError, subprocess.TimeoutExpired) as exc:
                raise self.fail(f"listing Workflows failed: {exc}") from None
            self.steer(objs)
            self.apply_more()
            self.maybe_inject()
            if self.next_fault >= len(self.plan.faults) and all(t.done for t in self.tracked.values()):
                return
            if all(t.applied for t in self.tracked.values()) and self.starved() and self.next_fault < len(
                    self.plan.faults):
                raise self.fail(f"every Workflow has been applied and the faults left have nothing to hit: the plan "
                                f"has too few Workflows for its faults (raise --soak-workflows); {self.summary()}")
            if time.monotonic() > deadline:
                raise self.fail(f"the soak did not finish within {timeout:.0f}s: {self.summary()}")
            time.sleep(POLL_S)  # the polling interval of this condition loop (as wait_until's)
