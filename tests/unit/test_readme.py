"""The README's promises, executed: its first command's `dsb run` prints progress and a succeeded result
whose tool results match the manifest (including the nonzero exit), `dsb inspect` shows the journal
afterwards, and its code-first example runs as written."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

from durable_sandbox.providers.local import LocalProvider
from tests.dsb import ROOT, dsb

README = (ROOT / "README.md").read_text()


def readme_dsb_run() -> list[str]:
    first = next(line for line in README.splitlines() if "dsb run" in line and "pip install" in line)
    return shlex.split(first.split("&&")[-1].strip())


def test_readme_first_command_runs_the_hello_workflow(tmp_path: Path) -> None:
    command = readme_dsb_run()
    assert command[:2] == ["dsb", "run"], command
    manifest = yaml.safe_load((ROOT / command[2]).read_text())
    calls = manifest["spec"]["toolCalls"]

    proc = dsb(*command[1:], home=tmp_path, process=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"call {len(calls)}/{len(calls)}" in out, "progress is printed while the run goes"
    assert re.search(r"run (\S+) succeeded", out)
    result = json.loads(out[out.index("\n{") :])
    results = result["toolResults"]
    assert len(results) == len(calls)
    for call, got in zip(calls, results, strict=True):
        if call["type"] == "write_file":
            assert got["stdout"] == f"wrote {call['path']} {len(call['contents'].encode())} bytes"
        if call["type"] == "read_file":
            written = next(c for c in calls if c["type"] == "write_file" and c["path"] == call["path"])
            assert got["stdout"] == written["contents"]
    assert [r["exitCode"] for r in results] == [0, 0, 0, 2], "the failing command is a completed call with its exit"
    assert "does-not-exist" in results[-1]["stderr"]
    assert result["latestSnapshot"] is None

    run_id = re.search(r"run (\S+) succeeded", out).group(1)  # type: ignore[union-attr]
    inspected = dsb("inspect", run_id, home=tmp_path, process=True)
    assert inspected.returncode == 0, inspected.stderr
    for r in results:
        assert r["operationId"][:20] in inspected.stdout, "every tool call is in the journal shown"
    assert "sandbox.snapshot" in inspected.stdout and "succeeded" in inspected.stdout
    leftovers = LocalProvider(tmp_path).leftovers()
    assert leftovers == [], "the run deleted its sandbox and snapshots"


def test_readme_code_first_example_runs_with_its_commands(tmp_path: Path) -> None:
    """The README's code, saved as the README says (hello.py), runs with the README's commands as written: it
    waits on its callback (exit 3), is signalled, and the resume finishes it, leaving no sandbox behind."""
    from tests.docs_commands import README_CODE, commands_run_by

    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)  # type: ignore[union-attr]
    (tmp_path / "hello.py").write_text(code)
    home = tmp_path / "home"
    commands = commands_run_by(README_CODE, "README.md")
    assert [shlex.split(c.text)[1] for c in commands] == ["run", "signal", "resume"]
    ran = [dsb(*shlex.split(c.text)[1:], "-o", "json", home=home, cwd=tmp_path) for c in commands]
    assert [r.returncode for r in ran] == [3, 0, 0], [r.stdout + r.stderr for r in ran]
    waiting = json.loads(ran[0].stdout)
    assert waiting["status"] == "waiting"
    assert waiting["pendingCallbacks"] == [{"id": "approve", "payload": {"greeting": "hello world"}}]
    done = json.loads(ran[2].stdout)
    assert done["status"] == "succeeded" and done["result"] == {"out": "hello world", "approved": True}
    assert LocalProvider(home).leftovers() == []
