"""kube/spec/plan.py: one meaning of a Workflow spec for `dsb run` and the operator."""

from __future__ import annotations

from typing import Any

import pytest

from durable_sandbox.kube.spec.models import WorkflowResource
from durable_sandbox.kube.spec.plan import (
    PlanError,
    WorkflowNotAllowed,
    cluster_run_id,
    entrypoint_allowed,
    plan_workflow,
)
from tests.builders import workflow_resource


def workflow(spec: dict[str, Any], uid: str | None = "0123456789abcdef") -> WorkflowResource:
    return workflow_resource(uid=uid or None, **spec)


TOOL_CALLS = [{"type": "shell", "command": "echo hi"}]


def test_cluster_run_id_is_name_and_uid_prefix() -> None:
    plan = plan_workflow(workflow({"toolCalls": TOOL_CALLS}), source="cluster", cluster=True)
    assert plan.run_id == cluster_run_id("demo", "0123456789abcdef") == "demo-01234567"
    assert plan.provider == "local"


def test_local_run_id_depends_on_content_not_uid() -> None:
    a = plan_workflow(workflow({"toolCalls": TOOL_CALLS}, uid=None), source="f.yaml")
    b = plan_workflow(workflow({"toolCalls": TOOL_CALLS}, uid="ffffffff-0000"), source="f.yaml")
    c = plan_workflow(workflow({"toolCalls": [{"type": "shell", "command": "echo other"}]}, uid=None), source="f.yaml")
    assert a.run_id == b.run_id != c.run_id
    assert a.run_id is not None and a.run_id.startswith("demo-")


def test_cluster_needs_the_uid() -> None:
    with pytest.raises(PlanError, match=r"metadata.uid"):
        plan_workflow(workflow({"toolCalls": TOOL_CALLS}, uid=None), source="cluster", cluster=True)


def test_secret_references_stay_references_in_the_cluster_and_are_refused_locally() -> None:
    spec = {
        "toolCalls": TOOL_CALLS,
        "sandbox": {"provider": "local", "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
    }
    plan = plan_workflow(workflow(spec), source="cluster", cluster=True)
    assert plan.input["sandbox"]["env"] == [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    with pytest.raises(PlanError, match=r"spec.sandbox.env\[0\].valueFrom: Secret s/k can only be read in a cluster"):
        plan_workflow(workflow(spec, uid=None), source="f.yaml")


def test_entrypoint_outside_the_allowed_modules_is_refused_before_import() -> None:
    spec = {"entrypoint": "never_imported_module_xyz:flow", "input": {}}
    with pytest.raises(WorkflowNotAllowed, match=r"spec.entrypoint: 'never_imported_module_xyz:flow' is not in a module") as info:
        plan_workflow(workflow(spec), source="cluster", cluster=True, allowed_modules=["examples.flows"])
    assert info.value.reason == "WorkflowNotAllowed"
    import sys

    assert "never_imported_module_xyz" not in sys.modules


def test_entrypoint_allow_list_matches_modules_and_packages() -> None:
    assert entrypoint_allowed("pkg.flows:fn", ["pkg.flows"])
    assert entrypoint_allowed("pkg.flows.sub:fn", ["pkg"])
    assert not entrypoint_allowed("pkg.flowsextra:fn", ["pkg.flows"])
    assert not entrypoint_allowed("other:fn", [])


def test_cluster_fields_carry_their_meaning() -> None:
    spec = {
        "toolCalls": TOOL_CALLS,
        "suspend": True,
        "timeoutSeconds": 30,
        "ttlSecondsAfterFinished": 5,
        "retry": {"maxAttempts": 4},
        "signals": {"approve": True},
    }
    plan = plan_workflow(workflow(spec), source="cluster", cluster=True)
    assert (plan.suspend, plan.timeout, plan.ttl_seconds_after_finished, plan.max_attempts) == (True, 30.0, 5, 4)
    assert plan.signals == {"approve": True} and plan.warnings == []
    local = plan_workflow(workflow(spec, uid=None), source="f.yaml")
    assert any("spec.suspend: only meaningful in a cluster" in w for w in local.warnings)


def test_missing_sandbox_ref_is_an_error_in_the_cluster() -> None:
    spec = {"toolCalls": TOOL_CALLS, "sandboxRef": {"name": "box"}}
    with pytest.raises(PlanError, match=r"spec.sandboxRef: Sandbox 'box' does not exist"):
        plan_workflow(workflow(spec), source="cluster", cluster=True, sandboxes={})
    assert plan_workflow(workflow(spec, uid=None), source="f.yaml").warnings


def spec_description(field: str) -> str:
    """What `kubectl explain workflow.spec.<field>` shows: the generated CRD's description of the field."""
    from durable_sandbox.kube.spec.crds import generate_crds

    [workflows] = [crd for crd in generate_crds() if crd["spec"]["names"]["kind"] == "Workflow"]
    spec = workflows["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return str(spec["properties"][field]["description"])


def test_timeout_seconds_describes_the_cancel_dsb_run_and_the_operator_do() -> None:
    """Past spec.timeoutSeconds, `dsb run` (cli/drive.py) and the operator cancel the run (status cancelled, phase
    Cancelled); the field's description, which `kubectl explain workflow.spec.timeoutSeconds` shows, once said
    it fails the run with reason Timeout, which nothing does."""
    description = spec_description("timeoutSeconds")
    assert description.startswith("Cancel the run") and "phase Cancelled" in description
    assert "reason Timeout" not in description


def test_sandbox_ref_describes_running_in_the_sandboxes_live_sandbox() -> None:
    """In a cluster a Workflow with spec.sandboxRef attaches to the Sandbox's live sandbox (plan.py passes the
    name on; tests/e2e/test_operator_sandboxes.py), so the description must not say it only borrows settings."""
    description = spec_description("sandboxRef")
    assert description.startswith("Run the tool calls in the live sandbox of this Sandbox resource")


def test_fork_of_needs_tool_calls_is_the_clusters_and_places_its_env_values_after_the_sources_calls() -> None:
    from pydantic import ValidationError

    fork = {"workflow": "src", "afterCall": 4}
    for wrong in ({"entrypoint": "pkg.mod:fn"}, {"toolCalls": TOOL_CALLS, "sandboxRef": {"name": "box"}}):
        with pytest.raises(ValidationError, match="forkOf needs toolCalls and no sandboxRef"):
            workflow({"forkOf": fork, **wrong})
    calls = [{"type": "shell", "command": "echo $A", "env": {"A": "a"}}]
    with pytest.raises(PlanError, match=r"spec.forkOf: a fork of Workflow 'src' is made in a cluster"):
        plan_workflow(workflow({"forkOf": fork, "toolCalls": calls}, uid=None), source="f.yaml")
    plan = plan_workflow(workflow({"forkOf": fork, "toolCalls": calls}), source="cluster", cluster=True)
    assert plan.fork_of is not None and plan.fork_of.after_call == 4
    assert plan.env_values == {"toolCalls[4].env.A": "a"}  # the tail's first call is the run's call 4
