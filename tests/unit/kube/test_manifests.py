"""Workflow/Sandbox manifests: every invalid manifest is rejected with the field path and the reason."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from durable_sandbox.kube.api.resources import API_VERSION
from durable_sandbox.kube.spec.manifests import ManifestError, load_manifests
from durable_sandbox.kube.spec.models import SandboxResource, WorkflowResource, to_sandbox_agent_input
from durable_sandbox.providers.registry import available_providers
from durable_sandbox.workflows.sandbox_agent import SandboxAgentInput
from tests.dsb import ROOT

EXAMPLES = ROOT / "examples"


def workflow(spec: str, *, name: str = "demo", head: str | None = None) -> str:
    head = head or f"apiVersion: {API_VERSION}\nkind: Workflow\n"
    return head + f"metadata:\n  name: {name}\nspec:\n" + textwrap.indent(textwrap.dedent(spec).strip("\n"), "  ") + "\n"


SHELL = "toolCalls:\n  - {type: shell, command: echo hi}\n"


def problems(text: str) -> list[str]:
    with pytest.raises(ManifestError) as info:
        load_manifests(text)
    return info.value.problems


INVALID = {
    "unknown tool type": (
        workflow("toolCalls:\n  - {type: shell, command: ls}\n  - {type: exec, command: ls}"),
        "document 1 Workflow/demo: spec.toolCalls[1].type: unknown tool type 'exec'",
    ),
    "missing tool type": (
        workflow("toolCalls:\n  - {command: ls}"),
        "spec.toolCalls[0].type: Field required",
    ),
    "missing command": (
        workflow("toolCalls:\n  - {type: shell, command: ls}\n  - {type: write_file, path: a, contents: x}\n  - {type: shell}"),
        "document 1 Workflow/demo: spec.toolCalls[2].command: Field required",
    ),
    "negative snapshot count": (
        workflow(SHELL + "snapshotEveryNCalls: -1"),
        "spec.snapshotEveryNCalls: Input should be greater than or equal to 0",
    ),
    "huge snapshot count": (
        workflow(SHELL + "snapshotEveryNCalls: 10001"),
        "spec.snapshotEveryNCalls: Input should be less than or equal to 10000",
    ),
    "unknown provider": (
        workflow(SHELL + "sandbox: {provider: nosuch}"),
        "spec.sandbox.provider: unknown sandbox provider 'nosuch'; available: ",
    ),
    "duplicate operation ids": (
        workflow(
            "toolCalls:\n  - {operationId: a, type: shell, command: ls}\n"
            "  - {operationId: b, type: shell, command: ls}\n  - {operationId: a, type: shell, command: ls}"
        ),
        "spec.toolCalls[2].operationId: duplicate operation id 'a' (also used by toolCalls[0])",
    ),
    "absolute path": (
        workflow("toolCalls:\n  - {type: write_file, path: /etc/passwd, contents: x}"),
        "spec.toolCalls[0].path: unsafe path '/etc/passwd': absolute paths are not allowed",
    ),
    "path leaving the workspace": (
        workflow("toolCalls:\n  - {type: read_file, path: a/../../secret}"),
        "spec.toolCalls[0].path: unsafe path 'a/../../secret': it leaves the workspace",
    ),
    "unsafe cwd": (
        workflow("toolCalls:\n  - {type: shell, command: ls, cwd: ../up}"),
        "spec.toolCalls[0].cwd: unsafe path '../up'",
    ),
    "both toolCalls and entrypoint": (
        workflow(SHELL + "entrypoint: pkg.mod:fn"),
        "document 1 Workflow/demo: spec: set exactly one of toolCalls or entrypoint (both are set)",
    ),
    "neither toolCalls nor entrypoint": (
        workflow("snapshotEveryNCalls: 1"),
        "spec: set exactly one of toolCalls or entrypoint (neither is set)",
    ),
    "wrong apiVersion": (
        workflow(SHELL, head="apiVersion: batch/v1\nkind: Workflow\n"),
        "apiVersion: expected 'durable-sandbox.dev/v1alpha1', got 'batch/v1'",
    ),
    "wrong kind": (
        workflow(SHELL, head=f"apiVersion: {API_VERSION}\nkind: Job\n"),
        "document 1 Job/demo: kind: unknown kind 'Job'; expected one of Workflow, Sandbox",
    ),
    "unknown field": (
        workflow(SHELL + "snapshotEveryNCall: 2"),
        "spec.snapshotEveryNCall: unknown field 'snapshotEveryNCall'; did you mean 'snapshotEveryNCalls'?",
    ),
    "unknown field in a tool call": (
        workflow("toolCalls:\n  - {type: shell, command: ls, comand: ls}"),
        "spec.toolCalls[0].comand: unknown field 'comand'",
    ),
    "bad YAML": (
        "apiVersion: x\nkind: [Workflow\nspec: {}\n",
        "<manifest>: invalid YAML: line 3, column 5",
    ),
    "zero injected loss": (
        workflow(SHELL + "injectLossAfterNCalls: 0"),
        "spec.injectLossAfterNCalls: Input should be greater than or equal to 1",
    ),
    "input without entrypoint": (
        workflow(SHELL + "input: {a: 1}"),
        "spec: input is the entrypoint's argument; it needs entrypoint",
    ),
    "bad entrypoint reference": (
        workflow("entrypoint: not-a-ref"),
        "spec.entrypoint: 'not-a-ref' is not a 'package.module:function' reference",
    ),
    "invalid name": (
        workflow(SHELL, name="Hello_World"),
        "metadata.name: 'Hello_World' is not a valid name",
    ),
    "env with both value and valueFrom": (
        workflow(SHELL + "sandbox:\n  env:\n    - {name: A, value: x, valueFrom: {secretKeyRef: {name: s, key: k}}}"),
        "spec.sandbox.env[0]: env var A: set exactly one of value or valueFrom",
    ),
    "retry below one attempt": (
        workflow(SHELL + "retry: {maxAttempts: 0}"),
        "spec.retry.maxAttempts: Input should be greater than or equal to 1",
    ),
    "not a mapping": (
        "- just\n- a list\n",
        "document 1: expected a mapping with apiVersion, kind, metadata and spec, got list",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_manifest_names_field_and_reason(case: str) -> None:
    text, expected = INVALID[case]
    found = problems(text)
    assert any(expected in p for p in found), found


def test_every_problem_in_every_document_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        workflow("toolCalls:\n  - {type: shell}\n  - {type: write_file, path: /x, contents: y}")
        + "---\n"
        + workflow(SHELL + "sandbox: {provider: nosuch}", name="second")
    )
    found = problems(str(path))
    assert found == [
        f"{path}: document 1 Workflow/demo: spec.toolCalls[0].command: Field required",
        f"{path}: document 1 Workflow/demo: spec.toolCalls[1].path: unsafe path '/x': absolute paths are not allowed; "
        "use a path relative to the workspace",
        f"{path}: document 2 Workflow/second: spec.sandbox.provider: unknown sandbox provider 'nosuch'; "
        f"available: {', '.join(sorted(available_providers()))}",
    ]
    assert str(ManifestError(found)) == "\n".join(found)


def test_unknown_sandbox_provider_in_sandbox_resource() -> None:
    text = f"apiVersion: {API_VERSION}\nkind: Sandbox\nmetadata: {{name: box}}\nspec: {{provider: nosuch}}\n"
    assert any("document 1 Sandbox/box: spec.provider: unknown sandbox provider 'nosuch'" in p for p in problems(text))


def test_providers_come_from_the_registry_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    import durable_sandbox.providers.registry as registry

    monkeypatch.setattr(registry, "available_providers", lambda: {"local": object, "custom": object})
    load_manifests(workflow(SHELL + "sandbox: {provider: custom}"))
    assert any("available: custom, local" in p for p in problems(workflow(SHELL + "sandbox: {provider: e2b}")))


def test_empty_manifest() -> None:
    assert problems("# nothing here\n") == ["<manifest>: no documents; expected a Workflow (and optionally Sandbox) manifest"]


def test_valid_multi_document_manifest_with_cluster_fields() -> None:
    text = (
        workflow(
            """
            toolCalls:
              - {type: write_file, path: a.txt, contents: hi, operationId: write-a}
              - {type: shell, command: cat a.txt, timeout: 10, env: {X: "1"}}
              - {type: read_file, path: a.txt}
            sandboxRef: {name: box}
            snapshotEveryNCalls: 2
            retainLatestSnapshot: true
            injectLossAfterNCalls: 1
            retry: {maxAttempts: 4, initialIntervalSeconds: 0.5, backoff: 3, maxIntervalSeconds: 2}
            timeoutSeconds: 600
            suspend: false
            cancel: false
            signals: {approve: {ok: true}}
            ttlSecondsAfterFinished: 60
            hibernateAfterSeconds: 0
            """
        )
        + "---\n"
        + f"apiVersion: {API_VERSION}\nkind: Sandbox\nmetadata:\n  name: box\n  namespace: team-a\n  labels: {{a: b}}\n"
        "spec:\n  provider: local\n  leaseSeconds: 600\n  env:\n    - name: TOKEN\n"
        "      valueFrom: {secretKeyRef: {name: creds, key: token}}\n"
    )
    wf, box = load_manifests(text)
    assert isinstance(wf, WorkflowResource) and isinstance(box, SandboxResource)
    spec = wf.spec
    assert spec.sandbox_ref is not None and spec.sandbox_ref.name == "box"
    assert spec.retry is not None and [spec.retry.interval(n) for n in (2, 3, 4)] == [0.5, 1.5, 2.0]
    assert spec.signals == {"approve": {"ok": True}}
    assert box.metadata.namespace == "team-a" and box.spec.env[0].value_from is not None
    agent = to_sandbox_agent_input(spec, box.spec.settings("e2b"))
    assert isinstance(agent, SandboxAgentInput)
    assert agent.sandbox.provider == "local", "the Sandbox names local: the default given is for one naming none"
    assert agent.sandbox.lease_seconds == 600 and agent.snapshot_every_n_calls == 2
    assert agent.retain_latest_snapshot and agent.inject_loss_after_n_calls == 1 and agent.hibernate_after_seconds == 0
    assert [c.type for c in agent.tool_calls] == ["write_file", "shell", "read_file"]
    # Round trip: the camelCase dump is itself a valid manifest.
    again = WorkflowResource.model_validate(wf.model_dump(mode="json", exclude_none=True))
    assert again == wf


def test_entrypoint_workflow_and_status_model() -> None:
    text = workflow("entrypoint: examples.flows.hello_flow:hello\ninput: {name: Ada}")
    (wf,) = load_manifests(text)
    assert isinstance(wf, WorkflowResource)
    assert wf.spec.entrypoint == "examples.flows.hello_flow:hello" and wf.spec.input == {"name": "Ada"}
    with pytest.raises(ValueError, match="does not run sandbox-agent"):
        to_sandbox_agent_input(wf.spec)
    status = {
        "phase": "Waiting",
        "runId": "r1",
        "calls": {"completed": 2, "total": 4},
        "conditions": [{"type": "WaitingForSignal", "status": "True", "reason": "WaitingForSignal"}],
        "pendingCallbacks": [{"id": "approve", "payload": {"q": 1}}],
        "recentOperations": [{"opId": "x", "kind": "sandbox.call", "name": "shell", "status": "completed", "exitCode": 0}],
        "sandbox": {"name": "box", "providerId": "lsb-1"},
        "someFutureField": 1,
    }
    parsed = WorkflowResource.model_validate({**wf.model_dump(mode="json"), "status": status})
    assert parsed.status is not None and parsed.status.calls is not None and parsed.status.calls.completed == 2
    assert parsed.status.model_dump(mode="json", exclude_none=True)["pendingCallbacks"] == [
        {"id": "approve", "payload": {"q": 1}}
    ]


def test_example_manifest_is_valid() -> None:
    (wf,) = load_manifests(EXAMPLES / "hello-workflow.yaml")
    assert isinstance(wf, WorkflowResource)
    assert wf.spec.snapshot_every_n_calls == 2
    assert wf.spec.sandbox is not None and wf.spec.sandbox.provider == "local"
    assert [c.type for c in wf.spec.tool_calls or []] == ["write_file", "shell", "read_file", "shell"]


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ManifestError, match=r"bin.yaml: not UTF-8 text"):
        load_manifests(path)


@pytest.mark.parametrize("path", ["a/../b", "..", "x/..", "a" * 1025])
def test_paths_admission_refuses_are_refused_by_dsb_run_too(path: str) -> None:
    """The CRD refuses any '..' segment and paths over 1024 characters; the models agree (docs/kubernetes.md)."""
    from pydantic import ValidationError

    from durable_sandbox.workflows.sandbox_agent import SandboxAgentInput

    with pytest.raises(ValidationError, match=r"path"):
        SandboxAgentInput.model_validate({"toolCalls": [{"type": "read_file", "path": path}]})
