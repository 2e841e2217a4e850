"""Queries and updates of a code-first Workflow in the cluster (issue 38 item 3), through the call API that `dsb operator
--session-port` serves, with the callers' own ServiceAccount tokens (TokenReview and SubjectAccessReview by the real
API server): a query needs get on the Workflow, an update needs update; an update is journaled once per update id in
the Workflow's journal objects and the run goes on with it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    http_get,
    journal,
    manifest,
    namespace,
    operators,
    status,
    wait_condition,
)
from tests.ports import free_port

__all__ = ["namespace", "operators"]  # fixtures


def token_with(cp: ControlPlane, ns: str, sa: str, verbs: list[str]) -> str:
    """A token of ServiceAccount ``sa`` allowed ``verbs`` on workflows in ``ns``."""
    cp.kubectl("create", "serviceaccount", sa, "-n", ns)
    rule = {"apiGroups": ["durable-sandbox.dev"], "resources": ["workflows"], "verbs": verbs}
    cp.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": sa},
              "rules": [rule]}, "-n", ns)
    cp.kubectl("create", "rolebinding", sa, f"--role={sa}", f"--serviceaccount={ns}:{sa}", "-n", ns)
    wait_until(lambda: cp.kubectl("auth", "can-i", verbs[-1], "workflows.durable-sandbox.dev", "-n", ns,
                                  as_user=f"system:serviceaccount:{ns}:{sa}", check=False).returncode == 0,
               30, f"RBAC to grant {sa}")
    return cp.kubectl("create", "token", sa, "-n", ns, "--duration=1h").stdout.strip()


def serving(operators: Any, port: int, **kwargs: Any) -> Any:
    """A replica that imports examples.flows and serves the call API on ``port``."""
    op = operators("--allow-local-provider", "--workflows", "examples.flows", "--session-port", str(port),
                   "--session-host", "127.0.0.1", **kwargs)
    wait_until(lambda: not op.alive() or http_get(port, "/healthz")[0] == 200, 60, "the session API to answer")
    assert op.alive(), op.logs()[-3000:]
    return op


def post(port: int, path: str, token: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}{path}", json=body, headers={"Authorization": f"Bearer {token}"},
                      timeout=60)


def test_a_viewer_queries_an_editor_updates_once_and_the_run_goes_on_with_it(
    control_plane: ControlPlane, namespace: str, operators: Any,
) -> None:
    cp, ns, port = control_plane, namespace, free_port()
    serving(operators, port)
    doc = manifest("budget", entrypoint="examples.flows.budget:budget", input={"limit": 10}, toolCalls=None,
                   sandbox=None, snapshotEveryNCalls=None)
    cp.apply(doc, "-n", ns)
    wait_condition(cp, ns, "budget", "WaitingForSignal")
    viewer = token_with(cp, ns, "viewer", ["get"])
    editor = token_with(cp, ns, "editor", ["get", "update"])
    base = f"/v1/namespaces/{ns}/workflows/budget"

    q = post(port, base + "/queries/remaining", viewer, {})
    assert q.status_code == 200, q.text
    assert q.json()["answer"] == 7
    run_id = q.json()["runId"]
    refused = post(port, base + "/updates/raise", viewer, {"input": {"amount": 5}, "updateId": "r1"})
    assert refused.status_code == 403 and "may not update this Workflow" in refused.json()["error"]["what"]
    bad = post(port, base + "/updates/raise", editor, {"input": {"amount": 5000}, "updateId": "r0"})
    assert bad.status_code == 400 and "less than or equal to 1000" in bad.json()["error"]["what"]
    up = post(port, base + "/updates/raise", editor, {"input": {"amount": 5, "reason": "grew"}, "updateId": "r1"})
    assert up.status_code == 200, up.text
    assert (up.json()["result"], up.json()["new"]) == (12, True)
    again = post(port, base + "/updates/raise", editor, {"input": {"amount": 5, "reason": "grew"}, "updateId": "r1"})
    assert (again.json()["result"], again.json()["new"]) == (12, False)
    updates = [r for r in journal(cp, ns, run_id) if r.kind == "update"]
    assert [(r.op_id, r.result) for r in updates] == [("update:r1", 12)]  # once; the refused ones left nothing

    cp.kubectl("patch", "workflow", "budget", "-n", ns, "--type", "merge",
               "-p", json.dumps({"spec": {"signals": {"finish": True}}}))
    wait_condition(cp, ns, "budget", "Succeeded")
    assert status(cp, ns, "budget")["result"] == {"limit": 15, "spent": 11,
                                                  "raises": [{"amount": 5, "reason": "grew"}]}


@pytest.mark.parametrize("point", ["before", "after"])
def test_an_update_whose_operator_is_killed_at_its_commit_is_applied_once_by_the_next_replica(
    control_plane: ControlPlane, namespace: str, operators: Any, point: str,
) -> None:
    cp, ns = control_plane, namespace
    first_port, second_port = free_port(), free_port()
    first = serving(operators, first_port, fault=f"{point}:update:k1", name="operator-1")
    cp.apply(manifest("budget", entrypoint="examples.flows.budget:budget", input={"limit": 10}, toolCalls=None,
                      sandbox=None, snapshotEveryNCalls=None), "-n", ns)
    wait_condition(cp, ns, "budget", "WaitingForSignal")
    editor = token_with(cp, ns, "editor", ["get", "update"])
    path = f"/v1/namespaces/{ns}/workflows/budget/updates/raise"
    with pytest.raises(httpx.HTTPError):  # the replica dies at the fault point: no answer
        post(first_port, path, editor, {"input": {"amount": 5}, "updateId": "k1"})
    wait_until(lambda: not first.alive(), 30, "the first replica to die")
    serving(operators, second_port, name="operator-2")
    retry = post(second_port, path, editor, {"input": {"amount": 5}, "updateId": "k1"})
    assert retry.status_code == 200, retry.text
    assert (retry.json()["result"], retry.json()["new"]) == (12, point == "before")  # committed only "after"
    updates = [r for r in journal(cp, ns, retry.json()["runId"]) if r.kind == "update"]
    assert [r.op_id for r in updates] == ["update:k1"]
    cp.kubectl("patch", "workflow", "budget", "-n", ns, "--type", "merge",
               "-p", json.dumps({"spec": {"signals": {"finish": True}}}))
    wait_condition(cp, ns, "budget", "Succeeded")
    assert status(cp, ns, "budget")["result"]["limit"] == 15  # raised once
