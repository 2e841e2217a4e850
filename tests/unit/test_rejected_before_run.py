"""Inputs that used to be accepted (and failed later, or silently did something else) are refused by
`dsb run` with exit 2 and a message naming the field, before any run exists."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from durable_sandbox.kube.api.resources import API_VERSION
from tests.dsb import Ran, dsb

FLOWS = "tests.unit.cli_flows"


@pytest.fixture(autouse=True)
def no_e2b_configuration(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("E2B_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL"):
        monkeypatch.delenv(var, raising=False)


def manifest(tmp_path: Path, spec: str) -> str:
    path = tmp_path / "wf.yaml"
    body = textwrap.indent(textwrap.dedent(spec).strip("\n"), "  ")
    path.write_text(f"apiVersion: {API_VERSION}\nkind: Workflow\nmetadata:\n  name: demo\nspec:\n{body}\n")
    return str(path)


def assert_refused(result: Ran, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    assert dsb("-o", "json", "runs").stdout.strip() == "[]"  # nothing was created


CALL = "toolCalls:\n  - {type: shell, command: echo hi}\n"

MANIFESTS = {
    "env name with =": (
        CALL + "sandbox:\n  env:\n    - {name: 'A=B', value: x}\n",
        ["spec.sandbox.env[0].name"],
    ),
    "empty env name": (CALL + "sandbox:\n  env:\n    - {name: '', value: x}\n", ["spec.sandbox.env[0].name"]),
    "per-call env name with =": (
        "toolCalls:\n  - {type: shell, command: echo hi, env: {'A=B': x}}\n",
        ["spec.toolCalls[0].env", "A=B"],
    ),
    "per-call empty env name": (
        "toolCalls:\n  - {type: shell, command: echo hi, env: {'': x}}\n",
        ["spec.toolCalls[0].env"],
    ),
    "NUL in env value": (
        CALL + 'sandbox:\n  env:\n    - {name: A, value: "x\\0y"}\n',
        ["spec.sandbox.env[0].value", "NUL"],
    ),
    "NUL in per-call env value": (
        'toolCalls:\n  - {type: shell, command: echo hi, env: {A: "x\\0y"}}\n',
        ["spec.toolCalls[0].env", "NUL"],
    ),
    "timeout: true": (
        "toolCalls:\n  - {type: shell, command: echo hi, timeout: true}\n",
        ["spec.toolCalls[0].timeout"],
    ),
    "timeoutSeconds: true": (CALL + "timeoutSeconds: true\n", ["spec.timeoutSeconds"]),
    "snapshotEveryNCalls: '2'": (CALL + "snapshotEveryNCalls: '2'\n", ["spec.snapshotEveryNCalls"]),
    "duplicate key": (CALL + "snapshotEveryNCalls: 1\nsnapshotEveryNCalls: 2\n", ["duplicate key 'snapshotEveryNCalls'"]),
    "loss after more calls than there are": (
        CALL + "injectLossAfterNCalls: 2\n",
        ["spec.injectLossAfterNCalls", "1 tool call"],
    ),
    "e2b without an API key": (CALL + "sandbox: {provider: e2b}\n", ["E2B_API_KEY"]),
    "entrypoint that is not a workflow": ("entrypoint: os:system\n", ["spec.entrypoint", "os:system", "not a workflow"]),
}


@pytest.mark.parametrize("case", sorted(MANIFESTS))
def test_bad_manifest_is_refused_before_any_run(tmp_path: Path, case: str) -> None:
    spec, fragments = MANIFESTS[case]
    assert_refused(dsb("run", manifest(tmp_path, spec)), *fragments)


def test_loss_injection_with_a_provider_that_cannot_inject_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_KEY", "e2b_" + "0" * 40)
    result = dsb("run", manifest(tmp_path, CALL + "injectLossAfterNCalls: 1\nsandbox: {provider: e2b}\n"))
    assert_refused(result, "spec.injectLossAfterNCalls", "[e2b] does not support loss_injection")


@pytest.mark.parametrize(
    ("key", "fragment"),
    [("bad\rkey", "E2B_API_KEY"), ("kéy", "E2B_API_KEY"), ("two words", "E2B_API_KEY")],
)
def test_malformed_e2b_api_key_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, fragment: str) -> None:
    monkeypatch.setenv("E2B_API_KEY", key)
    result = dsb("run", manifest(tmp_path, CALL + "sandbox: {provider: e2b}\n"))
    assert_refused(result, fragment, "printable ASCII")
    assert key not in result.output  # the key itself is never echoed


def test_e2b_api_url_with_credentials_is_refused_without_echoing_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_KEY", "e2b_" + "0" * 40)
    monkeypatch.setenv("E2B_API_URL", "ftp://alice:s3cr3t-pw@api.example.test/?token=t0k3n")
    result = dsb("run", manifest(tmp_path, CALL + "sandbox: {provider: e2b}\n"))
    assert_refused(result, "E2B_API_URL", "api.example.test")
    assert "s3cr3t-pw" not in result.output and "t0k3n" not in result.output


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["run", "os:system"], "os:system is not a workflow"),
        (["run", f"{FLOWS}:doubler", "--run-id", ""], "--run-id"),
        (["run", f"{FLOWS}:doubler", "--run-id", "a b"], "--run-id"),
        (["run", f"{FLOWS}:doubler", "--input", "[" * 5000 + "]" * 5000], "--input nests"),
        (["run", f"{FLOWS}:doubler", "--input", '{"a":' * 150 + "1" + "}" * 150], "--input nests"),
    ],
)
def test_bad_arguments_are_refused_before_any_run(args: list[str], fragment: str) -> None:
    assert_refused(dsb(*args), fragment)


def test_a_provider_that_cannot_be_created_is_refused_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_sandbox.kube.spec import preflight

    def broken(name: str) -> None:
        raise RuntimeError(f"{name}: no workspace directory")

    monkeypatch.setattr(preflight, "create_provider", broken)
    assert_refused(
        dsb("run", manifest(tmp_path, CALL)),
        "spec.sandbox.provider: sandbox provider [local] cannot be created: RuntimeError: local: no workspace directory",
    )
