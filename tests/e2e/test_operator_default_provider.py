"""Issue 23, "Defaults": a Workflow or Sandbox that names no provider gets the operator's --default-provider, pinned
when the operator first takes it up, so an operator restarted with another default keeps the running Workflow
(and the live Sandbox) on the provider it started with, and cleans up there; what names no provider afterwards
gets the new default, and is refused, saying so, when the operator cannot use it.

On the API server alone (no node, so no Pods): the two providers are e2b (against the fake E2B server, whose
commands run in temp workspaces here, so a gate file can hold a call in flight) and local."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.sandboxes import journal as session_journal
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.journal_support import OperatorJournal
from tests.e2e.operator_support import (
    condition,
    events,
    fake_e2b,
    get,
    local_sandboxes,
    manifest,
    namespace,
    operators,
    status,
    wait_condition,
    wait_gone,
    wait_in_flight,
)
from tests.e2e.sandbox_support import get as get_sandbox
from tests.e2e.sandbox_support import status as sandbox_status
from tests.e2e.sandbox_support import wait_for as wait_sandbox
from tests.fakes.e2b_state import FakeState

__all__ = ["fake_e2b", "namespace", "operators"]  # fixtures


def e2b_env(fake: FakeState) -> dict[str, str]:
    return {"E2B_API_KEY": fake.api_key, "E2B_API_URL": fake.api_url, "E2B_SANDBOX_URL": fake.sandbox_url}


def unnamed(name: str, calls: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A Workflow whose sandbox names no provider (env only)."""
    doc = manifest(name, sandbox={"env": [{"name": "GREETING", "value": "hello"}]}, toolCalls=calls,
                   snapshotEveryNCalls=None)
    doc["spec"].update(spec)
    return doc


def uid_of(cp: ControlPlane, ns: str, name: str) -> str:
    body = get(cp, ns, name)
    assert body is not None, f"Workflow {ns}/{name} is gone"
    return str(body["metadata"]["uid"])


def pinned(journal: OperatorJournal, ns: str, name: str) -> set[str]:
    """The providers the run's journal pins (each sandbox session's provision records), on either journal."""
    rows = journal.load(ns, cluster_run_id(name, uid_of(journal.cp, ns, name)))
    return {p[1] for row in rows if (p := session_journal.pinned_provider(row)) is not None}


def refused(cp: ControlPlane, ns: str, name: str, reason: str) -> str:
    def failed() -> dict[str, Any] | None:
        cond = condition(cp, ns, name, "Failed")
        return cond if cond is not None and cond["status"] == "True" else None

    cond = wait_until(failed, 60, f"{name} to be refused")
    assert cond["reason"] == reason, cond
    wait_until(lambda: any(e["reason"] == reason for e in events(cp, ns, name)), 30, f"a {reason} Event on {name}")
    return str(cond["message"])


def test_the_default_is_pinned_so_a_restart_with_another_default_keeps_the_run_and_cleans_up_there(
    fake_e2b: FakeState, control_plane: ControlPlane, namespace: str, operators: Any,
    operator_journal: OperatorJournal, tmp_path: Path
) -> None:
    # fake_e2b first: it is torn down last, after the operators that stream from it have stopped.
    cp, ns, gate = control_plane, namespace, tmp_path / "gate"
    first = operators("--default-provider", "e2b", env=e2b_env(fake_e2b))
    calls = [{"type": "shell", "command": 'echo "$GREETING" one'},
             {"type": "shell", "command": f"while [ ! -e {gate} ]; do sleep 0.05; done; echo two"},
             {"type": "shell", "command": "echo three"}]
    # A retained snapshot outlives the run: the Workflow's deletion must find it on the pinned provider.
    cp.apply(unnamed("pinned", calls, snapshotEveryNCalls=1, retainLatestSnapshot=True), "-n", ns)
    wait_in_flight(cp, ns, "pinned", 1)
    assert pinned(operator_journal, ns, "pinned") == {"e2b"}, "no provider named: the operator's default, pinned in the journal"
    assert fake_e2b.live_sandboxes() and local_sandboxes(first.home) == []
    first.kill()  # a crash mid-call: the next operator takes the run over from its journal

    # Restarted with local as the default, which it does not allow: had the run's provider come from today's
    # default, the running Workflow would now be refused (or moved to local).
    second = operators("--default-provider", "local", env=e2b_env(fake_e2b), home=first.home, name="operator-2")
    cp.apply(unnamed("later", [{"type": "shell", "command": "echo later"}]), "-n", ns)
    message = refused(cp, ns, "later", "ProviderNotAllowed")
    assert message.startswith("spec.sandbox.provider: the local provider is not allowed by this operator")
    assert "--allow-local-provider" in message and "--default-provider" in message, message

    gate.touch()
    wait_condition(cp, ns, "pinned", "Succeeded", timeout=180)
    st = status(cp, ns, "pinned")
    assert [r["stdout"] for r in st["result"]["toolResults"]] == ["hello one\n", "two\n", "three\n"]
    assert pinned(operator_journal, ns, "pinned") == {"e2b"}, "the run stayed on the provider it started with"
    assert st["sandbox"]["provider"] == "e2b"
    assert local_sandboxes(second.home) == [], "nothing was made with today's default"
    assert st.get("latestSnapshot") and [s.id for s in fake_e2b.snapshots()] == [st["latestSnapshot"]]

    cp.kubectl("delete", "workflow", "pinned", "-n", ns, "--wait=false")
    wait_gone(cp, ns, "pinned")
    assert fake_e2b.live_sandboxes() == [] and fake_e2b.snapshots() == [], "cleaned up on the pinned provider"
    assert local_sandboxes(second.home) == []


