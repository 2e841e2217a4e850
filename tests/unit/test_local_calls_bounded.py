"""The local provider keeps a tool call bounded: its processes die with the call and with the worker,
nothing in a call blocks on a FIFO, output is capped, and a killed process's leftovers are swept at start.

Processes of a call are found by a token in their environment (every descendant inherits it). Processes
that would write "later" wait for a file the test creates only after checking they are gone, so nothing
here depends on timing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path

import pytest

from durable_sandbox.providers.contract import SandboxHandle, SandboxSpec, ToolCall, ToolResult
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.providers.output import OUTPUT_KEEP_BYTES, truncation_marker
from tests.unit.process_support import eventually, kill_all, pids_with_env

# Every way a shell command leaves processes behind: a background subshell, one that left the process
# group and session (setsid), and a nohup'd one. Each writes a marker once the test says "go".
ESCAPEES = (
    "(while [ ! -e go ]; do sleep 0.05; done; echo late > late-subshell) & "
    "setsid sh -c 'while [ ! -e go ]; do sleep 0.05; done; echo late > late-setsid' & "
    "nohup sh -c 'while [ ! -e go ]; do sleep 0.05; done; echo late > late-nohup' >/dev/null 2>&1 & "
)


@pytest.fixture
def provider(tmp_path: Path) -> LocalProvider:
    return LocalProvider(tmp_path / "home")


@pytest.fixture
async def sandbox(provider: LocalProvider) -> SandboxHandle:
    return await provider.provision(SandboxSpec(owner="t"), lease_seconds=600)


async def call(provider: LocalProvider, handle: SandboxHandle, tool: str, **args: object) -> ToolResult:
    return await provider.execute(handle, ToolCall(operation_id=f"op-{uuid.uuid4().hex[:6]}", type=tool, args=args))


async def assert_nothing_of_the_call_survives(token: str, workspace: Path) -> None:
    try:
        await eventually(lambda: not pids_with_env(token), "every process of the call to be gone")
    except TimeoutError:
        survivors = pids_with_env(token)
        (workspace / "go").touch()  # show what they would have done
        await eventually(lambda: all((workspace / f"late-{k}").exists() for k in ("subshell", "setsid", "nohup")),
                         "the survivors to write", deadline=5)
        kill_all(survivors)
        raise AssertionError(f"processes of the call outlived it: {survivors}") from None
    (workspace / "go").touch()
    assert not _late_files(workspace), "nothing of the call is left to write"


def _late_files(workspace: Path) -> list[Path]:
    return list(workspace.glob("late-*"))


async def test_every_process_of_a_call_dies_when_the_call_ends(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    token = f"dsb-test-{uuid.uuid4().hex}"
    result = await call(provider, sandbox, "shell", command=ESCAPEES + "echo started", env={"DSB_TOKEN": token})
    assert result == ToolResult(exit_code=0, stdout="started\n")
    await assert_nothing_of_the_call_survives(token, provider.workspace_path(sandbox.id))


async def test_every_process_of_a_call_dies_when_its_timeout_stops_it(provider: LocalProvider,
                                                                      sandbox: SandboxHandle) -> None:
    token = f"dsb-test-{uuid.uuid4().hex}"
    result = await call(provider, sandbox, "shell", command=ESCAPEES + "exec sleep 60", timeout=0.5,
                        env={"DSB_TOKEN": token})
    assert result.exit_code == 124
    await assert_nothing_of_the_call_survives(token, provider.workspace_path(sandbox.id))


WORKER = """
import asyncio, sys
from durable_sandbox.providers.contract import SandboxSpec, ToolCall
from durable_sandbox.providers.local import LocalProvider

async def main(home, command, token):
    provider = LocalProvider(home)
    handle = await provider.provision(SandboxSpec(owner="t"), lease_seconds=600)
    print(provider.workspace_path(handle.id), flush=True)
    await provider.execute(handle, ToolCall(operation_id="op", type="shell",
                                            args={"command": command, "env": {"DSB_TOKEN": token}}))

