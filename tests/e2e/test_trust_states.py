"""States nobody used to explain, and the low-severity inputs of issue 20 (items 6 and 9), on the real control
plane with a real operator: each ends with a condition and an Event saying what is wrong, never a traceback
loop, a silent restart or a run that waits for ever.

Refusals by the API server are made real with ValidatingAdmissionPolicies (what a quota, a policy engine or a
size limit does to the operator's writes); the Secret the operator may not read, with an operator running on a
ServiceAccount token whose RBAC does not grant it (as the chart's does not for Secrets outside
``workflowSecrets``).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.kube.store import run_key
from tests.builders import workflow as _workflow
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    condition,
    event_reasons,
    events,
    http_get,
    manifest,
    namespace,
    operators,
    sa_kubeconfig,
    status,
    wait_condition,
    wait_event,
    wait_gone,
    wait_in_flight,
)
from tests.ports import free_port

__all__ = ["namespace", "operators"]  # fixtures


def _ready_reason(cp: ControlPlane, ns: str, name: str) -> str | None:
    return (condition(cp, ns, name, "Ready") or {}).get("reason")


@pytest.fixture
def refusing(control_plane: ControlPlane, namespace: str) -> Iterator[Any]:
    """``refuse(part)``: the API server refuses to create Journal objects of ``part`` in the test's namespace
    (a ValidatingAdmissionPolicy); returns a function that lifts it again."""
    made: list[str] = []
    control_plane.kubectl("label", "namespace", namespace, f"dsb-test-refuse={namespace}")

    def refuse(part: str) -> Any:
        name = f"refuse-{part}-{uuid.uuid4().hex[:6]}"
        control_plane.apply({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {"failurePolicy": "Fail",
                     "matchConstraints": {"resourceRules": [{"apiGroups": ["durable-sandbox.dev"], "apiVersions": ["*"],
                                                             "operations": ["CREATE"], "resources": ["journals"]}]},
                     "validations": [{"expression": f"object.part != '{part}'",
                                      "message": f"journal objects of part {part} are refused here (test quota)"}]},
        })
        control_plane.apply({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"],
                     "matchResources": {"namespaceSelector": {"matchLabels": {"dsb-test-refuse": namespace}}}},
        })
        made.append(name)
        probe = {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Journal", "run": "probe", "part": part,
                 "metadata": {"name": f"probe-{name}"}, "data": {}}
        wait_until(lambda: "test quota" in control_plane.kubectl(
            "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(probe), check=False).stderr,
            60, f"the policy refusing {part} objects to take effect")

        def lift() -> None:
            for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
                control_plane.kubectl("delete", kind, name, "--ignore-not-found")
        return lift

    yield refuse
    for name in made:
        for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
            control_plane.kubectl("delete", kind, name, "--ignore-not-found")


@pytest.mark.apiserver_journal("the API server refusing the Journal objects the operator writes (an admission "
                               "policy); PostgreSQL down or refusing pauses the run: test_operator_postgres.py")
def test_a_refused_journal_create_is_shown_and_the_run_starts_once_it_is_allowed(
    control_plane: ControlPlane, namespace: str, operators: Any, refusing: Any
) -> None:
    cp = control_plane
    lift = refusing("run")
    op = operators("--allow-local-provider")
    cp.apply(manifest("refused", toolCalls=[{"type": "shell", "command": "echo ok"}], snapshotEveryNCalls=0),
             "-n", namespace)
    wait_until(lambda: _ready_reason(cp, namespace, "refused") == "JournalWriteRefused", 90,
               f"Ready=False JournalWriteRefused ({status(cp, namespace, 'refused')})")
    ready = condition(cp, namespace, "refused", "Ready")
    assert ready is not None and "test quota" in ready["message"] and "refused" in ready["message"]
    wait_event(cp, namespace, "refused", "JournalWriteRefused")  # Events are written in the background
    lift()
    wait_condition(cp, namespace, "refused", "Succeeded", timeout=180)
    assert "Traceback" not in op.logs()


@pytest.mark.apiserver_journal("the API server refusing the Journal objects the operator writes (an admission "
                               "policy); a read-only PostgreSQL: test_operator_postgres_refusal.py")
def test_a_result_the_api_server_refuses_to_store_holds_the_run_at_that_call_and_it_runs_once(
    control_plane: ControlPlane, namespace: str, operators: Any, refusing: Any, tmp_path: Path
) -> None:
    """Issue 32 item 9: the second call's output is too big to keep inline (a blob object) and its create is
    refused. The run is held at that call's boundary with the result in memory, offering the write again with a
    backoff, and says so (Ready=False JournalWriteRefused with the count, one Warning Event); the call never runs
    again meanwhile (it used to, about every 30 s). Once writes are allowed the result is recorded and the run
    succeeds: each call ran exactly once."""
    cp = control_plane
    effects = tmp_path / "effects.log"
    op = operators("--allow-local-provider")
    calls = [{"type": "shell", "command": f"echo first >> {effects}"},
             {"type": "shell", "command": f"echo second >> {effects}; head -c 60000 /dev/zero | tr '\\0' x"}]
    lift = refusing("blob")
    cp.apply(manifest("midway", toolCalls=calls, snapshotEveryNCalls=0), "-n", namespace)

    def refused_times() -> int:
        ready = condition(cp, namespace, "midway", "Ready") or {}
        found = re.search(r"refused (once|(\d+) times)", ready.get("message", "")) \
            if ready.get("reason") == "JournalWriteRefused" else None
        return 0 if found is None else 1 if found.group(1) == "once" else int(found.group(2))

    # Held through several refused attempts (a backoff of 1, 2, 4 s): the stopped run of old never counted.
    wait_until(lambda: refused_times() >= 3, 120, f"the run held at its refused write ({status(cp, namespace, 'midway')})")
    ready = condition(cp, namespace, "midway", "Ready") or {}
    assert "test quota" in ready["message"] and "nothing is executed again" in ready["message"], ready
    assert status(cp, namespace, "midway").get("phase") not in ("Failed", "Succeeded")
    assert effects.read_text().split() == ["first", "second"], "held, not executed again"
    lift()
    wait_condition(cp, namespace, "midway", "Succeeded", timeout=180)
    assert effects.read_text().split() == ["first", "second"], "each call ran exactly once"
    reasons = event_reasons(cp, namespace, "midway")
    assert reasons.count("JournalWriteRefused") == 1 and "JournalWriteAccepted" in reasons, reasons
    assert (condition(cp, namespace, "midway", "Ready") or {}).get("reason") != "JournalWriteRefused"
    assert "Traceback" not in op.logs()


@pytest.mark.apiserver_journal("a run's Journal object deleted; in PostgreSQL: "
                               "test_operator_postgres.py's rows deleted mid-run")
def test_a_journal_deleted_mid_run_stops_the_run_instead_of_starting_it_over(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    cp = control_plane
    effects, gate = tmp_path / "effects.log", tmp_path / "gate"
    operators("--allow-local-provider")
    calls = [{"type": "shell", "command": f"echo c1 >> {effects}"},
             {"type": "shell", "command": f"while [ ! -e {gate} ]; do sleep 0.05; done; echo c2 >> {effects}"}]
    cp.apply(manifest("lost", toolCalls=calls, snapshotEveryNCalls=0), "-n", namespace)
    wait_in_flight(cp, namespace, "lost", 1)
    head = f"dsb.{run_key(status(cp, namespace, 'lost')['runId'])}"
    cp.kubectl("delete", "journal", head, "-n", namespace)  # a cluster administrator's mistake
    gate.touch()
    wait_condition(cp, namespace, "lost", "Failed", timeout=120)
    failed = condition(cp, namespace, "lost", "Failed")
    assert failed is not None and failed["reason"] == "JournalLost" and head in failed["message"]
    wait_event(cp, namespace, "lost", "JournalLost")  # Events are written in the background
    assert effects.read_text().split().count("c1") == 1, "the committed first call did not run again"


@pytest.fixture
def key_namespace(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    """The restricted operator's own namespace, for its journal key: never one it serves (issue 32, item 8)."""
    name = f"{namespace}-key"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false")


