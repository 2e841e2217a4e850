"""Env values go to the provider only: never into the store file, the journal or `dsb inspect`.

A canary value is put in a manifest's `spec.sandbox.env` and in a call's `env`; the sandbox sees it (the
command writes it into the workspace, never to stdout), and afterwards neither `dsb -o json inspect`, nor
`dsb history`, nor any byte of the store files contains it. The store is readable by its owner only.
"""

from __future__ import annotations

import asyncio
import json
import stat
import textwrap
from pathlib import Path

import pytest

import durable_sandbox
from durable_sandbox.kube.api.resources import API_VERSION
from durable_sandbox.stores import SqliteStore
from tests.dsb import dsb

SANDBOX_CANARY = "canary-sbx-7f3a91c2e4"
CALL_CANARY = "canary-call-58be0d17aa"


def store_bytes(store: Path) -> bytes:
    return b"".join(p.read_bytes() for p in store.parent.glob(store.name + "*") if p.is_file())


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "secret.yaml"
    spec = f"""
        sandbox:
          provider: local
          env:
            - {{name: API_TOKEN, value: {SANDBOX_CANARY}}}
        snapshotEveryNCalls: 1
        injectLossAfterNCalls: 2
        toolCalls:
          - {{type: shell, command: 'printf %s "$API_TOKEN" > token.txt'}}
          - {{type: shell, command: 'printf %s "$CALL_TOKEN" > call.txt', env: {{CALL_TOKEN: {CALL_CANARY}}}}}
          - {{type: shell, command: 'test "$(cat token.txt)" = "$API_TOKEN" && test "$(cat call.txt)" = "$EXPECT"', env: {{EXPECT: {CALL_CANARY}}}}}
          - {{type: shell, command: 'test -n "$CALL_TOKEN"', env: {{CALL_TOKEN: {CALL_CANARY}}}}}
    """
    body = textwrap.indent(textwrap.dedent(spec).strip("\n"), "  ")
    path.write_text(f"apiVersion: {API_VERSION}\nkind: Workflow\nmetadata:\n  name: secret\nspec:\n{body}\n")
    return path


def test_env_values_reach_the_sandbox_but_not_the_store_or_inspect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, manifest: Path
) -> None:
    monkeypatch.setenv("DURABLE_SANDBOX_HOME", str(tmp_path / "home"))
    store = tmp_path / "state" / "runs.db"
    result = dsb("--store", str(store), "-o", "json", "run", str(manifest))
    assert result.exit_code == 0, result.output
    state = json.loads(result.stdout)
    # The sandbox got both values: the third call compares them (exit 0), after a loss and recovery that
    # replayed the second call with its env.
    assert [r["exitCode"] for r in state["result"]["toolResults"]] == [0, 0, 0, 0]
    assert state["recoveryCount"] == 1

    inspected = dsb("--store", str(store), "-o", "json", "inspect", state["runId"])
    history = dsb("--store", str(store), "-o", "json", "history", state["runId"])
    for text in (result.stdout, inspected.stdout, history.stdout):
        assert SANDBOX_CANARY not in text and CALL_CANARY not in text
    shown = json.loads(inspected.stdout)
    assert {"name": "API_TOKEN", "value": "***"} in shown["input"]["sandbox"]["env"]
    assert shown["input"]["toolCalls"][1]["env"] == {"CALL_TOKEN": "***"}
    assert shown["input"]["envValues"] == "detached"

    data = store_bytes(store)
    assert data and SANDBOX_CANARY.encode() not in data and CALL_CANARY.encode() not in data
    for path in store.parent.glob(store.name + "*"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{path} is readable by others"


def test_a_failed_run_resumes_with_its_env_values_kept_beside_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dsb resume` (another engine, as a later process would open) still hands the value to the sandbox:
    it is kept in an owner-only file beside the store while the run can execute again, and deleted once
    the run has succeeded."""
    monkeypatch.setenv("DURABLE_SANDBOX_HOME", str(tmp_path / "home"))
    store = tmp_path / "runs.db"
    marker = tmp_path / "attempted"
    path = tmp_path / "flaky.yaml"
    path.write_text(
        f"apiVersion: {API_VERSION}\nkind: Workflow\nmetadata:\n  name: flaky\nspec:\n"
        "  failurePolicy: {onNonZeroExit: fail}\n"
        f"  sandbox:\n    env:\n      - {{name: API_TOKEN, value: {SANDBOX_CANARY}}}\n"
        "  toolCalls:\n"
        f"    - {{type: shell, command: 'test -f {marker} || {{ touch {marker}; exit 1; }}'}}\n"
        f"    - {{type: shell, command: 'test \"$API_TOKEN\" = \"$EXPECT\"', env: {{EXPECT: {SANDBOX_CANARY}}}}}\n"
    )
    failed = dsb("--store", str(store), "-o", "json", "run", str(path))
    assert failed.exit_code == 1, failed.output
    run_id = json.loads(failed.stdout)["runId"]
    env_dir = store.parent / (store.name + ".env")
    (kept,) = list(env_dir.iterdir())
    assert stat.S_IMODE(env_dir.stat().st_mode) == 0o700 and stat.S_IMODE(kept.stat().st_mode) == 0o600

    # Elsewhere (no values file), the run says what is missing and how to continue, instead of running
    # the sandbox without its env.
    aside = kept.rename(tmp_path / "aside.json")
    elsewhere = dsb("--store", str(store), "-o", "json", "resume", run_id)
    assert elsewhere.exit_code == 1
    error = json.loads(elsewhere.stdout)["error"]
    assert error["type"] == "EnvValuesUnavailable" and "dsb run <manifest>" in error["message"]
    aside.rename(kept)

    resumed = dsb("--store", str(store), "-o", "json", "resume", run_id)
    assert resumed.exit_code == 0, resumed.output
    assert [r["exitCode"] for r in json.loads(resumed.stdout)["result"]["toolResults"]] == [0, 0]
    assert list(env_dir.iterdir()) == []  # the run succeeded: its values are gone
    assert SANDBOX_CANARY.encode() not in store_bytes(store)


def test_code_first_call_env_is_not_journaled(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    engine = durable_sandbox.Engine(store)

    @durable_sandbox.workflow(name="env-code-first")
    async def flow(ctx: durable_sandbox.Context) -> int:
        async with ctx.sandbox("ws", provider="local") as sbx:
            out = await sbx.shell(f'test "${{#TOKEN}}" = {len(CALL_CANARY)}', env={"TOKEN": CALL_CANARY})
        return out.exit_code

    async def go() -> durable_sandbox.RunState:
        try:
            return await engine.run(flow, run_id="cf")
        finally:
            await store.close()

    state = asyncio.run(go())
    assert state.result == 0
    assert CALL_CANARY not in json.dumps(state.to_json())
    assert CALL_CANARY.encode() not in store_bytes(tmp_path / "runs.db")
