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

from durable_sandbox.kube.handlers import UNSERVED_STOP
from durable_sandbox.kube.spec.plan import RUN_ID_LABEL
from durable_sandbox.sandboxes.session import MAX_RECOVERIES
from tests.e2e.apiserver_support import RestartableAPIServer
from tests.e2e.controlplane import ControlPlane
from tests.e2e.operator_support import OperatorProcess
from tests.fakes.e2b_state import FakeState
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
    suspend_generation: int | None = None  # metadata.generation of the spec.suspend patch
    gate_open: bool = False
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
    designed_stops: dict[str, int] = field(default_factory=dict)  # operator -> its UnservedResourcesGuard stops
    schedule: dict[str, list[Fault]] = field(default_factory=dict)  # each kind's part of the plan, in order
    progress_at: dict[str, int] = field(default_factory=lambda: {k: 0 for k in FAULT_KINDS})
    since: dict[str, float] = field(default_factory=lambda: {k: time.monotonic() for k in FAULT_KINDS})
    restarts: dict[str, int] = field(default_factory=dict)
    losses: dict[str, int] = field(default_factory=dict)  # run id -> its e2b sandboxes this soak killed

    def __post_init__(self) -> None:
        self.tracked = {w.name: Tracked(w) for w in self.plan.workflows}
        self.schedule = {k: [f for f in self.plan.faults if f.kind == k] for k in FAULT_KINDS}
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

    def patch(self, name: str, patch: dict[str, Any]) -> int:
        """Merge-patch the Workflow; returns the generation the patch made."""
        obj = self.cp.kubectl_json("patch", "workflow", name, "-n", self.namespace, "--type", "merge",
                                   "-p", json.dumps(patch))
        return int(obj["metadata"]["generation"])

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
                    t.suspend_generation = self.patch(s.name, {"spec": {"suspend": True}})
                continue
            if s.kind == "suspend" and t.acted and not t.gate_open and t.suspend_generation is not None and (
                    (st.get("observedGeneration") or 0) >= t.suspend_generation or phase == "Suspended"):
                # A suspend takes effect at the next call boundary after the replica executing the run has
                # seen it: the gated call ends only once status.observedGeneration says so (or once the run
                # is Suspended anyway: a replica that took it over saw the suspend before executing).
                t.gate_open = True
                gate_file(self.gates_dir, s).touch()
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
        """Whether faults are left that have nothing to hit: no Workflow running (for progress), or none on
        e2b for an e2b fault."""
        active = [t for t in self.tracked.values() if t.applied and not t.done]
        if any(self.remaining(k) for k in FAULT_KINDS if k.startswith("e2b-")) and not any(
                t.script.provider == "e2b" for t in active):
            return True
        return any(self.remaining(k) for k in FAULT_KINDS) and not active

    def paced_limit(self) -> int:
        """How many of the plan's Workflows may have been applied by now: ``max_active`` at the start, and the
        rest in step with the faults injected, so the Workflows are spread over the whole fault schedule. Applied
        as fast as they can run, they all ended while the slowest fault kind (an API server restart waits for
        /readyz) still had faults left, which then had no work to hit (CI, seed 1749772400)."""
        total_faults = len(self.plan.faults)
        rest = len(self.plan.workflows) - self.max_active
        if total_faults == 0 or rest <= 0:
            return len(self.plan.workflows)
        injected = sum(self.injected.values())
        return self.max_active + -(-rest * injected // total_faults)  # ceiling

    def needs_work(self, active: list[Tracked]) -> bool:
        """Whether the faults left need a Workflow the pacing would hold back: none is running (every fault
        waits on side effects), or an e2b fault is left and none running is on e2b."""
        if not active:
            return True
        e2b_left = any(self.remaining(k) for k in FAULT_KINDS if k.startswith("e2b-"))
        return e2b_left and not any(t.script.provider == "e2b" for t in active)

    def apply_more(self) -> None:
        """Keep up to ``max_active`` Workflows applied and not yet ended, in the plan's order, paced by the
        faults (``paced_limit``) unless the faults left would starve (``needs_work``)."""
        active = [t for t in self.tracked.values() if t.applied and not t.done]
        applied = sum(t.applied for t in self.tracked.values())
        for t in self.tracked.values():
            if len(active) >= self.max_active:
                return
            if t.applied:
                continue
            if applied >= self.paced_limit() and not self.needs_work(active):
                return
            self.cp.apply(workflow_manifest(t.script, self.effects_dir, self.gates_dir), "-n", self.namespace)
            t.applied = True
            active.append(t)
            applied += 1

    def supervise(self) -> None:
        """An operator that exited without being killed is restarted, as a Pod's container would be. It is
        noted as unexpected (a failure), unless it stopped by design: kopf's one read of discovery came while
        a restarted API server had not yet installed the CRDs' paths, and the operator exits 1 saying so
        (kube/handlers.py ``UnservedResourcesGuard``, docs/reliability.md) to be restarted."""
        for op in self.operators:
            if op.process is not None and not op.alive():
                name, code = op.log_path.stem, op.process.returncode
                stops = op.logs().count(UNSERVED_STOP)
                if code == 1 and stops > self.designed_stops.get(name, 0):
                    self.designed_stops[name] = stops
                    self.log(f"operator {name} stopped by design (kopf left the resources unserved); restarting it")
                else:
                    self.unexpected_exits.append(f"{name} exited {code}")
                    self.log(f"operator {name} exited on its own with {code}; restarting it")
                self.restart(op)

    def restart(self, op: OperatorProcess) -> None:
        # A new process gets a new identity, as a restarted Pod's default worker id (host:pid:random) would.
        name = op.log_path.stem
        self.restarts[name] = self.restarts.get(name, 0) + 1
        op.args[op.args.index("--worker-id") + 1] = f"{name}-gen{self.restarts[name]}"
        op.start()

    # ------------------------------------------------------------------------------------------- faults
    # Each fault kind follows its own part of the seeded schedule, independently of the others (an API server
    # restart in progress does not hold back a sandbox loss): a fault is injected once the previous one of its
    # kind has taken effect and enough side effects happened since.

    def fired(self, kind: str) -> bool:
        """Whether the last fault of ``kind`` has taken effect."""
        if kind == "e2b-fail":
            return self.fake.call(lambda s: not s.request_faults)
        if kind == "e2b-timeout":
            return self.fake.call(lambda s: s.request_stalls == 0)
        if kind == "apiserver-restart":
            return self.apiserver.ready()
        return True

    def inject(self, fault: Fault) -> bool:
        """Inject ``fault``; False when it cannot be yet (no live sandbox to lose)."""
        if fault.kind == "operator-kill":
            alive = [op for op in self.operators if op.alive()]
            victim = alive[fault.choice % len(alive)]
            victim.kill()
            self.restart(victim)
        elif fault.kind == "apiserver-restart":
            self.apiserver.kill()
            self.apiserver.launch()  # ready (fired) when /readyz answers again
        elif fault.kind == "e2b-fail":
            retry_after = "0" if fault.status in (429, 503) else None
            self.fake.call(lambda s: s.fail_requests(fault.status, retry_after=retry_after))
        elif fault.kind == "e2b-timeout":
            self.fake.call(lambda s: s.stall_requests())
        elif fault.kind == "e2b-loss":
            running = self.fake.call(lambda s: sorted(
                (i, sb.metadata.get(RUN_ID_LABEL, "")) for i, sb in s.sandboxes.items() if sb.state == "running"))
            # A run recovers from at most MAX_RECOVERIES sandbox losses and then fails by design
            # (RecoveryBudgetExhausted): never lose a sandbox of a run that many losses have hit already.
            running = [(i, run) for i, run in running if self.losses.get(run, 0) < MAX_RECOVERIES]
            if not running:
                return False
            victim_id, run_id = running[fault.choice % len(running)]
            self.losses[run_id] = self.losses.get(run_id, 0) + 1
            self.fake.call(lambda s: s.kill(victim_id))
        self.injected[fault.kind] += 1
        return True

    def remaining(self, kind: str) -> list[Fault]:
        return self.schedule[kind][self.injected[kind]:]

    def faults_left(self) -> bool:
        return any(self.remaining(k) for k in FAULT_KINDS) or not all(self.fired(k) for k in FAULT_KINDS)

    def maybe_inject(self) -> None:
        progress = self.progress()
        now = time.monotonic()
        for kind in FAULT_KINDS:
            left = self.remaining(kind)
            if not left:
                continue
            what = "to take effect" if not self.fired(kind) else "to become due"
            if what == "to become due" and progress - self.progress_at[kind] >= left[0].after_progress and (
                    self.inject(left[0])):
                done = sum(self.injected.values())
                self.log(f"fault {done}/{len(self.plan.faults)}: {kind} #{self.injected[kind]} (progress {progress})")
                self.progress_at[kind], self.since[kind] = progress, now
            elif now - self.since[kind] > FAULT_DEADLINE_S:
                raise self.fail(f"the next {kind} fault waited over {FAULT_DEADLINE_S:.0f}s for the last one {what}; "
                                f"{self.summary()}")

    # ------------------------------------------------------------------------------------------- loop

    def summary(self) -> str:
        """What was injected, and where each Workflow not done stands: the script's progress and the object."""
        try:
            objs = self.workflows()
        except (AssertionError, subprocess.TimeoutExpired):
            objs = {}
        pending = [self.describe(t, objs.get(t.script.name)) for t in self.tracked.values() if not t.done]
        return f"faults injected {self.injected} of {len(self.plan.faults)}; not done: {pending[:20]}"

    @staticmethod
    def describe(t: Tracked, obj: dict[str, Any] | None) -> str:
        steps = ",".join(k for k in ("applied", "acted", "gate_open", "resumed", "signalled") if getattr(t, k))
        if obj is None:
            return f"{t.script.name}({steps}; no object)"
        meta, st = obj.get("metadata") or {}, obj.get("status") or {}
        ready = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), {})
        return (f"{t.script.name}({steps}; generation {meta.get('generation')}, observed {st.get('observedGeneration')}, "
                f"phase {st.get('phase')}, call {(st.get('currentCall') or {}).get('index')}, "
                f"deleting {bool(meta.get('deletionTimestamp'))}, finalizers {meta.get('finalizers')}, "
                f"Ready {ready.get('reason')}: {ready.get('message')})")

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
            if not self.faults_left() and all(t.done for t in self.tracked.values()):
                return
            if all(t.applied for t in self.tracked.values()) and self.starved():
                raise self.fail(f"every Workflow has been applied and the faults left have nothing to hit: the plan "
                                f"has too few Workflows for its faults (raise --soak-workflows); {self.summary()}")
            if time.monotonic() > deadline:
                raise self.fail(f"the soak did not finish within {timeout:.0f}s: {self.summary()}")
            time.sleep(POLL_S)  # the polling interval of this condition loop (as wait_until's)
