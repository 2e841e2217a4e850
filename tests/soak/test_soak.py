"""Issue 13, acceptance 4: the seeded chaos soak.

Workflows of every kind (tool-call manifests with snapshots and loss injection on the local provider, the
same on e2b against the fake E2B server, entrypoint workflows with a timer, a callback signalled through
spec.signals and a sandbox, and Workflows deleted, cancelled, or suspended and resumed mid-run) run on three
`dsb operator` processes while a seeded schedule SIGKILLs and restarts operators, fails E2B requests, stalls
creates past the client's timeout, loses E2B sandboxes and restarts the API server the operators talk to.
Then: every Workflow ended as its script implies, no committed call or step ran twice, every journal is
gapless, no sandbox or snapshot is left (but retained ones, until their Workflows are deleted) and no
finalizer is stuck.

CI runs 30 Workflows with 10 faults of each kind; `--soak-workflows N --soak-faults F --soak-seed S` (or
DSB_SOAK_*) run the long version or replay a seed (docs/reliability.md)."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.apiserver_support import RestartableAPIServer
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.journal_support import operator_journal
from tests.e2e.operator_support import OperatorProcess, local_sandboxes, namespace, operators
from tests.soak.checks import retained_snapshots, run_problems, snapshot_owners
from tests.soak.driver import FakeE2B, Soak
from tests.soak.plan import FAULT_KINDS, make_plan
from tests.soak.settings import SoakSettings

__all__ = ["namespace", "operator_journal", "operators"]  # fixtures

REPLICAS = 3
MAX_ACTIVE = 10  # Workflows applied and not yet ended at any moment
E2B_REQUEST_TIMEOUT_S = 5  # a stalled create times out (and is retried) in seconds, not E2B's default 30


def _say(message: str) -> None:
    print(f"soak: {message}", file=sys.stderr, flush=True)


@pytest.mark.timeout(3 * 3600)
# The harness checks every operator's log at the end of a test (issue 24). The soak provokes SIGKILLs at fault
# points, failed and stalled E2B requests and API server restarts on purpose, and judges the outcome by its own
# checks below; which of its operators' ERROR lines each fault explains has not been worked out yet, so its logs
# are exempt until that is done (remove this line to see them).
@pytest.mark.operator_log(r"", why="the soak's faults are on purpose; its lines are not sorted yet (issue 24)")
def test_chaos_soak_loses_nothing_runs_nothing_twice_and_leaks_nothing(
    soak_settings: SoakSettings, soak_e2b: FakeE2B, control_plane: ControlPlane, namespace: str, operators: Any,
    tmp_path: Path,
) -> None:
    plan = make_plan(soak_settings.seed, soak_settings.workflows, soak_settings.faults_per_kind,
                     soak_settings.fault_kinds)
    replay = (f"pytest tests/soak --soak-seed {plan.seed} --soak-workflows {soak_settings.workflows} "
              f"--soak-faults {soak_settings.faults_per_kind} --soak-fault-kinds {','.join(soak_settings.fault_kinds)}")
    _say(f"{plan.describe()}\nsoak: replay with: {replay}")
    started = time.monotonic()

    api = RestartableAPIServer(control_plane, tmp_path / "apiserver")
    api.start()
    fake = soak_e2b.state
    env = {"KUBECONFIG": str(api.kubeconfig), "E2B_API_KEY": fake.api_key, "E2B_API_URL": fake.api_url,
           "E2B_SANDBOX_URL": fake.sandbox_url, "E2B_REQUEST_TIMEOUT": str(E2B_REQUEST_TIMEOUT_S)}
    ops: list[OperatorProcess] = [
        operators("--allow-local-provider", "--workflows", "tests.soak.flows", env=env, name=f"soak-op-{i}")
        for i in range(1, REPLICAS + 1)
    ]
    soak = Soak(plan=plan, cp=control_plane, namespace=namespace, apiserver=api, fake=soak_e2b, operators=ops,
                effects_dir=tmp_path / "effects", gates_dir=tmp_path / "gates", max_active=MAX_ACTIVE, log=_say)
    try:
        # A deadline, not a pace: the Workflows are applied in step with the faults (driver.paced_limit), so the
        # soak lasts about as long as its fault schedule (each fault waits for the last to fire, up to
        # FAULT_DEADLINE_S) plus the last Workflows' run.
        soak.run(timeout=max(1200.0, 40.0 * len(plan.workflows)))
        tracked = list(soak.tracked.values())
        problems = run_problems(tracked, control_plane.kubeconfig, namespace, soak.effects_dir)

        # Every run has ended: nothing live anywhere, and only the snapshots kept on purpose.
        home = ops[0].home
        local = local_sandboxes(home)
        kept = retained_snapshots(tracked)
        live_local = [s for s in local if s.startswith("local/workspaces/")]
        local_snaps = [s for s in local if s.startswith("local/snapshots/")]
        live_e2b = soak_e2b.call(lambda s: s.live_sandboxes())
        e2b_snaps = soak_e2b.call(lambda s: [sn.id for sn in s.snapshots()])
        if live_local or live_e2b:
            # With each e2b sandbox's labels (run, session) and state: which run left it, for whoever replays.
            labels = soak_e2b.call(lambda s: {i: (s.sandboxes[i].state, s.sandboxes[i].metadata) for i in live_e2b
                                              if i in s.sandboxes})
            problems.append(f"live sandboxes after every run ended: local {live_local}, e2b {labels or live_e2b}")
        if len(local_snaps) != kept.get("local", 0) or len(e2b_snaps) != kept.get("e2b", 0):
            problems.append(f"snapshots left: local {local_snaps}, e2b {e2b_snaps}; retained on purpose: {kept}")
            keys = {m.group(1) for s in e2b_snaps if (m := re.search(r"dsb-[0-9a-f]{12}-([0-9a-f]{12})-", s))}
            problems.extend(snapshot_owners(tracked, control_plane.kubeconfig, namespace, keys))

        # Deleting every Workflow completes (no finalizer stuck) and takes the retained snapshots with it.
        control_plane.kubectl("delete", "workflows", "--all", "-n", namespace, "--wait=false")
        try:
            wait_until(lambda: not control_plane.kubectl_json("get", "workflows", "-n", namespace)["items"], 300,
                       "every Workflow to be deleted")
        except TimeoutError:
            stuck = [(o["metadata"]["name"], o["metadata"].get("finalizers"), (o.get("status") or {}).get("phase"))
                     for o in control_plane.kubectl_json("get", "workflows", "-n", namespace)["items"]]
            problems.append(f"Workflows stuck in deletion (finalizers): {stuck}")
        left = (local_sandboxes(home), soak_e2b.call(lambda s: s.live_sandboxes()),
                soak_e2b.call(lambda s: [sn.id for sn in s.snapshots()]))
        if any(left):
            problems.append(f"left after deleting every Workflow: local {left[0]}, e2b sandboxes {left[1]}, "
                            f"e2b snapshots {left[2]}")

        fired = {**soak.injected,
                 "e2b-fail": soak_e2b.call(lambda s: s.request_faults_fired),
                 "e2b-timeout": soak_e2b.call(lambda s: s.stalls_fired)}
        short = {k: n for k, n in fired.items() if k in soak_settings.fault_kinds and n < soak_settings.faults_per_kind}
        if short:
            problems.append(f"faults that took effect fewer than {soak_settings.faults_per_kind} times: {short}")
        if soak.unexpected_exits:
            problems.append(f"operators exited without being killed: {soak.unexpected_exits}")
        _say(json.dumps({"seed": plan.seed, "workflows": len(plan.workflows),
                         "faults": {k: fired[k] for k in FAULT_KINDS},
                         "seconds": round(time.monotonic() - started), "problems": len(problems)}))
        assert not problems, f"[soak seed {plan.seed}] replay: {replay}\n" + "\n".join(problems)
    finally:
        # Operators stop before the API server they talk to.
        for op in ops:
            op.stop()
        api.stop()
