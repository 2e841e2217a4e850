"""Sandbox resources (issue 11): a long-lived sandbox as a custom resource, kept by `dsb operator`.

Acceptance 2 (suspend = snapshot + destroy, resume = restore, superseded snapshot deleted after the new
one is recorded), 3 (lease renewal; a sandbox killed out of band re-created from its newest snapshot),
4 (delete while the provider refuses cleanup: CleanupBlocked, then success) and 6 (operator SIGKILLed
during provision and during suspend: exactly one sandbox or one snapshot after the restart). The local
provider's inventory is read from DURABLE_SANDBOX_HOME, and tool calls reach the sandbox through the
provider's own API from this process (as a Workflow's session would).
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.providers.contract import SandboxHandle, ToolCall
from durable_sandbox.providers.local import LocalProvider
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    OperatorProcess,
    event_time,
    fake_e2b,
    local_sandboxes,
    manifest,
    namespace,
    operators,
    replica_of,
)
from tests.e2e.operator_support import status as workflow_status
from tests.e2e.operator_support import wait_condition as wait_workflow
from tests.e2e.sandbox_support import get, sandbox, set_suspend, status, wait_for
from tests.fakes.e2b_state import FakeState

__all__ = ["fake_e2b", "namespace", "operators"]  # fixtures


def event_messages(cp: ControlPlane, ns: str, name: str) -> list[tuple[str, str]]:
    out = cp.kubectl_json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name},involvedObject.kind=Sandbox")
    return [(e["reason"], e["message"]) for e in sorted(out.get("items", []), key=event_time)]


def reasons(cp: ControlPlane, ns: str, name: str) -> list[str]:
    return [reason for reason, _ in event_messages(cp, ns, name)]


def workspaces(home: Path) -> list[str]:
    return [s.split("/")[-1] for s in local_sandboxes(home) if s.startswith("local/workspaces/")]


def snapshots(home: Path) -> list[str]:
    return [s.split("/")[-1].removesuffix(".tar") for s in local_sandboxes(home) if s.startswith("local/snapshots/")]


def run_call(home: Path, provider_id: str, call_type: str, **args: Any) -> tuple[int, str]:
    """A tool call in the Sandbox's live sandbox, through the local provider's API."""
    async def go() -> tuple[int, str]:
        provider = LocalProvider(home=home)
        result = await provider.execute(SandboxHandle(id=provider_id, provider="local"),
                                        ToolCall(operation_id=f"test-{call_type}-{args.get('path')}", type=call_type, args=args))
        return result.exit_code, result.stdout

    return asyncio.run(go())


def delete_and_wait(cp: ControlPlane, ns: str, name: str) -> None:
    cp.kubectl("delete", "dsbx", name, "-n", ns, "--wait=false")
    wait_until(lambda: get(cp, ns, name) is None, 90, f"Sandbox {ns}/{name} to be deleted")


@dataclass
class Scene:
    """What every test here starts from: the control plane, its namespace, operator replicas to start
    (``start`` is the ``operators`` fixture), and the Sandbox steps they all take."""

    cp: ControlPlane
    ns: str
    start: Any

    def operator(self, *args: str, **kwargs: Any) -> OperatorProcess:
        """An operator replica that may use the local provider."""
        op: OperatorProcess = self.start("--allow-local-provider", *args, **kwargs)
        return op

    def ready(self, name: str, **spec: Any) -> dict[str, Any]:
        """Apply Sandbox ``name`` and wait until it is Ready; returns its status."""
        self.cp.apply(sandbox(name, **spec), "-n", self.ns)
        return wait_for(self.cp, self.ns, name, "Ready")

    def delete_leaving_nothing(self, name: str, home: Path) -> None:
        """Delete Sandbox ``name``: it goes, and the provider's inventory is empty (acceptance 4)."""
        delete_and_wait(self.cp, self.ns, name)
        assert local_sandboxes(home) == [], f"Sandbox {name} left provider objects behind"


@pytest.fixture
def scene(control_plane: ControlPlane, namespace: str, operators: Any) -> Scene:
    return Scene(control_plane, namespace, operators)