def test_a_sandbox_keeps_the_provider_it_was_first_reconciled_with(
    fake_e2b: FakeState, control_plane: ControlPlane, namespace: str, operators: Any
) -> None:
    cp, ns = control_plane, namespace
    first = operators("--default-provider", "e2b", env=e2b_env(fake_e2b))
    cp.apply({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": "box"},
              "spec": {"template": "base"}}, "-n", ns)
    st = wait_sandbox(cp, ns, "box", "Ready")
    assert st["provider"] == "e2b" and fake_e2b.live_sandboxes() == [st["providerId"]]
    assert "provider" not in (get_sandbox(cp, ns, "box") or {})["spec"], "the API server defaults nothing"
    first.terminate()

    # Another default now (allowed, so a Sandbox that followed it would move): this one stays on e2b.
    second = operators("--default-provider", "local", "--allow-local-provider", env=e2b_env(fake_e2b),
                       home=first.home, name="operator-2")
    cp.apply({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": "newer"},
              "spec": {}}, "-n", ns)
    assert wait_sandbox(cp, ns, "newer", "Ready")["provider"] == "local", "a new Sandbox gets today's default"
    cp.apply(manifest("uses-box", sandbox=None, sandboxRef={"name": "box"}, snapshotEveryNCalls=None,
                      toolCalls=[{"type": "shell", "command": "echo in-box"}]), "-n", ns)
    wait_condition(cp, ns, "uses-box", "Succeeded")
    result = status(cp, ns, "uses-box")["result"]
    assert result["sandboxId"] == st["providerId"] and result["toolResults"][0]["stdout"] == "in-box\n"
    assert sandbox_status(cp, ns, "box")["providerId"] == st["providerId"] and fake_e2b.live_sandboxes() == [st["providerId"]]
    assert sandbox_status(cp, ns, "box")["provider"] == "e2b"

    cp.kubectl("delete", "workflow", "uses-box", "-n", ns, "--wait=true", "--timeout=90s")
    cp.kubectl("delete", "dsbx", "box", "-n", ns, "--wait=false")
    wait_until(lambda: get_sandbox(cp, ns, "box") is None, 90, "Sandbox box to be deleted")
    assert fake_e2b.live_sandboxes() == [], "destroyed on the provider it was made with"
    assert len(local_sandboxes(second.home)) == 1, "only the newer Sandbox's"


def test_a_default_the_operator_cannot_use_is_refused_saying_what_to_set(
    control_plane: ControlPlane, namespace: str, operators: Any
) -> None:
    cp, ns = control_plane, namespace
    operators("--default-provider", "kubernetes", env={
        "DSB_K8S_DISABLED": "the chart grants sandbox Pods only in watchNamespaces, and none is set"})
    cp.apply(unnamed("no-pods", [{"type": "shell", "command": "true"}]), "-n", ns)
    message = refused(cp, ns, "no-pods", "DefaultProviderUnavailable")
    assert "default provider 'kubernetes' is not available" in message and "only in watchNamespaces" in message
    assert "name a provider in spec.sandbox.provider" in message and "--default-provider" in message
    cp.apply({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": "no-pods"},
              "spec": {}}, "-n", ns)
    st = wait_sandbox(cp, ns, "no-pods", "Ready", "false")
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "DefaultProviderUnavailable" and "name a provider in spec.provider" in ready["message"]
    assert "provider" not in st, "nothing was pinned for a Sandbox the operator refused"
    # Nothing ran: no run objects exist.
    assert cp.kubectl_json("get", "journals", "-n", ns, "-l", "durable-sandbox.dev/run-id")["items"] == []