def restricted_operator(cp: ControlPlane, namespace: str, operators: Any, tmp_path: Path, keys: str, *,
                        pools: bool = True, args: tuple[str, ...] = ()) -> Any:
    """An operator under a Role of its namespace with what the chart grants there (docs/operations.md, RBAC), no
    Secret but its journal key (in namespace ``keys``, as the chart's is in its release namespace); ``pools=False``
    leaves out the SandboxPool rules, as a Role made by hand for an older version would."""
    sa = "restricted-operator"
    cp.kubectl("create", "serviceaccount", sa, "-n", namespace)
    cp.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
              "metadata": {"name": sa, "namespace": keys}, "rules": [
                  {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["journal-key"], "verbs": ["get"]},
                  {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]})
    cp.kubectl("create", "rolebinding", sa, "-n", keys, f"--role={sa}", f"--serviceaccount={namespace}:{sa}")
    rules: list[dict[str, Any]] = [
        {"apiGroups": ["durable-sandbox.dev"], "resources": ["workflows", "sandboxes"],
         "verbs": ["get", "list", "watch", "patch", "delete"]},
        {"apiGroups": ["durable-sandbox.dev"], "resources": ["workflows/status", "sandboxes/status"],
         "verbs": ["get", "patch", "update"]},
        {"apiGroups": ["durable-sandbox.dev"], "resources": ["journals"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    if pools:
        rules += [{"apiGroups": ["durable-sandbox.dev"], "resources": ["sandboxpools"],
                   "verbs": ["get", "list", "watch", "patch"]},
                  {"apiGroups": ["durable-sandbox.dev"], "resources": ["sandboxpools/status"], "verbs": ["get", "patch"]},
                  {"apiGroups": ["durable-sandbox.dev"], "resources": ["workflowschedules"],
                   "verbs": ["get", "list", "watch", "patch"]},
                  {"apiGroups": ["durable-sandbox.dev"], "resources": ["workflowschedules/status"],
                   "verbs": ["get", "patch"]}]
    cp.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
              "metadata": {"name": sa, "namespace": namespace}, "rules": rules})
    cp.kubectl("create", "rolebinding", sa, "-n", namespace, f"--role={sa}", f"--serviceaccount={namespace}:{sa}")
    kubeconfig = tmp_path / "sa-kubeconfig"
    sa_kubeconfig(cp, namespace, sa, kubeconfig)
    return operators("--allow-local-provider", "--journal-key-secret", f"{keys}/journal-key", *args,
                     env={"KUBECONFIG": str(kubeconfig)})


def test_a_role_without_a_kind_the_operator_serves_is_said_and_it_waits_unready(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path, key_namespace: str
) -> None:
    """A Role made by hand for an older version (no SandboxPool rules): the operator does not serve part of what
    it should; its log says which right is missing and where the chart grants it, and its health endpoint is not
    ready, so a rolling update keeps the old replicas."""
    port = free_port()
    op = restricted_operator(control_plane, namespace, operators, tmp_path, key_namespace, pools=False,
                             args=("--metrics-port", str(port)))
    wanted = f"namespaces/{namespace}/sandboxpools: HTTP 403 Forbidden"
    wait_until(lambda: wanted in op.logs(), 60, f"the operator to say it may not list sandboxpools ({op.logs()[-2000:]})")
    assert http_get(port, "/healthz")[0] == 200 and http_get(port, "/readyz")[0] == 503
    line = next(line for line in op.logs().splitlines() if wanted in line)
    assert " WARNING " in line and "the operator may not list sandboxpools here: the chart's RBAC grants it" in line
    assert "CRDs are not installed" not in line, "not the hint of a cluster without the CRDs"
    assert "serving Workflows" not in op.logs()
    op.stop()


def test_a_secret_the_operator_may_not_read_is_said_not_logged_as_a_traceback(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path, key_namespace: str
) -> None:
    cp = control_plane
    op = restricted_operator(cp, namespace, operators, tmp_path, key_namespace)
    cp.kubectl("create", "secret", "generic", "other", "-n", namespace, "--from-literal=token=t")
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "other", "key": "token"}}}]
    cp.apply(manifest("needs-other", toolCalls=[{"type": "shell", "command": "true"}],
                      sandbox={"provider": "local", "env": env}, snapshotEveryNCalls=0), "-n", namespace)
    wait_until(lambda: _ready_reason(cp, namespace, "needs-other") == "SecretNotReadable", 90,
               f"Ready=False SecretNotReadable ({status(cp, namespace, 'needs-other')})")
    ready = condition(cp, namespace, "needs-other", "Ready")
    assert ready is not None and f"{namespace}/other" in ready["message"] and "workflowSecrets" in ready["message"]
    wait_event(cp, namespace, "needs-other", "SecretNotReadable")  # Events are written in the background
    assert "Traceback" not in op.logs() and " ERROR " not in op.logs()


