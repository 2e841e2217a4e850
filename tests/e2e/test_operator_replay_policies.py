"""Issue 27 item 2, replay that respects external effects, in the cluster: ``examples/replay-policies-workflow.yaml``
(rerun, skip and ask mixed; the sandbox lost after the external calls) applied and answered through
``spec.signals`` by docs/kubernetes.md's own commands, run as written (tests/docs_commands.py lists them).

The one change to the example: its ``EFFECTS_LOG`` points into this test's directory (the machine is shared), and
that file, outside every workspace, is the proof of what ran: the skipped push once, the asked (rerun) notification
and the audit twice. While the run waits on ``replay:sandbox/notify`` no sandbox exists; afterwards the Events,
``kubectl describe``, the status and the journal say which calls were replayed, skipped and asked about.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docs_commands import ROOT, commands_run_by, failed, shell
from tests.e2e.controlplane import ControlPlane
from tests.e2e.journal_support import OperatorJournal
from tests.e2e.operator_support import (
    event_reasons,
    events,
    local_sandboxes,
    namespace,
    operators,
    status,
    wait_event,
)

__all__ = ["namespace", "operators"]  # fixtures

# CI runs it under the PostgreSQL journal too (the wait, the answer and the restore are journal records).
pytestmark = pytest.mark.both_journals

EXAMPLE = ROOT / "examples" / "replay-policies-workflow.yaml"
TEST = ("tests/e2e/test_operator_replay_policies.py::"
        "test_the_example_replays_skips_and_asks_as_each_call_says_answered_through_spec_signals")
SUMMARY = ("4 call(s) replayed (sandbox/notes, sandbox/build, sandbox/notify, sandbox/audit), 1 skipped (sandbox/push), "
           "1 asked (sandbox/notify: rerun)")


def namespaced_kubeconfig(cp: ControlPlane, ns: str, path: Path) -> Path:
    """The control plane's kubeconfig with ``ns`` as its namespace: the docs' commands name none."""
    shutil.copyfile(cp.kubeconfig, path)
    subprocess.run([cp.kubectl_bin, f"--kubeconfig={path}", "config", "set-context", "--current", f"--namespace={ns}"],
                   check=True, capture_output=True, text=True)
    return path


def test_the_example_replays_skips_and_asks_as_each_call_says_answered_through_spec_signals(
    control_plane: ControlPlane, namespace: str, operators: Any, operator_journal: OperatorJournal, tmp_path: Path
) -> None:
    op = operators("--allow-local-provider")
    effects = tmp_path / "effects.log"
    doc = yaml.safe_load(EXAMPLE.read_text())
    [var] = doc["spec"]["sandbox"]["env"]
    assert var["name"] == "EFFECTS_LOG"
    var["value"] = str(effects)
    applied = tmp_path / EXAMPLE.name
    applied.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {"KUBECONFIG": str(namespaced_kubeconfig(control_plane, namespace, tmp_path / "kubeconfig")),
           "KUBECACHEDIR": str(tmp_path / "kube-cache")}

    commands = commands_run_by(TEST, "docs/kubernetes.md")
    assert [c.text.split()[1] for c in commands] == ["apply", "wait", "get", "patch", "wait", "describe"]
    described = ""
    for command in commands:
        text = command.text.replace("examples/replay-policies-workflow.yaml", str(applied))
        done = shell(dataclasses.replace(command, text=text), cwd=ROOT, env=env)
        assert done.returncode == 0, failed(command, done)
        if "condition=WaitingForSignal" in text:
            waiting(control_plane, namespace, op.home, effects)
        elif "jsonpath" in text:
            assert done.stdout == "replay:sandbox/notify"
        elif text.startswith("kubectl describe"):
            described = done.stdout

    assert effects.read_text().splitlines() == [
        "pushed release 1.2", "notified the team", "audited",  # the first execution
        "notified the team", "audited",  # the replay: push skipped, notify asked and answered rerun, audit rerun
    ]
    st = status(control_plane, namespace, "replay-policies")
    assert st["phase"] == "Succeeded" and st["recoveryCount"] == 1 and st["pendingCallbacks"] == []
    assert st["result"]["toolResults"][-1]["stdout"] == "built from 1 line(s)\n", "the rebuilt workspace"
    [recovered] = [e["message"] for e in events(control_plane, namespace, "replay-policies") if e["reason"] == "Recovered"]
    assert recovered.endswith(f"from a fresh sandbox, {SUMMARY}"), recovered
    assert SUMMARY in described and "SandboxLost" in described
    assert op.logs().count(SUMMARY) >= 1, "the lifecycle log line says it too"

    rows = operator_journal.load(namespace, st["runId"])
    policies = {r.op_id: (r.meta or {}).get("onReplay") for r in rows if r.kind == "sandbox.call" and r.status == "started"}
    assert policies == {"sandbox/notes": None, "sandbox/build": None, "sandbox/push": "skip", "sandbox/notify": "ask",
                        "sandbox/audit": None, "sandbox/check": None}, "journaled with each call (rerun as absent)"
    [restore] = [r for r in rows if r.kind == "sandbox.restore" and r.status == "completed"]
    assert restore.meta is not None
    assert restore.meta["replayed"] == ["sandbox/notes", "sandbox/build", "sandbox/notify", "sandbox/audit"]
    assert restore.meta["skipped"] == ["sandbox/push"] and restore.meta["asked"] == {"sandbox/notify": "rerun"}
    [answer] = [r for r in rows if r.op_id == "replay:sandbox/notify" and r.status == "completed"]
    assert answer.result == "rerun"
    assert local_sandboxes(op.home) == []


def waiting(cp: ControlPlane, ns: str, home: Path, effects: Path) -> None:
    """The run waits on the asked call, after the loss, holding no sandbox, with nothing replayed yet."""
    st = status(cp, ns, "replay-policies")
    assert st["phase"] == "Waiting"
    [pending] = st["pendingCallbacks"]
    assert pending["id"] == "replay:sandbox/notify"
    assert pending["payload"]["call"] == "sandbox/notify" and pending["payload"]["answers"] == ["rerun", "skip"]
    assert pending["payload"]["target"] == 'echo "notified the team" >> "$EFFECTS_LOG"'
    assert local_sandboxes(home) == [], "the lost sandbox is gone and the restore made nothing while it waits"
    assert effects.read_text().splitlines() == ["pushed release 1.2", "notified the team", "audited"]
    wait_event(cp, ns, "replay-policies", "SandboxLost")
    assert "Recovered" not in event_reasons(cp, ns, "replay-policies")
