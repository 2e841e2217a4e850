"""Issue 27 item 2, replay that respects external effects: a call's ``onReplay`` (``on_replay=``).

Each call with an effect outside the workspace appends a line to a side-effect log beside the test (never in
a workspace, so no restore touches it): the log is the proof of how many times the effect happened. The loss is
injected at a deterministic point (``injectLossAfterNCalls``, after the external call), with no snapshot, so the
recovery replays every call: rerun runs the effect twice, skip once, ask waits for ``replay:<op id>`` and then
runs it twice (rerun) or once (skip). Nothing waits on a timer; the local provider's directories are empty at
the end of every test (the ``local`` fixture).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import durable_sandbox
from durable_sandbox import Context, workflow
from durable_sandbox.engine.records import OperationRecord
from tests.unit.sandbox_session_support import Hooked, db, engine_for, journal_index, local, run_child

__all__ = ["db", "local"]  # fixtures

AGENT = "sandbox-agent"
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "replay-policies-workflow.yaml"


@pytest.fixture
def effects(tmp_path: Path) -> Path:
    return tmp_path / "effects.log"  # outside every workspace (those are under the local provider's home)


@pytest.fixture
async def engine(db: Path, local: Hooked) -> AsyncIterator[durable_sandbox.Engine]:
    e = engine_for(db, {"local": local})
    yield e
    await e.aclose()


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def spec_with(policy: str | None, log: Path, **extra: Any) -> dict[str, Any]:
    """A workspace file, the external call (``push``) with ``policy``, the loss right after it, then a call that
    reads the rebuilt workspace."""
    push: dict[str, Any] = {"type": "shell", "operationId": "push", "command": f"echo pushed >> {log}"}
    if policy is not None:
        push["onReplay"] = policy
    return {"toolCalls": [
        {"type": "write_file", "operationId": "notes", "path": "notes.txt", "contents": "v1\n"},
        push,
        {"type": "read_file", "operationId": "check", "path": "notes.txt"},
    ], "injectLossAfterNCalls": 2, **extra}


def restore_of(rows: list[OperationRecord]) -> OperationRecord:
    [restore] = [r for r in rows if r.kind == "sandbox.restore" and r.status == "completed"]
    return restore


def started_meta(rows: list[OperationRecord], op_id: str) -> dict[str, Any]:
    return next(r for r in rows if r.op_id == op_id and r.status == "started").meta or {}


# ------------------------------------------------------------------------------------------ rerun and skip


@pytest.mark.parametrize(("policy", "runs"), [(None, 2), ("rerun", 2), ("skip", 1)])
async def test_rerun_executes_the_external_call_again_and_skip_does_not(
        engine: durable_sandbox.Engine, local: Hooked, effects: Path, policy: str | None, runs: int) -> None:
    state = await engine.run(AGENT, spec_with(policy, effects), run_id=f"replay-{policy}")
    assert state.status == "succeeded", state.error
    assert state.recovery_count == 1
    assert lines(effects) == ["pushed"] * runs, "the side-effect log says how many times the push happened"
    assert state.result["toolResults"][2]["stdout"] == "v1\n", "the rebuilt workspace has the rerun call's file"
    rows = await engine.history(f"replay-{policy}")
    restore = restore_of(rows)
    if runs == 2:
        assert restore.meta["replayed"] == ["sandbox/notes", "sandbox/push"] and restore.meta["skipped"] == []
    else:
        assert restore.meta["replayed"] == ["sandbox/notes"] and restore.meta["skipped"] == ["sandbox/push"]
    assert restore.meta["asked"] == {}
    # The policy is journaled with the call (absent: rerun, so plain calls' journals are as before).
    assert started_meta(rows, "sandbox/push").get("onReplay") == (None if policy in (None, "rerun") else policy)
    assert local.calls("execute").count("push") == runs
    assert not any(r.kind == "callback" for r in rows), "only ask asks"


async def test_skip_means_the_rebuilt_workspace_lacks_the_skipped_calls_files(
        engine: durable_sandbox.Engine, effects: Path) -> None:
    """What the docs warn of: skip is for calls whose only effect is outside the workspace."""
    calls = [{"type": "shell", "operationId": "push", "onReplay": "skip",
              "command": f"echo pushed >> {effects}; echo pushed > pushed.txt"},
             {"type": "read_file", "operationId": "check", "path": "pushed.txt"}]
    state = await engine.run(AGENT, {"toolCalls": calls, "injectLossAfterNCalls": 1}, run_id="skip-files")
    assert state.status == "succeeded", state.error
    assert lines(effects) == ["pushed"]
    check = state.result["toolResults"][1]
    assert (check["exitCode"], check["stderr"]) == (1, "File not found: pushed.txt"), "the skipped call's file is gone"
    # The journaled result of the skipped call stands.
    assert state.result["toolResults"][0]["exitCode"] == 0


# ------------------------------------------------------------------------------------------ ask


@pytest.mark.parametrize(("answer", "runs"), [("rerun", 2), ("skip", 1)])
async def test_ask_waits_with_no_sandbox_then_follows_the_answer(
        engine: durable_sandbox.Engine, local: Hooked, effects: Path, answer: str, runs: int) -> None:
    run_id = f"ask-{answer}"
    state = await engine.run(AGENT, spec_with("ask", effects), run_id=run_id)
    assert state.status == "waiting", state.error
    [pending] = state.pending_callbacks
    assert pending.id == "replay:sandbox/push"
    assert pending.payload["call"] == "sandbox/push" and pending.payload["answers"] == ["rerun", "skip"]
    assert pending.payload["target"] == f"echo pushed >> {effects}"
    assert lines(effects) == ["pushed"]
    # The whole restore waits: the lost sandbox is destroyed and nothing new is made while the run waits.
    assert local.inner.leftovers() == [], "a waiting restore holds no sandbox (nothing to leak, nothing to pay for)"
    assert local.calls("provision") == [local.calls("destroy")[0]] and local.calls("restore") == []
    rows = await engine.history(run_id)
    assert [r.status for r in rows if r.kind == "sandbox.restore"] == ["started"]

    await engine.signal(run_id, "replay:sandbox/push", answer)
    state = await engine.resume(run_id)
    assert state.status == "succeeded", state.error
    assert state.recovery_count == 1
    assert lines(effects) == ["pushed"] * runs
    assert state.result["toolResults"][2]["stdout"] == "v1\n"
    rows = await engine.history(run_id)
    restore = restore_of(rows)
    assert restore.meta["reason"] == "recovery", "a recovery that waited is still a recovery"
    assert restore.meta["asked"] == {"sandbox/push": answer}
    assert ("sandbox/push" in restore.meta["replayed"]) == (answer == "rerun")
    assert ("sandbox/push" in restore.meta["skipped"]) == (answer == "skip")
    # The answer is journaled (the callback completed with it) before the replacement is made.
    [asked] = [r for r in rows if r.op_id == "replay:sandbox/push" and r.status == "completed"]
    assert asked.result == answer
    assert journal_index(rows, "replay:sandbox/push", "completed") < journal_index(rows, restore.op_id, "completed")


async def test_an_answer_given_before_the_loss_is_used_without_waiting(
        engine: durable_sandbox.Engine, effects: Path) -> None:
    run_id = "ask-early"
    await engine.create(AGENT, spec_with("ask", effects), run_id=run_id)
    await engine.signal(run_id, "replay:sandbox/push", "skip")  # kept until the run reaches it (spec.signals too)
    state = await engine.resume(run_id)
    assert state.status == "succeeded", state.error
    assert lines(effects) == ["pushed"]
    assert restore_of(await engine.history(run_id)).meta["asked"] == {"sandbox/push": "skip"}


async def test_an_answer_other_than_rerun_or_skip_fails_the_run_and_says_what_to_answer(
        engine: durable_sandbox.Engine, local: Hooked, effects: Path) -> None:
    state = await engine.run(AGENT, spec_with("ask", effects), run_id="ask-bad")
    assert state.status == "waiting"
    await engine.signal("ask-bad", "replay:sandbox/push", {"ok": True})
    state = await engine.resume("ask-bad")
    assert state.status == "failed"
    message = state.error["message"]
    assert "Callback 'replay:sandbox/push' was answered {'ok': True}; the answers are 'rerun' or 'skip'" in message
    assert "re-create the Workflow" in message
    assert lines(effects) == ["pushed"], "nothing was replayed"
    rows = await engine.history("ask-bad")
    assert [r.status for r in rows if r.kind == "sandbox.restore"][-1] == "failed"
    assert local.calls("restore") == [] and len(local.calls("provision")) == 1


async def test_a_crash_while_the_replay_waits_keeps_it_waiting(db: Path, local: Hooked, effects: Path) -> None:
    """SIGKILL right after the ask is journaled (before the run says it waits): the resumed run asks again,
    waits again with no sandbox, and goes on once answered."""
    child = run_child(db, "ask-crash", AGENT, spec_with("ask", effects),
                      env={"DURABLE_SANDBOX_FAULT": "asked:replay:sandbox/push"})
    assert child.returncode == -9, child.stderr
    assert local.inner.leftovers() == [], "the lost sandbox was destroyed before the ask; nothing new was made"
    engine = engine_for(db, {"local": local})
    try:
        state = await engine.resume("ask-crash")
        assert state.status == "waiting", state.error
        assert [p.id for p in state.pending_callbacks] == ["replay:sandbox/push"]
        rows = await engine.history("ask-crash")
        assert len([r for r in rows if r.op_id == "replay:sandbox/push"]) == 1, "asked once, not again"
        await engine.signal("ask-crash", "replay:sandbox/push", "rerun")
        state = await engine.resume("ask-crash")
    finally:
        await engine.aclose()
    assert state.status == "succeeded", state.error
    assert lines(effects) == ["pushed", "pushed"]


# ------------------------------------------------------------------------------------------ code-first


POLICY = {"push": "skip"}  # what the code says; the test changes it between two executions


@workflow(name="test-replay-code-first")
async def code_first(ctx: Context, spec: dict[str, Any]) -> dict[str, Any]:
    async with ctx.sandbox("ws", provider="local", inject_loss_after=2) as sbx:
        await sbx.shell(f"echo pushed >> {spec['log']}", operation_id="push", on_replay=POLICY["push"])
        await ctx.callback("go")
        await sbx.write_file("a.txt", "a\n", operation_id="write")
        out = await sbx.read_file("a.txt", operation_id="read")
    return {"out": out.stdout, **sbx.result()}


@workflow(name="test-replay-bad-policy")
async def bad_policy(ctx: Context, spec: dict[str, Any]) -> dict[str, Any]:
    async with ctx.sandbox("ws", provider="local") as sbx:
        await sbx.shell("echo x", on_replay="never")
    return sbx.result()


async def test_code_first_replay_follows_the_policy_journaled_when_the_call_ran(
        engine: durable_sandbox.Engine, effects: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = await engine.run("test-replay-code-first", {"log": str(effects)}, run_id="code-first")
    assert state.status == "waiting"
    # The code now says rerun: the replay still does what the call said when it ran (skip).
    monkeypatch.setitem(POLICY, "push", "rerun")
    await engine.signal("code-first", "go", True)
    state = await engine.resume("code-first")
    assert state.status == "succeeded", state.error
    assert state.result["out"] == "a\n" and state.recovery_count == 1
    assert lines(effects) == ["pushed"]
    restore = restore_of(await engine.history("code-first"))
    assert restore.meta["skipped"] == ["ws/push"] and restore.meta["replayed"] == ["ws/write"]


async def test_code_first_on_replay_names_the_allowed_values(engine: durable_sandbox.Engine, local: Hooked) -> None:
    state = await engine.run("test-replay-bad-policy", {}, run_id="bad-policy")
    assert state.status == "failed"
    assert "on_replay must be one of rerun, skip, ask, not 'never'" in state.error["message"]
    assert local.calls("execute") == []


# ------------------------------------------------------------------------------------------ the example


async def test_the_example_mixes_the_three_and_the_journal_says_which(
        engine: durable_sandbox.Engine, effects: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    spec = doc["spec"]
    [var] = spec["sandbox"]["env"]
    var["value"] = str(effects)  # the one change: the side-effect log beside this test
    assert [c.get("onReplay") for c in spec["toolCalls"]] == [None, None, "skip", "ask", "rerun", None]
    state = await engine.run(AGENT, spec, run_id="example")
    assert state.status == "waiting"
    assert [p.id for p in state.pending_callbacks] == ["replay:sandbox/notify"]
    await engine.signal("example", "replay:sandbox/notify", "rerun")
    state = await engine.resume("example")
    assert state.status == "succeeded", state.error
    assert lines(effects) == ["pushed release 1.2", "notified the team", "audited", "notified the team", "audited"]
    assert state.result["toolResults"][-1]["stdout"] == "built from 1 line(s)\n"
    restore = restore_of(await engine.history("example"))
    assert restore.meta["replayed"] == ["sandbox/notes", "sandbox/build", "sandbox/notify", "sandbox/audit"]
    assert restore.meta["skipped"] == ["sandbox/push"]
    assert restore.meta["asked"] == {"sandbox/notify": "rerun"}
    assert json.dumps(restore.meta)  # plain JSON, as every store keeps it


async def test_a_loss_after_the_last_call_is_still_recovered_once_answered(
        engine: durable_sandbox.Engine, effects: Path) -> None:
    """No call follows the loss: the resumed run finishes the waiting recovery at that call's end anyway."""
    spec = spec_with("ask", effects)
    spec["toolCalls"] = spec["toolCalls"][:2]
    state = await engine.run(AGENT, spec, run_id="ask-last")
    assert state.status == "waiting"
    await engine.signal("ask-last", "replay:sandbox/push", "rerun")
    state = await engine.resume("ask-last")
    assert state.status == "succeeded", state.error
    assert state.recovery_count == 1 and lines(effects) == ["pushed", "pushed"]
    assert restore_of(await engine.history("ask-last")).meta["replayed"] == ["sandbox/notes", "sandbox/push"]


