"""`dsb sandbox cp` (cli/commands/sandbox_calls.py): a text file into and out of a Sandbox through the call API,
stdin and stdout with '-', one journaled call each; a bad pair of arguments or a missing file says what to do."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.dsb import DSB
from tests.unit.sessions_support import serving_call_api


async def cp(port: int, *args: str, stdin: bytes = b"") -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        DSB, "-n", "demo", "sandbox", "cp", *args, "--url", f"http://127.0.0.1:{port}", "--token", "good-token",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_file_goes_in_and_comes_out(tmp_path: Path) -> None:
    local = tmp_path / "notes.txt"
    local.write_text("first line\nsecond\n")
    async with serving_call_api(tmp_path) as (port, gate):
        assert (await cp(port, str(local), "box:docs/notes.txt"))[0] == 0
        assert (Path(gate.handle.metadata["workspace"]) / "docs/notes.txt").read_text() == "first line\nsecond\n"
        back = tmp_path / "back.txt"
        assert (await cp(port, "box:docs/notes.txt", str(back)))[0] == 0
        assert back.read_text() == "first line\nsecond\n"
        assert (await cp(port, "-", "box:piped.txt", stdin=b"from stdin\n"))[0] == 0
        code, out, _ = await cp(port, "box:piped.txt", "-")
        assert (code, out) == (0, "from stdin\n")
        code, _, err = await cp(port, "box:missing.txt", "-")
        assert code == 1 and "box:missing.txt: no such file in the Sandbox" in err
        code, _, err = await cp(port, str(local), str(back))
        assert code != 0 and "NAME:PATH" in err
        (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00")
        code, _, err = await cp(port, str(tmp_path / "blob.bin"), "box:blob.bin")
        assert code != 0 and "not UTF-8 text" in err
