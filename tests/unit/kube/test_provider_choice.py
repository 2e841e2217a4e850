"""Which provider a Workflow's run or a Sandbox gets when its spec names none (kube/spec/provider_choice.py), what the
operator refuses, and the plan that carries the decision into the run's stored input (where it is pinned)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from durable_sandbox.cli.main import cli
from durable_sandbox.kube.spec.models import SandboxResource, WorkflowResource
from durable_sandbox.kube.spec.plan import plan_workflow
from durable_sandbox.kube.spec.provider_choice import (
    DEFAULT_UNAVAILABLE,
    LOCAL_NOT_ALLOWED,
    ProviderChoice,
    choose_provider,
    pinned_by_run,
    refusal,
    sandbox_choice,
)
from tests.builders import workflow_resource

UID = "0b5e1f2a-0000-4000-8000-000000000001"
CALLS = [{"type": "shell", "command": "true"}]


def test_the_pin_wins_over_the_spec_and_the_spec_over_the_default() -> None:
    assert choose_provider(pinned="e2b", named="kubernetes", default="local") == ProviderChoice("e2b", "pinned")
    assert choose_provider(pinned=None, named="kubernetes", default="local") == ProviderChoice("kubernetes", "spec")
    assert choose_provider(pinned=None, named=None, default="kubernetes") == ProviderChoice("kubernetes", "default")


def test_a_run_pins_the_provider_of_its_stored_sandbox_agent_input_only() -> None:
    assert pinned_by_run({"toolCalls": CALLS, "sandbox": {"provider": "kubernetes"}}) == "kubernetes"
    # An entrypoint's input is the user's: a "sandbox" key in it pins nothing (its code names its providers).
    assert pinned_by_run({"sandbox": {"provider": "kubernetes"}}) is None
    assert pinned_by_run({"toolCalls": CALLS, "sandbox": "kubernetes"}) is None
    assert pinned_by_run(None) is None and pinned_by_run([1]) is None


def test_a_sandbox_goes_by_its_records_pin_never_its_status() -> None:
    assert sandbox_choice({"provider": "e2b"}, None, "kubernetes") == ProviderChoice("e2b", "pinned")
    assert sandbox_choice({"provider": "e2b"}, "local", "kubernetes").name == "e2b", "a changed spec moves nothing"
    assert sandbox_choice({}, None, "kubernetes") == ProviderChoice("kubernetes", "default")
    assert sandbox_choice({"provider": 7}, "local", "kubernetes") == ProviderChoice("local", "spec")


@pytest.mark.parametrize("source", ["spec", "default", "pinned"])
def test_local_is_refused_however_it_was_chosen_with_the_message_of_naming_it(source: Any) -> None:
    reason, message = refusal(ProviderChoice("local", source), where="spec.sandbox.provider", allow_local=False) or ("", "")
    assert reason == "ProviderNotAllowed"
    assert message.startswith(f"spec.sandbox.provider: {LOCAL_NOT_ALLOWED}")
    assert ("--default-provider" in message) is (source == "default"), "a defaulted local says where it came from"
    assert refusal(ProviderChoice("local", source), where="spec.provider", allow_local=True, environ={}) is None


def test_a_default_the_operator_cannot_build_is_refused_saying_what_to_set() -> None:
    off = {"DSB_K8S_DISABLED": "the chart grants sandbox Pods only in watchNamespaces, and none is set"}
    reason, message = refusal(ProviderChoice("kubernetes", "default"), where="spec.sandbox.provider",
                              allow_local=False, environ=off) or ("", "")
    assert reason == DEFAULT_UNAVAILABLE
    assert "default provider 'kubernetes' is not available" in message
    assert "only in watchNamespaces" in message, "why it is off"
    assert "name a provider in spec.sandbox.provider" in message and "--default-provider" in message
    assert "defaultProvider" in message, "the chart's value"
    # Named or pinned: not this refusal's (a named provider is checked where it is built; a pinned run goes on).
    for source in ("spec", "pinned"):
        assert refusal(ProviderChoice("kubernetes", source), where="x", allow_local=False, environ=off) is None  # type: ignore[arg-type]
    assert refusal(ProviderChoice("kubernetes", "default"), where="x", allow_local=False, environ={}) is None
    e2b = refusal(ProviderChoice("e2b", "default"), where="spec.provider", allow_local=False, environ={})
    assert e2b is not None and "E2B_API_KEY" in e2b[1]
    nosuch = refusal(ProviderChoice("nosuch", "default"), where="spec.provider", allow_local=False, environ={})
    assert nosuch is not None and "no provider 'nosuch' is installed" in nosuch[1]


def workflow(**spec: Any) -> WorkflowResource:
    return workflow_resource("wf", uid=UID, **{"toolCalls": CALLS, **spec})


def stored_provider(wf: WorkflowResource, **kwargs: Any) -> str:
    plan = plan_workflow(wf, source="team", cluster=True, **kwargs)
    assert plan.sandbox is not None and plan.sandbox.provider == plan.input["sandbox"]["provider"]
    return str(plan.input["sandbox"]["provider"])


def test_the_decided_provider_is_in_the_runs_stored_input() -> None:
    assert stored_provider(workflow(), default_provider="kubernetes") == "kubernetes"
    assert stored_provider(workflow(sandbox={"template": "busybox"}), default_provider="kubernetes") == "kubernetes"
    assert stored_provider(workflow(sandbox={"provider": "e2b"}), default_provider="kubernetes") == "e2b"
    assert stored_provider(workflow()) == "local", "dsb run (and a plan given no default): local"
    box = SandboxResource.model_validate({
        "apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": "box"}, "spec": {}})
    ref = workflow(sandboxRef={"name": "box"})
    assert stored_provider(ref, sandboxes={"box": box}, default_provider="kubernetes") == "kubernetes"


def test_an_unset_provider_is_kept_unset_by_the_models() -> None:
    wf = workflow(sandbox={"template": "busybox"})
    assert wf.spec.sandbox is not None and wf.spec.sandbox.provider is None
    dumped = wf.model_dump(mode="json", exclude_none=True)
    assert "provider" not in dumped["spec"]["sandbox"], "a round trip must not write local into the spec"


def test_dsb_operator_refuses_a_default_provider_that_is_not_installed() -> None:
    result = CliRunner().invoke(cli, ["operator", "--default-provider", "nosuch"])
    assert result.exit_code != 0
    assert "--default-provider 'nosuch': no such provider is installed" in result.output
    assert "kubernetes" in result.output and "local" in result.output, "it lists what is"


def test_dsb_operator_documents_its_default_provider() -> None:
    text = " ".join(CliRunner().invoke(cli, ["operator", "--help"]).output.split())
    assert "--default-provider NAME" in text and "[env var: DSB_DEFAULT_PROVIDER; default: local]" in text


def test_the_default_provider_example_names_none_and_needs_no_object_store() -> None:
    from pathlib import Path

    from durable_sandbox.kube.spec.manifests import load_manifests

    (wf,) = load_manifests(Path(__file__).resolve().parents[3] / "examples" / "default-provider-workflow.yaml")
    assert isinstance(wf, WorkflowResource) and wf.spec.sandbox is not None and wf.spec.sandbox.provider is None
    assert wf.spec.snapshot_every_n_calls == 0, "no snapshots: a chart without an object store runs it"
    cluster = wf.model_copy(update={"metadata": wf.metadata.model_copy(update={"uid": UID})})
    assert stored_provider(cluster, default_provider="kubernetes") == "kubernetes"
    assert plan_workflow(wf, source="file").input["sandbox"]["provider"] == "local", "dsb run"
