"""`dsb sandbox shell` and `dsb sandbox snapshot` (cli/commands/sandbox_shell.py), and `dsb sandbox exec` printing as
it comes: each line read is one journaled call, the same --session-id again answers from the journal, a refused
line is reported and the loop goes on; the commands docs/agents.md shows, run as written (tests/docs_commands.py)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.docs_commands import PROOFS, Run
from tests.dsb import DSB
from tests.unit.sessions_support import serving_call_api

THIS = "tests/unit/test_sandbox_shell_cli.py::test_the_docs_exec_shell_and_snapshot_commands_work"


async def sh(port: int, command: str, *, token: str = "good-token", stdin: bytes = b"") -> tuple[int, str, str]:
    """``command`` in a shell whose PATH finds this environment's dsb, the call API's address and token set."""
    env = {**os.environ, "PATH": f"{Path(DSB).parent}:{os.environ['PATH']}",
           "DSB_SESSION_URL": f"http://127.0.0.1:{port}", "DSB_SESSION_TOKEN": token}
    proc = await asyncio.create_subprocess_exec("bash", "-c", command, env=env, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_docs_exec_shell_and_snapshot_commands_work(tmp_path: Path) -> None:
    commands = [text for text, proof in PROOFS["docs/agents.md"].items() if isinstance(proof, Run) and proof.by == THIS]
    exec_, shell, snapshot = (next(c for c in commands if f"sandbox {verb}" in c) for verb in ("exec", "shell", "snapshot"))
    async with serving_call_api(tmp_path) as (port, gate):
        workspace = Path(gate.handle.metadata["workspace"])
        assert await sh(port, exec_.replace("dev-box", "box")) == (0, "step 1\nstep 2\nstep 3\n", "")
        code, out, err = await sh(port, shell.replace("dev-box", "box"))
        assert (code, out, err) == (0, "hello\n", "")
        assert (workspace / "greeting.txt").read_text() == "hello\n"
        code, out, _ = await sh(port, snapshot.replace("dev-box", "box"))
        snapshot_id, calls = out.strip().split("\t")
        assert code == 0 and calls == "3 calls" and gate.provider._snapshot_path(snapshot_id).exists()
        again = await sh(port, snapshot.replace("dev-box", "box"))
        assert again[0] == 0 and again[1].startswith(f"{snapshot_id}\t3 calls (taken before")


async def test_the_same_session_id_again_answers_from_the_journal_and_runs_nothing_twice(tmp_path: Path) -> None:
    lines = b"echo x >> log\n\ncat log\nexit 3\n"
    async with serving_call_api(tmp_path) as (port, gate):
        first = await sh(port, f"{DSB} -n demo sandbox shell box --session-id s", stdin=lines)
        again = await sh(port, f"{DSB} -n demo sandbox shell box --session-id s", stdin=lines)
        other = await sh(port, f"{DSB} -n demo sandbox shell box", stdin=b"cat log\n")
        log = (Path(gate.handle.metadata["workspace"]) / "log").read_text()
    assert first == again == (0, "x\n", "")  # a nonzero exit is a completed line: the loop goes on, dsb exits 0
    assert log == "x\n" and other == (0, "x\n", "")


async def test_a_refused_caller_ends_the_loop_with_what_to_do(tmp_path: Path) -> None:
    async with serving_call_api(tmp_path) as (port, gate):
        code, out, err = await sh(port, f"{DSB} -n demo sandbox shell box", token="other-token",
                                  stdin=b"touch ran\ntouch ran-too\n")
        exists = (Path(gate.handle.metadata["workspace"]) / "ran").exists()
    assert code == 1 and out == "" and "403" in err and not exists