# ------------------------------------------------------------------------------------------ what is shown


def test_the_recovered_event_and_dsb_inspect_list_replayed_skipped_and_asked_calls_by_op_id() -> None:
    from durable_sandbox.cli.render import op_detail
    from durable_sandbox.kube.reporting.events import lifecycle_events

    meta = {"reason": "recovery", "snapshotId": None, "fromCount": 0,
            "replayed": ["sandbox/notes", "sandbox/build", "sandbox/notify", "sandbox/audit"],
            "skipped": ["sandbox/push"], "asked": {"sandbox/notify": "rerun"}}
    row = OperationRecord("sandbox/restore/1", "sandbox.restore", "fresh", "completed", 1, None,
                          {"id": "lsb-2", "provider": "local"}, meta=meta)
    summary = ("4 call(s) replayed (sandbox/notes, sandbox/build, sandbox/notify, sandbox/audit), "
               "1 skipped (sandbox/push), 1 asked (sandbox/notify: rerun)")
    [event] = lifecycle_events([row])
    assert (event.reason, event.message) == ("Recovered", f"recovered into sandbox lsb-2 from a fresh sandbox, {summary}")
    assert op_detail(row.kind, row.status, row.result, None, meta) == f"from a fresh sandbox: {summary}"
    # Many calls: five op ids each, the rest counted (an Event stays short).
    many = {**meta, "replayed": [f"sandbox/c{i}" for i in range(12)], "skipped": [], "asked": {}}
    [event] = lifecycle_events([OperationRecord("sandbox/restore/1", "sandbox.restore", "fresh", "completed", 1,
                                                None, {"id": "lsb-2"}, meta=many)])
    assert event.message.endswith("12 call(s) replayed (sandbox/c0, sandbox/c1, sandbox/c2, sandbox/c3, sandbox/c4 "
                                  "and 7 more)")