# --------------------------------------------------------------------------------------------- item 9


def test_bad_commands_and_paths_are_refused_at_apply_and_bad_entrypoints_fail(
    control_plane: ControlPlane, namespace: str, operators: Any
) -> None:
    cp = control_plane
    for name, call in (("nul", {"type": "shell", "command": "echo a\u0000b"}),
                       ("dotdot", {"type": "write_file", "path": "x\\..\\..\\y", "contents": "x"})):
        refused = cp.kubectl("apply", "-n", namespace, "-f", "-", check=False,
                             input=json.dumps(manifest(name, toolCalls=[call])))
        assert refused.returncode != 0 and "should match" in refused.stderr, (name, refused.stderr)
    operators("--allow-local-provider", "--workflows", "tests.unit.entrypoint_policy_support")
    cp.apply(_workflow("not-a-workflow", entrypoint="tests.unit.entrypoint_policy_support:not_a_workflow",
                       input={}), "-n", namespace)
    cp.apply(_workflow("elsewhere", entrypoint="tests.unit.entrypoint_policy_support:elsewhere.doubler",
                       input={}), "-n", namespace)
    wait_condition(cp, namespace, "not-a-workflow", "Failed")
    assert "is not a workflow" in (condition(cp, namespace, "not-a-workflow", "Failed") or {})["message"]
    wait_condition(cp, namespace, "elsewhere", "Failed")
    failed = condition(cp, namespace, "elsewhere", "Failed") or {}
    assert failed.get("reason") == "WorkflowNotAllowed" and "tests.unit.cli_flows" in failed.get("message", "")