asyncio.run(main(*sys.argv[1:]))
"""


async def test_after_sigkill_of_the_worker_no_process_of_its_call_is_alive(tmp_path: Path) -> None:
    token = f"dsb-test-{uuid.uuid4().hex}"
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WORKER, str(tmp_path / "home"), ESCAPEES + "echo up > ready; exec sleep 600", token,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert worker.stdout is not None
        workspace = Path((await worker.stdout.readline()).decode().strip())
        await eventually(lambda: (workspace / "ready").exists(), "the call to start its processes")
        worker.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(worker.wait(), 30) == -signal.SIGKILL
        await assert_nothing_of_the_call_survives(token, workspace)
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()


async def test_reading_or_writing_a_fifo_is_a_failed_result_not_a_hang(provider: LocalProvider,
                                                                       sandbox: SandboxHandle) -> None:
    fifo = provider.workspace_path(sandbox.id) / "pipe"
    os.mkfifo(fifo)
    try:
        read = await asyncio.wait_for(call(provider, sandbox, "read_file", path="pipe"), timeout=20)
        write = await asyncio.wait_for(call(provider, sandbox, "write_file", path="pipe", contents="x"), timeout=20)
    except TimeoutError:
        # Release the thread blocked in open() so that this test fails instead of hanging the suite.
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        os.close(fd)
        raise
    assert read == ToolResult(exit_code=1, stderr="Cannot read pipe: it is a FIFO, not a regular file; "
                                                  "only regular files can be read")
    assert write == ToolResult(exit_code=1, stderr="Cannot write pipe: it is a FIFO, not a regular file; "
                                                   "only regular files can be written")


async def test_big_output_keeps_its_first_and_last_64_kib_and_says_how_big_it_was(provider: LocalProvider,
                                                                                  sandbox: SandboxHandle) -> None:
    size = 20 * 1024 * 1024
    result = await call(provider, sandbox, "shell",
                        command=f"printf 'BEGIN'; head -c {size - 8} /dev/zero | tr '\\0' x; printf 'END'; echo err >&2")
    keep = OUTPUT_KEEP_BYTES
    assert result.exit_code == 0 and result.stdout_size == size and result.stderr_size is None
    assert result.stdout == ("BEGIN" + "x" * (keep - 5) + truncation_marker(size - 2 * keep, size, keep, keep)
                             + "x" * (keep - 3) + "END")
    assert result.stderr == "err\n"
    (provider.workspace_path(sandbox.id) / "big.txt").write_bytes(b"A" + b"y" * size + b"Z")
    read = await call(provider, sandbox, "read_file", path="big.txt")
    assert read.stdout_size == size + 2 and read.stdout.startswith("Ay") and read.stdout.endswith("yZ")
    assert len(read.stdout.encode()) < 2 * OUTPUT_KEEP_BYTES + 200


def _dead_writer_tag() -> str:
    return f"{os.getpid()}-0"  # this pid with a start time it does not have: a writer that is gone


async def test_a_starting_provider_sweeps_what_killed_processes_left_but_not_live_writers(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = LocalProvider(home)
    snapshots, leases, workspaces = first.snapshots_dir, first.leases_dir, first.workspaces_dir
    dead = [
        snapshots / f".lsnap-{'a' * 24}.{_dead_writer_tag()}.0123abcd.tmp",  # a writer killed mid-snapshot
        snapshots / f".lsnap-{'b' * 24}.0123abcd.tmp",  # written by an older version: nobody finishes it
        leases / f".lsb-{'c' * 12}.{_dead_writer_tag()}.0123abcd.tmp",
    ]
    for path in dead:
        path.write_bytes(b"partial")
    trash = workspaces / f".trash-lsb-{'d' * 12}-0123abcd"
    (trash / "sub").mkdir(parents=True)
    (trash / "sub" / "f").write_text("x")
    own = await first.provision(SandboxSpec(owner="t"), lease_seconds=600)
    # A snapshot being written right now by a live process (this one) must be left alone.
    live = snapshots / f".lsnap-{'e' * 24}.{_own_tag()}.0123abcd.tmp"
    live.write_bytes(b"in progress")

    LocalProvider(home)  # a new process (or provider) starting on the same home

    assert [p for p in [*dead, trash] if p.exists()] == []
    assert live.exists() and first.workspace_path(own.id).is_dir()


def _own_tag() -> str:
    with open(f"/proc/{os.getpid()}/stat", "rb") as f:
        stat = f.read()
    return f"{os.getpid()}-{stat[stat.rfind(b')') + 2:].split()[19].decode()}"
