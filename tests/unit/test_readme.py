"""The README's promises, executed: its first command's `dsb run` prints progress and a succeeded result
whose tool results match the manifest (including the nonzero exit), `dsb inspect` shows the journal
afterwards, and its code-first example runs as written."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

import durable_sandbox as ds
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.stores import SqliteStore
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


async def test_readme_code_first_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)  # type: ignore[union-attr]
    module = tmp_path / "readme_example.py"
    module.write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    import readme_example  # type: ignore[import-not-found]

    provider = LocalProvider(tmp_path / "home")
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": provider})
    state = await engine.run(readme_example.hello, "world", run_id="readme")
    assert state.status == "waiting" and [p.id for p in state.pending_callbacks] == ["approve"]
    assert state.pending_callbacks[0].payload == {"greeting": "hello world"}
    await engine.signal("readme", "approve", True)
    state = await engine.resume("readme")
    assert state.status == "succeeded", state.error
    assert state.result == {"out": "hello world", "approved": True}
    assert provider.leftovers() == []
    await engine.aclose()