# --------------------------------------------------------------------------------------------- issue 32 item 9


@pytest.mark.apiserver_journal("a Journal object edited by a cluster administrator; rows in PostgreSQL are not "
                               "sealed (docs/operations.md)")
def test_a_journal_found_tampered_at_cleanup_is_a_warning_event_and_the_condition(
    control_plane: ControlPlane, namespace: str, operators: Any
) -> None:
    """Issue 32 item 9: a finished run's journal edited afterwards (by a cluster administrator: no namespace role
    grants the kind) is first met when its Workflow is deleted. The cleanup goes by the providers' owner tags, and
    says why where people look, as a run says its own damage: a Warning Event ``JournalTampered`` naming the object
    and key, and the Failed condition; not only a WARNING in the operator's log under a Normal ``CleanupDone``."""
    cp = control_plane
    operators("--allow-local-provider")
    cp.apply(manifest("edited", toolCalls=[{"type": "shell", "command": "echo untouched"}], snapshotEveryNCalls=0),
             "-n", namespace)
    wait_condition(cp, namespace, "edited", "Succeeded")
    head = f"dsb.{run_key(status(cp, namespace, 'edited')['runId'])}"
    data = cp.kubectl_json("get", "journal", head, "-n", namespace)["data"]
    key = next(k for k, v in sorted(data.items()) if k.startswith("j.") and "untouched" in v)
    cp.kubectl("patch", "journal", head, "-n", namespace, "--type=merge",
               "-p", json.dumps({"data": {key: data[key].replace("untouched", "rewritten")}}))
    # A finalizer of the test's own keeps the object once the operator's cleanup is done, to read its conditions.
    cp.kubectl("patch", "workflow", "edited", "-n", namespace, "--type=merge",
               "-p", json.dumps({"metadata": {"finalizers": [*cp.kubectl_json(
                   "get", "workflow", "edited", "-n", namespace)["metadata"]["finalizers"], "dsb-test/keep"]}}))
    cp.kubectl("delete", "workflow", "edited", "-n", namespace, "--wait=false")
    try:
        wait_event(cp, namespace, "edited", "CleanupDone", timeout=120)
        warning = [e for e in events(cp, namespace, "edited") if e["reason"] == "JournalTampered"]
        assert warning and warning[0]["type"] == "Warning", event_reasons(cp, namespace, "edited")
        assert head in warning[0]["message"] and repr(key) in warning[0]["message"], warning[0]["message"]
        assert "owner tags" in warning[0]["message"] and "rewritten" not in warning[0]["message"]
        failed = condition(cp, namespace, "edited", "Failed") or {}
        assert failed.get("status") == "True" and failed.get("reason") == "JournalTampered", failed
        done = next(e for e in events(cp, namespace, "edited") if e["reason"] == "CleanupDone")
        assert "owner tags" in done["message"], done
    finally:
        cp.kubectl("patch", "workflow", "edited", "-n", namespace, "--type=json",
                   "-p", json.dumps([{"op": "remove", "path": "/metadata/finalizers"}]), check=False)
    wait_gone(cp, namespace, "edited")
