"""Child workflows in the cluster (issue 38, item 1): each child run of a parent's ``ctx.start_child`` is a
Workflow of its own, created by the operator, owned by the parent (uid, controller, blockOwnerDeletion) with the
cleanup finalizer; never created twice across an operator SIGKILL at the fault point right after a child's
creation; deleting the parent deletes every child and every child's sandbox; a Workflow merely labelled as a
child is never adopted (its result is not the parent's). The flows: examples/flows/delegation.py. And
continue-as-new in the cluster (issue 38, item 2): a Workflow goes on with its chain, shows it in status.runs and
keeps its sandbox (examples/flows/rolling_session.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.kube.store import run_key
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.journal_support import OperatorJournal
from tests.e2e.operator_support import (
    local_sandboxes,
    manifest,
    namespace,
    operators,
    status,
    wait_condition,
    wait_gone,
)

__all__ = ["namespace", "operators"]  # fixtures

# CI runs these under the PostgreSQL journal too: once per journal (tests/e2e/journal_support.py).
pytestmark = pytest.mark.both_journals

PARENT_LABEL = "durable-sandbox.dev/parent"
FINALIZER = "durable-sandbox.dev/cleanup"
PLANNER = "examples.flows.delegation:delegating_planner"
PACKAGE = "examples.flows.delegation:work_package"
AREAS = ["api", "ui", "data"]


def planner(name: str, log: Path, wait: list[str] | None = None) -> dict[str, Any]:
    return manifest(name, entrypoint=PLANNER, toolCalls=None, sandbox=None, snapshotEveryNCalls=None,
                    input={"goal": "billing page", "areas": AREAS, "log": str(log), "wait": wait or []})


def children(cp: ControlPlane, ns: str, parent: str) -> list[dict[str, Any]]:
    """What `kubectl get dwf -l durable-sandbox.dev/parent=<parent>` lists (the label is for display only)."""
    items: list[dict[str, Any]] = cp.kubectl_json("get", "dwf", "-n", ns, "-l", f"{PARENT_LABEL}={parent}")["items"]
    return items


def n_children(cp: ControlPlane, ns: str, parent: str, n: int) -> list[dict[str, Any]] | None:
    found = children(cp, ns, parent)
    return found if len(found) == n else None


def owned_by(item: dict[str, Any], parent: dict[str, Any]) -> bool:
    return any(r.get("uid") == parent["metadata"]["uid"] for r in item["metadata"].get("ownerReferences") or [])


def child_runs(journal: OperatorJournal, ns: str, parent_run: str) -> list[str]:
    """The child run ids the parent's journal records (what the parent believes its children are)."""
    return sorted({str((r.meta or {}).get("childRunId")) for r in journal.load(ns, parent_run) if r.kind == "child"})


def test_three_children_are_owned_workflows_and_deleting_the_parent_cleans_them(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path,
    operator_journal: OperatorJournal,
) -> None:
    op = operators("--allow-local-provider", "--workflows", "examples.flows")
    control_plane.apply(planner("planner", tmp_path / "log", wait=AREAS), "-n", namespace)
    found = wait_until(lambda: n_children(control_plane, namespace, "planner", 3), 120,
                       "three child Workflows of planner")
    parent = control_plane.kubectl_json("get", "dwf", "planner", "-n", namespace)
    for child in found:
        meta = child["metadata"]
        assert meta["ownerReferences"] == [{"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow",
                                            "name": "planner", "uid": parent["metadata"]["uid"],
                                            "controller": True, "blockOwnerDeletion": True}]
        assert FINALIZER in meta["finalizers"]
        assert child["spec"]["entrypoint"] == PACKAGE
        wait_condition(control_plane, namespace, meta["name"], "WaitingForSignal")
        assert status(control_plane, namespace, meta["name"])["runId"] == f"{meta['name']}-{meta['uid'][:8]}"
    # The parent believes exactly these: its journal records the runs of the three objects.
    parent_run = status(control_plane, namespace, "planner")["runId"]
    assert child_runs(operator_journal, namespace, parent_run) == sorted(
        f"{c['metadata']['name']}-{c['metadata']['uid'][:8]}" for c in found)
    # Each child holds a sandbox of its own while it waits.
    assert len([s for s in local_sandboxes(op.home) if s.startswith("local/workspaces/")]) == 3

    # A child is signalled as any Workflow is: its own spec.signals.
    first = found[0]["metadata"]["name"]
    control_plane.kubectl("patch", "dwf", first, "-n", namespace, "--type", "merge",
                          "-p", json.dumps({"spec": {"signals": {"go": True}}}))
    wait_condition(control_plane, namespace, first, "Succeeded")

    control_plane.kubectl("delete", "dwf", "planner", "-n", namespace, "--timeout=120s")
    for child in found:
        wait_gone(control_plane, namespace, child["metadata"]["name"])
    wait_until(lambda: local_sandboxes(op.home) == [] or None, 60, "every child's sandbox and snapshot deleted")
    assert children(control_plane, namespace, "planner") == []