def workflow(name: str, sandbox_name: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return manifest(name, toolCalls=calls, sandbox=None, sandboxRef={"name": sandbox_name}, snapshotEveryNCalls=None)


def gated(gate: Path) -> dict[str, Any]:
    """A call that runs until the test creates ``gate`` (so a Workflow holds the Sandbox meanwhile)."""
    return {"type": "shell", "command": f"while [ ! -e {gate} ]; do sleep 0.05; done"}


def test_workflows_share_a_sandbox_one_at_a_time_and_leave_it_alive(scene: Scene, tmp_path: Path) -> None:
    cp, ns = scene.cp, scene.ns
    op = scene.operator()
    live = scene.ready("shared")["providerId"]
    gate = tmp_path / "gate"
    cp.apply(workflow("writer", "shared", [{"type": "write_file", "path": "out/a.txt", "contents": "from writer\n"},
                                           gated(gate)]), "-n", ns)
    wait_until(lambda: status(cp, ns, "shared").get("holder") == "writer", 60, "the writer to hold the Sandbox")
    cp.apply(workflow("reader", "shared", [{"type": "read_file", "path": "out/a.txt"}]), "-n", ns)

    def reader_waits() -> dict[str, Any] | None:
        ready = next((c for c in workflow_status(cp, ns, "reader").get("conditions") or [] if c["type"] == "Ready"), None)
        return ready if ready and ready["reason"] == "WaitingForSandbox" else None

    ready = wait_until(reader_waits, 60, "the reader to wait for the Sandbox")
    assert "'writer'" in ready["message"] and ready["status"] == "False"
    gate.touch()
    wait_workflow(cp, ns, "writer", "Succeeded")
    wait_workflow(cp, ns, "reader", "Succeeded")
    result = workflow_status(cp, ns, "reader")["result"]
    assert result["sandboxId"] == live and result["toolResults"][0]["stdout"] == "from writer\n"
    assert workflow_status(cp, ns, "writer")["result"]["sandboxId"] == live

    # Deleting the Workflows leaves the Sandbox and its live sandbox alone.
    cp.kubectl("delete", "workflow", "writer", "reader", "-n", ns, "--wait=true", "--timeout=90s")
    st = status(cp, ns, "shared")
    assert st["providerId"] == live and st["phase"] == "Ready" and not st.get("holder")
    assert workspaces(op.home) == [live]
    assert run_call(op.home, live, "read_file", path="out/a.txt") == (0, "from writer\n")

    scene.delete_leaving_nothing("shared", op.home)


def test_deleting_a_held_sandbox_waits_for_the_workflow(scene: Scene, tmp_path: Path) -> None:
    cp, ns = scene.cp, scene.ns
    op = scene.operator()
    live = scene.ready("busy")["providerId"]
    gate = tmp_path / "gate"
    cp.apply(workflow("holder", "busy", [gated(gate)]), "-n", ns)
    wait_until(lambda: (workflow_status(cp, ns, "holder").get("currentCall") or {}).get("index") == 0, 60,
               "the holder's call to be in flight")
    # Suspending it now would destroy the sandbox under the running Workflow: deferred, and said so.
    set_suspend(cp, ns, "busy", True)
    st = wait_for(cp, ns, "busy", "Suspended", "false")
    deferred = next(c for c in st["conditions"] if c["type"] == "Suspended")
    assert deferred["reason"] == "HeldByWorkflow" and "Workflow holder" in deferred["message"]
    assert status(cp, ns, "busy")["providerId"] == live and workspaces(op.home) == [live]
    set_suspend(cp, ns, "busy", False)
    cp.kubectl("delete", "dsbx", "busy", "-n", ns, "--wait=false")
    st = wait_for(cp, ns, "busy", "CleanupBlocked")
    blocked = next(c for c in st["conditions"] if c["type"] == "CleanupBlocked")
    assert blocked["reason"] == "HeldByWorkflow" and "Workflow holder" in blocked["message"]
    assert "CleanupBlocked" in reasons(cp, ns, "busy")
    assert get(cp, ns, "busy") is not None and workspaces(op.home) == [live]

    gate.touch()
    wait_workflow(cp, ns, "holder", "Succeeded")
    wait_until(lambda: get(cp, ns, "busy") is None, 120, "the Sandbox to be deleted once the Workflow ended")
    assert local_sandboxes(op.home) == []


def test_suspend_snapshots_and_destroys_resume_restores_and_superseded_snapshot_goes(scene: Scene) -> None:
    cp, ns = scene.cp, scene.ns
    op = scene.operator()
    st = scene.ready("dev-box")
    first = st["providerId"]
    assert workspaces(op.home) == [first] and snapshots(op.home) == []
    assert "snapshot" in st["capabilities"]["supported"]
    assert st["leaseExpiresAt"] and st["observedGeneration"] == 1
    table = cp.kubectl("get", "dsbx", "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "PROVIDER", "READY", "STATE", "SINCE", "AGE"], table
    assert table[1].split()[:4] == ["dev-box", "Ready", "local", "True"], table

    assert run_call(op.home, first, "write_file", path="notes.txt", contents="kept across suspend\n")[0] == 0

    set_suspend(cp, ns, "dev-box", True)
    st = wait_for(cp, ns, "dev-box", "Suspended")
    assert st["phase"] == "Suspended" and not st.get("providerId")
    assert workspaces(op.home) == [] and snapshots(op.home) == st["snapshots"] and len(st["snapshots"]) == 1
    first_snapshot = st["snapshots"][0]
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["observedGeneration"] == 2

    set_suspend(cp, ns, "dev-box", False)
    st = wait_for(cp, ns, "dev-box", "Ready")
    second = st["providerId"]
    assert second != first and workspaces(op.home) == [second]
    assert run_call(op.home, second, "read_file", path="notes.txt") == (0, "kept across suspend\n")

    # Suspend again: the new snapshot is recorded, then the superseded one is deleted.
    set_suspend(cp, ns, "dev-box", True)
    wait_until(lambda: status(cp, ns, "dev-box").get("phase") == "Suspended"
               and status(cp, ns, "dev-box").get("snapshots", [first_snapshot]) != [first_snapshot], 90, "a second suspend")
    st = status(cp, ns, "dev-box")
    assert len(st["snapshots"]) == 1 and st["snapshots"] != [first_snapshot]
    assert snapshots(op.home) == st["snapshots"] and workspaces(op.home) == []
    events = reasons(cp, ns, "dev-box")
    assert events.count("SnapshotTaken") == 2 and "SnapshotDeleted" in events

    scene.delete_leaving_nothing("dev-box", op.home)


def test_lease_is_renewed_and_a_sandbox_killed_out_of_band_is_recreated_from_the_newest_snapshot(scene: Scene) -> None:
    cp, ns = scene.cp, scene.ns
    op = scene.operator()
    st = scene.ready("leased", leaseSeconds=5)
    live, first_expiry = st["providerId"], st["leaseExpiresAt"]
    # Several lease periods later the same sandbox is alive: its lease was renewed each time.
    wait_until(lambda: status(cp, ns, "leased").get("leaseExpiresAt", "") >= _plus(first_expiry, 15), 60,
               "the lease to be renewed over three lease periods")
    assert asyncio.run(LocalProvider(home=op.home).cleanup_expired()) == []  # nothing expired
    assert status(cp, ns, "leased")["providerId"] == live and workspaces(op.home) == [live]

    # Take a snapshot (suspend + resume), write after it, then kill the sandbox behind the operator's back.
    run_call(op.home, live, "write_file", path="before.txt", contents="in the snapshot\n")
    set_suspend(cp, ns, "leased", True)
    wait_for(cp, ns, "leased", "Suspended")
    set_suspend(cp, ns, "leased", False)
    st = wait_for(cp, ns, "leased", "Ready")
    resumed, newest = st["providerId"], st["snapshots"][-1]
    run_call(op.home, resumed, "write_file", path="after.txt", contents="not in the snapshot\n")
    asyncio.run(LocalProvider(home=op.home).inject_loss(SandboxHandle(id=resumed, provider="local")))

    wait_until(lambda: "Recovered" in reasons(cp, ns, "leased"), 60, "a Recovered event")
    st = wait_for(cp, ns, "leased", "Ready")
    recovered = st["providerId"]
    # (Events have one-second timestamps, so their messages say the order: lost, then recovered into a new one.)
    messages = {reason: message for reason, message in event_messages(cp, ns, "leased")}
    assert f"sandbox {resumed} is gone" in messages["SandboxLost"] and newest in messages["SandboxLost"]
    assert messages["Recovered"] == f"sandbox {resumed} recovered into {recovered} from snapshot {newest}"
    assert recovered not in (live, resumed) and workspaces(op.home) == [recovered]
    assert st["snapshots"] == [newest]
    assert run_call(op.home, recovered, "read_file", path="before.txt") == (0, "in the snapshot\n")
    assert run_call(op.home, recovered, "read_file", path="after.txt")[0] == 1

    scene.delete_leaving_nothing("leased", op.home)


def test_delete_while_the_provider_refuses_cleanup_is_blocked_then_completes(scene: Scene) -> None:
    cp, ns = scene.cp, scene.ns
    op = scene.operator()
    scene.ready("stubborn")
    set_suspend(cp, ns, "stubborn", True)
    st = wait_for(cp, ns, "stubborn", "Suspended")
    (snap,) = st["snapshots"]
    # Make the provider refuse: the snapshot's file becomes a non-empty directory it cannot unlink.
    path = op.home / "local" / "snapshots" / f"{snap}.tar"
    aside = path.with_name("aside")
    path.rename(aside)
    path.mkdir()
    (path / "blocker").write_text("x")

    cp.kubectl("delete", "dsbx", "stubborn", "-n", ns, "--wait=false")
    st = wait_for(cp, ns, "stubborn", "CleanupBlocked")
    blocked = next(c for c in st["conditions"] if c["type"] == "CleanupBlocked")
    assert snap in blocked["message"] and "retrying" in blocked["message"]
    assert "CleanupBlocked" in reasons(cp, ns, "stubborn")
    assert get(cp, ns, "stubborn") is not None  # the finalizer holds the object

    shutil.rmtree(path)
    aside.rename(path)  # the provider recovers
    wait_until(lambda: get(cp, ns, "stubborn") is None, 120, "the Sandbox to be deleted once cleanup succeeds")
    assert local_sandboxes(op.home) == []


def test_operator_killed_during_provision_leaves_exactly_one_sandbox(scene: Scene) -> None:
    cp, ns = scene.cp, scene.ns
    crashing = scene.operator(fault="inside:sandbox.provision", name="crashing")
    cp.apply(sandbox("crashy"), "-n", ns)
    assert crashing.wait_exit(90) == -9
    # The sandbox was made but not recorded: the intent was.
    assert len(workspaces(crashing.home)) == 1
    st = status(cp, ns, "crashy")
    assert st["operation"]["kind"] == "provision" and not st.get("providerId")

    op = scene.operator(name="restarted")
    st = wait_for(cp, ns, "crashy", "Ready")
    assert workspaces(op.home) == [st["providerId"]] and not st.get("operation")

    scene.delete_leaving_nothing("crashy", op.home)


def test_operator_killed_during_suspend_leaves_exactly_one_snapshot(scene: Scene) -> None:
    cp, ns = scene.cp, scene.ns
    crashing = scene.operator(fault="inside:sandbox.suspend", name="crashing")
    st = scene.ready("pausing")
    run_call(crashing.home, st["providerId"], "write_file", path="work.txt", contents="survives\n")
    set_suspend(cp, ns, "pausing", True)
    assert crashing.wait_exit(90) == -9
    assert len(snapshots(crashing.home)) == 1 and status(cp, ns, "pausing")["operation"]["kind"] == "snapshot"

    op = scene.operator(name="restarted")
    st = wait_for(cp, ns, "pausing", "Suspended")
    assert workspaces(op.home) == [] and snapshots(op.home) == st["snapshots"] and len(st["snapshots"]) == 1
    set_suspend(cp, ns, "pausing", False)
    st = wait_for(cp, ns, "pausing", "Ready")
    assert run_call(op.home, st["providerId"], "read_file", path="work.txt") == (0, "survives\n")

    scene.delete_leaving_nothing("pausing", op.home)


def _plus(stamp: str, seconds: int) -> str:
    import datetime as dt

    when = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ") + dt.timedelta(seconds=seconds)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_e2b_sandbox_shared_suspended_resumed_and_deleted_through_a_refusal(scene: Scene, fake_e2b: FakeState) -> None:
    """Acceptance 5: scenarios 1, 2 and 4 with the e2b provider against the fake E2B server (suspend for
    e2b = snapshot + destroy: E2B's own pause does not bound a paused sandbox's lifetime)."""
    cp, ns = scene.cp, scene.ns
    # 2 requests per refused DELETE (E2B_RETRY_ATTEMPTS; by default 5, 7.5 s of backoff before CleanupBlocked).
    scene.start(env={"E2B_API_KEY": fake_e2b.api_key, "E2B_API_URL": fake_e2b.api_url,
                     "E2B_SANDBOX_URL": fake_e2b.sandbox_url, "E2B_RETRY_ATTEMPTS": "2"})
    live = scene.ready("cloud-box", provider="e2b", template="base")["providerId"]
    assert fake_e2b.live_sandboxes() == [live]
    cp.apply(workflow("writer", "cloud-box", [{"type": "write_file", "path": "a.txt", "contents": "from writer\n"}]), "-n", ns)
    wait_workflow(cp, ns, "writer", "Succeeded")
    cp.apply(workflow("reader", "cloud-box", [{"type": "read_file", "path": "a.txt"}]), "-n", ns)
    wait_workflow(cp, ns, "reader", "Succeeded")
    result = workflow_status(cp, ns, "reader")["result"]
    assert result["sandboxId"] == live and result["toolResults"][0]["stdout"] == "from writer\n"

    set_suspend(cp, ns, "cloud-box", True)
    st = wait_for(cp, ns, "cloud-box", "Suspended")
    assert fake_e2b.live_sandboxes() == [] and [s.id for s in fake_e2b.snapshots()] == st["snapshots"]
    set_suspend(cp, ns, "cloud-box", False)
    st = wait_for(cp, ns, "cloud-box", "Ready")
    assert fake_e2b.live_sandboxes() == [st["providerId"]] != [live]
    cp.apply(workflow("again", "cloud-box", [{"type": "read_file", "path": "a.txt"}]), "-n", ns)
    wait_workflow(cp, ns, "again", "Succeeded")
    assert workflow_status(cp, ns, "again")["result"]["toolResults"][0]["stdout"] == "from writer\n"

    cp.kubectl("delete", "workflow", "writer", "reader", "again", "-n", ns, "--wait=true", "--timeout=90s")
    assert status(cp, ns, "cloud-box")["providerId"] == st["providerId"]  # the Workflows leave the Sandbox alone
    fake_e2b.fail_deletes(503)
    cp.kubectl("delete", "dsbx", "cloud-box", "-n", ns, "--wait=false")
    blocked = wait_for(cp, ns, "cloud-box", "CleanupBlocked")
    assert next(c for c in blocked["conditions"] if c["type"] == "CleanupBlocked")["reason"] == "ProviderRefused"
    assert get(cp, ns, "cloud-box") is not None
    fake_e2b.allow_deletes()
    wait_until(lambda: get(cp, ns, "cloud-box") is None, 120, "the Sandbox to be deleted once E2B accepts deletes")
    assert fake_e2b.live_sandboxes() == [] and fake_e2b.snapshots() == []


def sandbox_lease(cp: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    """The lease (a Journal object) that says which operator replica reconciles Sandbox ``name``."""
    items = cp.kubectl_json("get", "journals", "-n", ns, "-l",
                            f"durable-sandbox.dev/part=lease,durable-sandbox.dev/sandbox={name}")["items"]
    assert len(items) <= 1, items
    return items[0] if items else None


def test_two_replicas_one_reconciles_and_the_other_takes_over_when_it_is_killed(scene: Scene) -> None:
    cp, ns = scene.cp, scene.ns
    replicas = {name: scene.operator(name=name) for name in ("r-a", "r-b")}  # one shared home
    st = scene.ready("contested")
    lease = sandbox_lease(cp, ns, "contested")
    assert lease is not None
    identity = lease["data"]["holder"]  # <worker-id>:<per-start nonce>
    holder = replica_of(identity)
    (other,) = set(replicas) - {holder}
    uid = get(cp, ns, "contested")["metadata"]["uid"]  # type: ignore[index]
    assert lease["metadata"]["name"] == f"dsbx.{uid}"
    assert [(o["kind"], o["uid"]) for o in lease["metadata"]["ownerReferences"]] == [("Sandbox", uid)]
    # The other replica tried and was turned away by the Lease (it says so), so it provisioned nothing.
    wait_until(lambda: f"reconciled by replica {identity}; this one waits" in replicas[other].logs(), 60,
               f"{other} to find the Sandbox's Lease held by {holder}")
    assert workspaces(replicas[holder].home) == [st["providerId"]]
    assert reasons(cp, ns, "contested").count("Provisioned") == 1

    replicas[holder].kill()  # SIGKILL: the Lease is not released, it runs out
    set_suspend(cp, ns, "contested", True)
    st = wait_for(cp, ns, "contested", "Suspended")
    taken = sandbox_lease(cp, ns, "contested")
    assert taken is not None and replica_of(taken["data"]["holder"]) == other
    assert int(taken["data"]["transitions"]) > int(lease["data"]["transitions"])
    assert workspaces(replicas[other].home) == [] and snapshots(replicas[other].home) == st["snapshots"]
    assert f"this replica ({taken['data']['holder']}) reconciles it now" in replicas[other].logs()

    scene.delete_leaving_nothing("contested", replicas[other].home)  # the survivor's cleanup
    wait_until(lambda: sandbox_lease(cp, ns, "contested") is None, 60, "the Lease to go with its Sandbox")


def test_the_sandbox_env_reaches_every_call_of_a_workflow_in_it_and_its_secret_nowhere_else(scene: Scene) -> None:
    cp, ns = scene.cp, scene.ns
    token = "tok-" + uuid.uuid4().hex  # a Secret's value: reaches the calls, never status, events or logs
    cp.kubectl("create", "secret", "generic", "box-creds", "-n", ns, f"--from-literal=token={token}")
    op = scene.operator()
    scene.ready("env-box", env=[{"name": "GREETING", "value": "hello from the Sandbox"},
                                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "box-creds", "key": "token"}}}])
    # The Workflow's calls run in the Sandbox's sandbox, through the operator's run engine (not the provider
    # object that made it): the env is the sandbox's, so every call sees it. The token is compared, not printed.
    digest = hashlib.sha256(token.encode()).hexdigest()
    cp.apply(workflow("uses-env", "env-box", [{"type": "shell", "command": 'echo "$GREETING"'},
                                              {"type": "shell", "command": 'printf %s "$TOKEN" | sha256sum | cut -c1-64'}]),
             "-n", ns)
    wait_workflow(cp, ns, "uses-env", "Succeeded")
    results = workflow_status(cp, ns, "uses-env")["result"]["toolResults"]
    assert [r["stdout"] for r in results] == ["hello from the Sandbox\n", f"{digest}\n"]

    seen = {
        "Sandbox": cp.kubectl("get", "dsbx", "env-box", "-n", ns, "-o", "json").stdout,
        "Workflow": cp.kubectl("get", "workflow", "uses-env", "-n", ns, "-o", "json").stdout,
        "Events": cp.kubectl("get", "events", "-n", ns, "-o", "json").stdout,
        "operator log": op.logs(),
        "journals": cp.kubectl("get", "journals,configmaps", "-n", ns, "-o", "json").stdout,
    }
    assert [where for where, text in seen.items() if token in text] == []
    cp.kubectl("delete", "workflow", "uses-env", "-n", ns, "--wait=true", "--timeout=90s")
    scene.delete_leaving_nothing("env-box", op.home)