# ------------------------------------------------------------------------------------------ the docs


def test_docs_replay_commands_work(home: Path, tmp_path: Path) -> None:
    """docs/providers.md's `dsb` commands, in order, in bash: the run loses its sandbox and waits on
    replay:sandbox/notify, the signal answers it, the resume finishes it, and the log shows what ran."""
    import dataclasses

    from tests.docs_commands import REPLAY_LOCAL, commands_run_by, failed, shell

    effects = tmp_path / "effects.log"
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["sandbox"]["env"][0]["value"] = str(effects)
    copy = tmp_path / EXAMPLE.name
    copy.write_text(yaml.safe_dump(doc, sort_keys=False))
    commands = commands_run_by(REPLAY_LOCAL, "docs/providers.md")
    assert [c.text.split()[:2] for c in commands] == [["dsb", "run"], ["dsb", "signal"], ["dsb", "resume"],
                                                      ["dsb", "inspect"], ["cat", "/tmp/replay-policies-effects.log"]]
    outputs = []
    for command in commands:
        text = command.text.replace("examples/replay-policies-workflow.yaml", str(copy)).replace(
            "/tmp/replay-policies-effects.log", str(effects))
        done = shell(dataclasses.replace(command, text=text), cwd=ROOT, env={"DURABLE_SANDBOX_HOME": str(home)})
        waits = command.text.startswith("dsb run")
        assert done.returncode == (3 if waits else 0), failed(command, done)
        outputs.append(done.stdout)
    assert "replay:sandbox/notify" in outputs[0], outputs[0]
    assert ("from a fresh sandbox: 4 call(s) replayed (sandbox/notes, sandbox/build, sandbox/notify, sandbox/audit), "
            "1 skipped (sandbox/push), 1 asked (sandbox/notify: rerun)") in details(outputs[3]), outputs[3]
    assert outputs[4].splitlines() == ["pushed release 1.2", "notified the team", "audited", "notified the team",
                                       "audited"]