def test_an_operator_killed_after_a_child_is_created_makes_it_once(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path,
    operator_journal: OperatorJournal,
) -> None:
    crashing = operators("--allow-local-provider", "--workflows", "examples.flows", fault="child-created:ui",
                         name="crashing")
    control_plane.apply(planner("planner", tmp_path / "log"), "-n", namespace)
    crashing.wait_exit(120)  # SIGKILLed: the child "ui" exists, the parent's journal does not say so yet
    before = children(control_plane, namespace, "planner")
    assert len(before) == 2, [c["metadata"]["name"] for c in before]

    operators("--allow-local-provider", "--workflows", "examples.flows", name="after")
    wait_condition(control_plane, namespace, "planner", "Succeeded", timeout=180)
    after = children(control_plane, namespace, "planner")
    assert len(after) == 3, [c["metadata"]["name"] for c in after]
    assert {c["metadata"]["uid"] for c in before} <= {c["metadata"]["uid"] for c in after}  # adopted, not made again
    assert len(control_plane.kubectl_json("get", "dwf", "-n", namespace)["items"]) == 4
    result = status(control_plane, namespace, "planner")["result"]
    assert sorted(d["id"] for d in result["done"]) == sorted(AREAS)
    parent_run = status(control_plane, namespace, "planner")["runId"]
    assert child_runs(operator_journal, namespace, parent_run) == sorted(
        f"{c['metadata']['name']}-{c['metadata']['uid'][:8]}" for c in after)
    for child in after:
        assert status(control_plane, namespace, child["metadata"]["name"])["phase"] == "Succeeded"


def test_a_workflow_labelled_as_a_child_is_not_adopted(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path,
    operator_journal: OperatorJournal,
) -> None:
    operators("--allow-local-provider", "--workflows", "examples.flows")
    planted = manifest("planted", entrypoint=PACKAGE, toolCalls=None, sandbox=None, snapshotEveryNCalls=None,
                       input={"id": "api", "title": "planted result"})
    planted["metadata"]["labels"] = {PARENT_LABEL: "planner"}
    control_plane.apply(planted, "-n", namespace)
    wait_condition(control_plane, namespace, "planted", "Succeeded")
    control_plane.apply(planner("planner", tmp_path / "log"), "-n", namespace)
    wait_condition(control_plane, namespace, "planner", "Succeeded", timeout=180)

    result = status(control_plane, namespace, "planner")["result"]
    assert {d["id"]: d["deliverable"] for d in result["done"]} == {a: f"billing page: {a}" for a in AREAS}
    parent = control_plane.kubectl_json("get", "dwf", "planner", "-n", namespace)
    parent_run = status(control_plane, namespace, "planner")["runId"]
    planted_run = status(control_plane, namespace, "planted")["runId"]
    assert planted_run not in child_runs(operator_journal, namespace, parent_run)
    listed = children(control_plane, namespace, "planner")
    assert len(listed) == 4  # the label lists it, and that is all it does
    assert [c["metadata"]["name"] for c in listed if not owned_by(c, parent)] == ["planted"]

    control_plane.kubectl("delete", "dwf", "planner", "-n", namespace, "--timeout=120s")
    wait_until(lambda: [c["metadata"]["name"] for c in children(control_plane, namespace, "planner")] == ["planted"]
               or None, 120, "the parent's own children deleted with it, the planted Workflow left")


def test_a_parents_cancel_cancels_its_children_and_their_sandboxes(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path,
    operator_journal: OperatorJournal,
) -> None:
    op = operators("--allow-local-provider", "--workflows", "examples.flows")
    control_plane.apply(planner("planner", tmp_path / "log", wait=AREAS), "-n", namespace)
    found = wait_until(lambda: n_children(control_plane, namespace, "planner", 3), 120,
                       "three child Workflows of planner")
    for child in found:
        wait_condition(control_plane, namespace, child["metadata"]["name"], "WaitingForSignal")
    control_plane.kubectl("patch", "dwf", "planner", "-n", namespace, "--type", "merge",
                          "-p", json.dumps({"spec": {"cancel": True}}))
    wait_until(lambda: status(control_plane, namespace, "planner").get("phase") == "Cancelled" or None, 120,
               "the parent cancelled")
    names = [c["metadata"]["name"] for c in found]  # the children's own Workflows say so (policy cancel)
    wait_until(lambda: all(status(control_plane, namespace, n).get("phase") == "Cancelled" for n in names) or None,
               120, "every child cancelled with its parent")
    wait_until(lambda: local_sandboxes(op.home) == [] or None, 60, "every child's sandbox deleted")
    assert len(children(control_plane, namespace, "planner")) == 3  # cancelled, not deleted