def details(table: str) -> str:
    """The Detail column of a `dsb inspect` operations table, its folded lines joined."""
    return " ".join(line.split("│")[-2].strip() for line in table.splitlines() if line.count("│") > 2)


def test_the_docs_show_the_manifest_the_tests_apply() -> None:
    from tests.docs_commands import blocks

    example = yaml.safe_load(EXAMPLE.read_text())
    providers = [b for b in blocks(ROOT / "docs" / "providers.md") if b.lang == "yaml" and "onReplay" in b.body]
    kubernetes = [b for b in blocks(ROOT / "docs" / "kubernetes.md") if b.lang == "yaml" and "onReplay" in b.body]
    assert [yaml.safe_load(b.body)["spec"] for b in providers] == [example["spec"]]
    assert [yaml.safe_load(b.body) for b in kubernetes] == [example]


# ------------------------------------------------------------------------------------------ answers refused early


def test_a_wrong_answer_is_refused_before_it_is_stored(engine: durable_sandbox.Engine, effects: Path, db: Path,
                                                       home: Path) -> None:
    """A signal cannot change once given: `dsb signal` (local and --kube) and the Workflow models (a manifest's
    spec.signals; the operator refuses that one signal and says so) refuse a wrong answer to a replay callback;
    the admission policy refuses it on update (tests/e2e/test_crds.py)."""
    from durable_sandbox.kube.spec.models import signal_problems
    from tests.dsb import dsb

    problems = signal_problems({"replay:sandbox/push": "yes", "replay:sandbox/notify": "skip", "approve": "yes"})
    assert problems == {"replay:sandbox/push": 'replay:sandbox/push is a replay callback: answer it "rerun" (execute '
                        'the call again into the rebuilt sandbox) or "skip" (keep its journaled result), as a JSON '
                        'string, not "yes"'}
    done = dsb("--store", str(db), "signal", "nobody", "replay:sandbox/push", '{"ok": true}')
    assert done.exit_code == 2
    assert 'replay:sandbox/push is a replay callback: answer it "rerun"' in done.stderr, done.stderr
    assert 'not {"ok": true}' in done.stderr


def test_the_web_view_notes_the_skipped_and_asked_calls_on_the_restore() -> None:
    from durable_sandbox.ui.timeline import Timeline

    meta = {"reason": "recovery", "snapshotId": None, "replayed": ["sandbox/notes"], "skipped": ["sandbox/push"],
            "asked": {"sandbox/push": "skip"}}
    rows = [OperationRecord("sandbox/restore/1", "sandbox.restore", "fresh", "completed", 1, None, {"id": "lsb-2"},
                            meta=meta, seq=1, ts=1.0)]
    tl = Timeline(0.0)
    tl.feed(rows)
    [restore] = [i for i in tl.items.values() if i.kind == "restore"]
    assert restore.note == ("replayed 1 call into the new sandbox; skipped sandbox/push (the journaled result "
                            "stands); asked about sandbox/push (skip)")