ROLLING = "examples.flows.rolling_session:rolling_session"


def test_a_workflow_that_continues_as_new_twice_shows_three_runs_and_keeps_its_sandbox(
    control_plane: ControlPlane, namespace: str, operators: Any, operator_journal: OperatorJournal,
) -> None:
    """Issue 38, continue-as-new in the cluster: the Workflow goes on from run to run of its chain, shows it in
    status.runs (newest first) and Succeeds with the last run; every run worked in the one sandbox the first
    provisioned (the local provider made one workspace: the result's sandbox ids are one); every run's journal
    goes with the Workflow (owned by it in the API server, deleted by its cleanup in PostgreSQL)."""
    op = operators("--allow-local-provider", "--workflows", "examples.flows")
    control_plane.apply(manifest("rolling", entrypoint=ROLLING, toolCalls=None, sandbox=None,
                                 snapshotEveryNCalls=None, input={"total": 3, "perRun": 1}), "-n", namespace)
    wait_condition(control_plane, namespace, "rolling", "Succeeded")
    st = status(control_plane, namespace, "rolling")
    uid = control_plane.kubectl_json("get", "dwf", "rolling", "-n", namespace)["metadata"]["uid"]
    first = f"rolling-{uid[:8]}"
    assert st["runId"] == f"{first}~2"
    assert [(r["runId"], r["outcome"]) for r in st["runs"]] == [
        (f"{first}~2", "Succeeded"), (f"{first}~1", "ContinuedAsNew"), (first, "ContinuedAsNew")]
    assert all(r["startedAt"] and r["finishedAt"] for r in st["runs"])
    assert st["result"]["calls"] == ["call-0", "call-1", "call-2"]
    sandboxes = st["result"]["sandboxes"]
    assert len(sandboxes) == 3 and len(set(sandboxes)) == 1, sandboxes  # no re-provision
    wait_until(lambda: local_sandboxes(op.home) == [] or None, 60, "the chain's one sandbox deleted at its end")
    runs = [r["runId"] for r in st["runs"]]
    if operator_journal.dsn is None:
        heads = control_plane.kubectl_json("get", "journals", "-n", namespace)["items"]
        for run in runs:
            mine = [j for j in heads if j["metadata"].get("labels", {}).get("durable-sandbox.dev/run-id") == run_key(run)]
            assert mine and all(any(o.get("uid") == uid for o in j["metadata"].get("ownerReferences") or [])
                                for j in mine), (run, [j["metadata"] for j in mine])
    assert all(operator_journal.load(namespace, run) for run in runs)
    control_plane.kubectl("delete", "dwf", "rolling", "-n", namespace, "--timeout=120s")
    wait_gone(control_plane, namespace, "rolling")
    if operator_journal.dsn is not None:
        assert [run for run in runs if operator_journal.load(namespace, run)] == []


def test_an_operator_killed_mid_chain_loses_no_call_and_runs_none_twice(
    control_plane: ControlPlane, namespace: str, operators: Any,
) -> None:
    """Issue 38, continue-as-new with the operator SIGKILLed at a fault point: right after the chain's second run
    committed its call. Another operator follows the chain from the Workflow's first run to that one, goes on
    from the call after it, and the workspace's log (the result) holds every call of the chain once."""
    crashing = operators("--allow-local-provider", "--workflows", "examples.flows", fault="after:ws/call-1",
                         name="crashing")
    control_plane.apply(manifest("rolling", entrypoint=ROLLING, toolCalls=None, sandbox=None,
                                 snapshotEveryNCalls=None, input={"total": 3, "perRun": 1}), "-n", namespace)
    crashing.wait_exit(120)  # SIGKILLed in the chain's second run, its call-1 committed
    op = operators("--allow-local-provider", "--workflows", "examples.flows", name="after")
    wait_condition(control_plane, namespace, "rolling", "Succeeded", timeout=180)
    st = status(control_plane, namespace, "rolling")
    assert [r["outcome"] for r in st["runs"]] == ["Succeeded", "ContinuedAsNew", "ContinuedAsNew"]
    assert st["result"]["calls"] == ["call-0", "call-1", "call-2"]
    control_plane.kubectl("delete", "dwf", "rolling", "-n", namespace, "--timeout=120s")
    wait_gone(control_plane, namespace, "rolling")
    wait_until(lambda: local_sandboxes(op.home) == [] or None, 60, "the chain's sandbox deleted with the Workflow")
