"""Unit tests for the ``local`` sandbox provider (and the contract's refusal of unsupported capabilities)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import select
import stat
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.providers.contract import (
    Capability,
    ProviderError,
    ProvisionError,
    SandboxGone,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    ToolCall,
    ToolResult,
    UnsupportedCapability,
)
from durable_sandbox.providers.local import LocalProvider, SandboxSuspendedError, snapshot_id_for
from durable_sandbox.testing import FakeClock

SECRET = "s3cr3t-value-that-must-never-touch-disk"
# Bounds a wait on a condition (a command started, a call cut); passing tests never reach it. Generous: on a
# loaded machine a process takes far longer to start or to be reaped than alone (issue 33, item 7).
DEADLINE = 120.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_000_000.0)


@pytest.fixture
def provider(tmp_path: Path, clock: FakeClock) -> LocalProvider:
    return LocalProvider(tmp_path / "home", clock=clock)


@pytest.fixture
async def sandbox(provider: LocalProvider) -> SandboxHandle:
    return await provider.provision(SandboxSpec(owner="run-1", env={"SECRET": SECRET}), lease_seconds=600)


_op_counter: Iterator[int] = iter(range(1, 1_000_000))


async def run(provider: LocalProvider, handle: SandboxHandle, tool: str, **args: Any) -> ToolResult:
    return await provider.execute(
        handle, ToolCall(operation_id=f"op-{next(_op_counter)}", type=tool, args=args)
    )


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def process_is_gone(pid: int, within: float = 10.0) -> bool:
    """Whether ``pid`` has exited (a zombie counts). SIGKILL is asynchronous, so wait for the exit event."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], within)  # a pidfd turns readable when the process exits
        return bool(readable)
    finally:
        os.close(fd)


def pids_with(marker: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue  # exited while we looked
    return pids


async def started_pid(provider: LocalProvider, handle: SandboxHandle) -> tuple[str, asyncio.Future[int]]:
    """A command prefix that reports the call's shell pid (its process group) the moment it starts.

    Synchronises through a FIFO watched by the event loop: no polling, no timed sleeps.
    """
    fifo = provider.workspace_path(handle.id) / "started.fifo"
    os.mkfifo(fifo)
    loop = asyncio.get_running_loop()
    # Non-blocking, so opening does not wait for the writer; Linux reports no hang-up before a writer came.
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    pid: asyncio.Future[int] = loop.create_future()

    def on_readable() -> None:
        data = os.read(fd, 64)
        loop.remove_reader(fd)
        os.close(fd)
        if not pid.done():
            pid.set_result(int(data))

    loop.add_reader(fd, on_readable)
    return "echo $$ > started.fifo; ", pid


# ------------------------------------------------------------------------------------------ basics


def test_capabilities_are_declared_exactly(provider: LocalProvider) -> None:
    caps = provider.capabilities()
    assert provider.name == "local"
    assert caps.supported == frozenset(
        {
            Capability.SNAPSHOT,
            Capability.SNAPSHOT_DELETION,
            Capability.SNAPSHOT_RECONCILIATION,
            Capability.RESTORE,
            Capability.SUSPEND,
            Capability.RESUME,
            Capability.LEASE_RECONCILIATION,
            Capability.LOSS_INJECTION,
            Capability.INVENTORY,
            Capability.PROCESS_RESET,
            Capability.OUTPUT_STREAMING,
            Capability.SNAPSHOT_COPY,
        }
    )
    assert caps.delivery_guarantee == "at_least_once_effects"
    assert caps.idempotent_destroy is True
    assert caps.maximum_lease_seconds == 86_400
    assert caps.tool_types == ("shell", "write_file", "read_file")
    assert caps.consistency_problems() == []


def test_home_defaults_to_the_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_SANDBOX_HOME", str(tmp_path / "from-env"))
    provider = LocalProvider()
    assert provider.root == tmp_path / "from-env" / "local"
    assert provider.directories() == (
        tmp_path / "from-env" / "local" / "workspaces",
        tmp_path / "from-env" / "local" / "snapshots",
        tmp_path / "from-env" / "local" / "leases",
        tmp_path / "from-env" / "local" / "env",
    )
    assert all(d.is_dir() for d in provider.directories())


def test_home_falls_back_to_local_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DURABLE_SANDBOX_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert LocalProvider().root == tmp_path / ".local" / "state" / "durable-sandbox" / "local"


async def test_provision_creates_workspace_and_lease(provider: LocalProvider, clock: FakeClock) -> None:
    spec = SandboxSpec(owner="run-7", labels={"workflow": "wf"}, env={"SECRET": SECRET})
    handle = await provider.provision(spec, lease_seconds=120)

    assert re.fullmatch(r"lsb-[0-9a-f]{12}", handle.id)
    assert handle.provider == "local"
    assert handle.lease_expires_at == clock.now + 120
    assert handle.metadata == {
        "workspace": str(provider.workspace_path(handle.id)),
        "owner": "run-7",
        "labels": {"workflow": "wf"},  # sessions find a sandbox made just before a crash by its labels
    }
    assert provider.workspace_path(handle.id).is_dir()
    lease = json.loads((provider.leases_dir / f"{handle.id}.json").read_text())
    assert lease["owner"] == "run-7"
    assert lease["labels"] == {"workflow": "wf"}
    assert lease["expires_at"] == clock.now + 120
    assert lease["suspended"] is False
    other = await provider.provision(spec, lease_seconds=120)
    assert other.id != handle.id


async def test_env_values_are_only_in_the_sandbox_env_file(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    # The env belongs to the sandbox (every process's calls in it see it), in one file readable by this
    # user only; never in the lease, the workspace, a snapshot or the handle.
    await run(provider, sandbox, "shell", command="echo hello > out.txt")
    await provider.snapshot(sandbox, operation_id="snap")
    await provider.suspend(sandbox)
    holding = [path for path in files_under(provider.home) if SECRET.encode() in path.read_bytes()]
    assert holding == [provider.env_dir / f"{sandbox.id}.json"]
    assert stat.S_IMODE(holding[0].stat().st_mode) == 0o600
    assert SECRET not in sandbox.model_dump_json()


@pytest.mark.parametrize("seconds", [0, -5, 86_401])
async def test_invalid_lease_lengths_are_refused(provider: LocalProvider, seconds: int) -> None:
    with pytest.raises(ProvisionError) as info:
        await provider.provision(SandboxSpec(), lease_seconds=seconds)
    assert info.value.retryable is False
    assert provider.leftovers() == []


# ------------------------------------------------------------------------------------------ shell


async def test_shell_reports_exit_code_stdout_and_stderr(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    result = await run(provider, sandbox, "shell", command="echo out; echo err >&2; exit 3")
    assert result == ToolResult(exit_code=3, stdout="out\n", stderr="err\n")


async def test_shell_runs_in_the_workspace_with_it_as_home(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    workspace = str(provider.workspace_path(sandbox.id))
    result = await run(provider, sandbox, "shell", command='pwd; echo "$HOME"')
    assert result.stdout == f"{workspace}\n{workspace}\n"
    assert result.exit_code == 0


async def test_shell_cwd_is_relative_to_the_workspace(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    await run(provider, sandbox, "write_file", path="sub/dir/f.txt", contents="x")
    result = await run(provider, sandbox, "shell", command="pwd; ls", cwd="sub/dir")
    assert result.stdout == f"{provider.workspace_path(sandbox.id) / 'sub' / 'dir'}\nf.txt\n"


async def test_shell_cwd_must_be_an_existing_directory(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    result = await run(provider, sandbox, "shell", command="pwd", cwd="missing")
    assert result == ToolResult(
        exit_code=1, stderr="Invalid arguments for shell: cwd missing is not a directory in the workspace"
    )


async def test_spec_env_is_visible_and_call_env_overrides_it(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    result = await run(provider, sandbox, "shell", command='echo "$SECRET|$EXTRA"')
    assert result.stdout == f"{SECRET}|\n"
    result = await run(
        provider, sandbox, "shell", command='echo "$SECRET|$EXTRA"', env={"SECRET": "x", "EXTRA": "y"}
    )
    assert result.stdout == "x|y\n"


async def test_shell_does_not_inherit_the_operator_environment(
    provider: LocalProvider, sandbox: SandboxHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPERATOR_ONLY_TOKEN", "leak")
    result = await run(provider, sandbox, "shell", command='echo "[$OPERATOR_ONLY_TOKEN]"')
    assert result.stdout == "[]\n"


async def test_shell_output_is_decoded_with_replacement(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    result = await run(provider, sandbox, "shell", command=r"printf 'a\xffb'; printf '\xfe' >&2")
    assert result.stdout == "a\ufffdb"
    assert result.stderr == "\ufffd"


async def test_shell_timeout_kills_the_process_group(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    result = await run(
        provider,
        sandbox,
        "shell",
        command="sleep 60 & echo $! > child.pid; echo started; echo warn >&2; wait",
        timeout=0.5,
    )
    assert result.exit_code == 124
    assert result.stdout == "started\n"
    assert result.stderr == "warn\nCommand timed out after 0.5 seconds"
    child = int((provider.workspace_path(sandbox.id) / "child.pid").read_text())
    assert process_is_gone(child)


async def test_shell_timeout_message_with_no_stderr(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    result = await run(provider, sandbox, "shell", command="exec sleep 60", timeout=0.25)
    assert result == ToolResult(exit_code=124, stdout="", stderr="Command timed out after 0.25 seconds")


async def test_background_processes_do_not_outlive_the_call(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    # The call must also return at once, not when the backgrounded child (holding stdout) exits.
    result = await asyncio.wait_for(
        run(provider, sandbox, "shell", command="sleep 60 & echo $! > bg.pid; echo done"), DEADLINE
    )
    assert result == ToolResult(exit_code=0, stdout="done\n", stderr="")
    assert process_is_gone(int((provider.workspace_path(sandbox.id) / "bg.pid").read_text()))


async def test_death_by_signal_is_reported_as_128_plus_signal(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    result = await run(provider, sandbox, "shell", command="kill -9 $$")
    assert result.exit_code == 137


async def test_cancelling_a_call_kills_its_command(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    prefix, started = await started_pid(provider, sandbox)
    task = asyncio.create_task(run(provider, sandbox, "shell", command=prefix + "exec sleep 600"))
    pgid = await asyncio.wait_for(started, DEADLINE)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert process_is_gone(pgid)
    assert sandbox.id not in provider._running


async def test_cancelling_while_the_command_starts_leaves_nothing_running(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    marker = f"dsb-test-{uuid.uuid4().hex}"
    task = asyncio.create_task(run(provider, sandbox, "shell", command=f"exec -a {marker} sleep 600"))
    await asyncio.sleep(0)  # one loop turn: the call is now waiting for its process to start
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE)
    # Nothing left starting in the background either (that process would escape every kill).
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    assert all(process_is_gone(pid) for pid in pids_with(marker))
    assert sandbox.id not in provider._running


async def test_destroy_during_a_call_raises_gone_and_kills_it(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    prefix, started = await started_pid(provider, sandbox)
    task = asyncio.create_task(run(provider, sandbox, "shell", command=prefix + "exec sleep 600"))
    pgid = await asyncio.wait_for(started, DEADLINE)
    await provider.destroy(sandbox)
    with pytest.raises(SandboxGone):
        await asyncio.wait_for(task, DEADLINE)
    assert process_is_gone(pgid)
    assert provider.leftovers() == []


async def test_concurrent_calls_on_one_sandbox(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    results = await asyncio.gather(*(run(provider, sandbox, "shell", command=f"echo {i}") for i in range(8)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]


# ------------------------------------------------------------------------------------------ files


async def test_write_file_creates_parents_and_reports_utf8_bytes(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    result = await run(provider, sandbox, "write_file", path="a/b/héllo.txt", contents="héllo\n")
    assert result == ToolResult(exit_code=0, stdout="wrote a/b/héllo.txt 7 bytes", stderr="")
    assert (provider.workspace_path(sandbox.id) / "a" / "b" / "héllo.txt").read_bytes() == "héllo\n".encode()


async def test_write_file_of_empty_contents(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    result = await run(provider, sandbox, "write_file", path="empty", contents="")
    assert result.stdout == "wrote empty 0 bytes"
    assert (provider.workspace_path(sandbox.id) / "empty").read_bytes() == b""


async def test_read_file_returns_contents(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    await run(provider, sandbox, "write_file", path="notes.md", contents="# hi\nthere")
    assert await run(provider, sandbox, "read_file", path="notes.md") == ToolResult(
        exit_code=0, stdout="# hi\nthere"
    )
    (provider.workspace_path(sandbox.id) / "bin").write_bytes(b"\x00\xff")
    assert (await run(provider, sandbox, "read_file", path="bin")).stdout == "\x00\ufffd"


async def test_read_missing_file(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    result = await run(provider, sandbox, "read_file", path="nope/missing.txt")
    assert result == ToolResult(exit_code=1, stdout="", stderr="File not found: nope/missing.txt")


async def test_read_of_a_directory_is_a_failed_result(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    (provider.workspace_path(sandbox.id) / "d").mkdir()
    result = await run(provider, sandbox, "read_file", path="d")
    assert result == ToolResult(exit_code=1, stderr="Cannot read d: Is a directory")


async def test_writes_are_visible_to_the_shell(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    await run(provider, sandbox, "write_file", path="x/y.txt", contents="42")
    assert (await run(provider, sandbox, "shell", command="cat x/y.txt")).stdout == "42"


# ------------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/etc/passwd", "absolute paths are not allowed; use a path relative to the workspace"),
        ("../escape.txt", "it leaves the workspace"),
        ("a/../../escape.txt", "it leaves the workspace"),
        (".", "it leaves the workspace"),
        ("", "must be a non-empty relative path"),
    ],
)
async def test_unsafe_paths_are_failed_results(
    provider: LocalProvider, sandbox: SandboxHandle, path: str, reason: str
) -> None:
    expected = ToolResult(exit_code=1, stdout="", stderr=f"Unsafe path: {path}: {reason}")
    assert await run(provider, sandbox, "write_file", path=path, contents="x") == expected
    assert await run(provider, sandbox, "read_file", path=path) == expected
    assert not (provider.workspaces_dir / "escape.txt").exists()


async def test_symlink_escapes_are_refused(
    provider: LocalProvider, sandbox: SandboxHandle, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside data")
    workspace = provider.workspace_path(sandbox.id)
    (workspace / "link").symlink_to(outside)
    (workspace / "file-link").symlink_to(outside / "secret.txt")
    reason = "it resolves outside the workspace through a symlink"

    assert await run(provider, sandbox, "read_file", path="link/secret.txt") == ToolResult(
        exit_code=1, stderr=f"Unsafe path: link/secret.txt: {reason}"
    )
    assert await run(provider, sandbox, "read_file", path="file-link") == ToolResult(
        exit_code=1, stderr=f"Unsafe path: file-link: {reason}"
    )
    assert await run(provider, sandbox, "write_file", path="link/new.txt", contents="x") == ToolResult(
        exit_code=1, stderr=f"Unsafe path: link/new.txt: {reason}"
    )
    assert await run(provider, sandbox, "write_file", path="file-link", contents="x") == ToolResult(
        exit_code=1, stderr=f"Unsafe path: file-link: {reason}"
    )
    assert await run(provider, sandbox, "shell", command="pwd", cwd="link") == ToolResult(
        exit_code=1, stderr=f"Unsafe path: link: {reason}"
    )
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "outside data"


async def test_symlinks_inside_the_workspace_are_allowed(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    workspace = provider.workspace_path(sandbox.id)
    (workspace / "real").mkdir()
    (workspace / "alias").symlink_to("real")
    assert (await run(provider, sandbox, "write_file", path="alias/f", contents="ok")).exit_code == 0
    assert (workspace / "real" / "f").read_text() == "ok"


async def test_unsafe_shell_cwd(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    result = await run(provider, sandbox, "shell", command="pwd", cwd="../..")
    assert result == ToolResult(exit_code=1, stderr="Unsafe path: ../..: it leaves the workspace")


@pytest.mark.parametrize(
    ("tool", "args", "stderr"),
    [
        ("shell", {}, "Invalid arguments for shell: missing required argument 'command'"),
        ("shell", {"command": ""}, "Invalid arguments for shell: 'command' must be a non-empty string"),
        ("shell", {"command": 5}, "Invalid arguments for shell: 'command' must be a str"),
        (
            "shell",
            {"command": "true", "timeout": -1},
            "Invalid arguments for shell: 'timeout' must be a positive number of seconds",
        ),
        (
            "shell",
            {"command": "true", "timeout": "5"},
            "Invalid arguments for shell: 'timeout' must be a int or float",
        ),
        (
            "shell",
            {"command": "true", "env": {"A=B": "x"}},
            "Invalid arguments for shell: env entry 'A=B' must map a name to a string",
        ),
        (
            "shell",
            {"command": "true", "env": {"A": 1}},
            "Invalid arguments for shell: env entry 'A' must map a name to a string",
        ),
        (
            "write_file",
            {"path": "f"},
            "Invalid arguments for write_file: missing required argument 'contents'",
        ),
        (
            "write_file",
            {"path": "f", "contents": b"x"},
            "Invalid arguments for write_file: 'contents' must be a str",
        ),
        (
            "write_file",
            {"path": "f", "content": "x"},
            "Invalid arguments for write_file: unexpected argument(s) 'content'",
        ),
        ("read_file", {}, "Invalid arguments for read_file: missing required argument 'path'"),
        ("read_file", {"path": 3}, "Invalid arguments for read_file: 'path' must be a str"),
    ],
)
async def test_invalid_arguments_are_failed_results(
    provider: LocalProvider, sandbox: SandboxHandle, tool: str, args: dict[str, Any], stderr: str
) -> None:
    assert await run(provider, sandbox, tool, **args) == ToolResult(exit_code=1, stdout="", stderr=stderr)
    assert list(provider.workspace_path(sandbox.id).iterdir()) == []


async def test_unknown_tool_type_is_a_failed_result(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    result = await run(provider, sandbox, "browse", url="https://example.com")
    assert result == ToolResult(exit_code=1, stdout="", stderr="Unsupported tool type: browse")


# ------------------------------------------------------------------------------------------ snapshots


async def test_snapshot_is_reconciled_by_operation_id(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    await run(provider, sandbox, "write_file", path="state.txt", contents="v1")
    first = await provider.snapshot(sandbox, operation_id="run-1/snap-1")
    assert first == snapshot_id_for("run-1/snap-1")
    assert re.fullmatch(r"lsnap-[0-9a-f]{24}", first)
    files_after_first = sorted(p.name for p in provider.snapshots_dir.iterdir())

    # A retry after a lost response: same id, no second snapshot, the first one's contents.
    await run(provider, sandbox, "write_file", path="state.txt", contents="v2")
    again = await provider.snapshot(sandbox, operation_id="run-1/snap-1")
    assert again == first
    assert sorted(p.name for p in provider.snapshots_dir.iterdir()) == files_after_first == [f"{first}.tar"]
    restored = await provider.restore(first, SandboxSpec(), lease_seconds=60)
    assert (await run(provider, restored, "read_file", path="state.txt")).stdout == "v1"

    other = await provider.snapshot(sandbox, operation_id="run-1/snap-2")
    assert other != first
    assert provider.list_snapshots() == sorted([first, other])


async def test_snapshot_reconciles_even_after_the_sandbox_is_gone(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    taken = await provider.snapshot(sandbox, operation_id="op")
    await provider.inject_loss(sandbox)
    assert await provider.snapshot(sandbox, operation_id="op") == taken
    with pytest.raises(SandboxGone):
        await provider.snapshot(sandbox, operation_id="another-op")
    assert provider.list_snapshots() == [taken]
    assert [p.name for p in provider.snapshots_dir.iterdir()] == [f"{taken}.tar"]


async def test_restore_is_a_new_independent_sandbox(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    await run(provider, sandbox, "write_file", path="src/main.py", contents="print('hi')\n")
    await run(provider, sandbox, "shell", command="mkdir -p empty/dir && chmod +x src/main.py")
    snap = await provider.snapshot(sandbox, operation_id="s")

    restored = await provider.restore(snap, SandboxSpec(owner="run-1"), lease_seconds=60)
    assert restored.id != sandbox.id
    assert re.fullmatch(r"lsb-[0-9a-f]{12}", restored.id)
    listing = await run(provider, restored, "shell", command="find . -mindepth 1 | sort; test -x src/main.py")
    assert listing == ToolResult(exit_code=0, stdout="./empty\n./empty/dir\n./src\n./src/main.py\n")
    assert (await run(provider, restored, "read_file", path="src/main.py")).stdout == "print('hi')\n"

    await run(provider, restored, "write_file", path="src/main.py", contents="changed")
    await run(provider, sandbox, "write_file", path="only-in-original", contents="x")
    assert (await run(provider, sandbox, "read_file", path="src/main.py")).stdout == "print('hi')\n"
    assert (await run(provider, restored, "read_file", path="only-in-original")).exit_code == 1

    await provider.destroy(sandbox)
    assert (await run(provider, restored, "read_file", path="src/main.py")).stdout == "changed"


async def test_restore_takes_env_from_the_new_spec(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    snap = await provider.snapshot(sandbox, operation_id="s")
    restored = await provider.restore(snap, SandboxSpec(env={"TOKEN": "t2"}), lease_seconds=60)
    assert (await run(provider, restored, "shell", command='echo "$SECRET|$TOKEN"')).stdout == "|t2\n"


async def test_restore_preserves_symlinks_that_point_outside(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    # What `python -m venv` leaves behind: an absolute link. It must survive, or recovery would fail.
    await run(
        provider,
        sandbox,
        "shell",
        command="mkdir -p venv/bin && ln -s /usr/bin/env venv/bin/tool && ln -s ../.. up",
    )
    snap = await provider.snapshot(sandbox, operation_id="s")
    restored = await provider.restore(snap, SandboxSpec(), lease_seconds=60)
    result = await run(provider, restored, "shell", command="readlink venv/bin/tool; readlink up")
    assert result.stdout == "/usr/bin/env\n../..\n"


async def test_restore_of_unknown_snapshot(provider: LocalProvider) -> None:
    for snapshot_id in (snapshot_id_for("never-taken"), "not-a-snapshot-id", "../../etc/passwd"):
        with pytest.raises(ProvisionError) as info:
            await provider.restore(snapshot_id, SandboxSpec(), lease_seconds=60)
        assert str(info.value) == f"Snapshot {snapshot_id} does not exist"
        assert info.value.retryable is False
    assert provider.leftovers() == []


async def test_restore_rejects_members_that_escape(provider: LocalProvider, tmp_path: Path) -> None:
    snapshot_id = snapshot_id_for("tampered")
    with tarfile.open(provider.snapshots_dir / f"{snapshot_id}.tar", "w") as tar:
        data = b"pwned"
        member = tarfile.TarInfo("../../escaped.txt")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))

    with pytest.raises(ProvisionError) as info:
        await provider.restore(snapshot_id, SandboxSpec(), lease_seconds=60)
    assert info.value.retryable is False
    assert str(info.value).startswith(f"Snapshot {snapshot_id} cannot be restored: ")
    assert await asyncio.to_thread(lambda: list(tmp_path.rglob("escaped.txt"))) == []
    assert list(provider.workspaces_dir.iterdir()) == []
    assert list(provider.leases_dir.iterdir()) == []


async def test_delete_snapshot_is_idempotent(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    snap = await provider.snapshot(sandbox, operation_id="s")
    await provider.delete_snapshot(snap)
    assert provider.list_snapshots() == []
    await provider.delete_snapshot(snap)
    await provider.delete_snapshot(snapshot_id_for("never-taken"))
    await provider.delete_snapshot("../leases")
    assert provider.leases_dir.is_dir()
    with pytest.raises(ProvisionError):
        await provider.restore(snap, SandboxSpec(), lease_seconds=60)


@pytest.mark.parametrize("first", ["original", "copy"])
async def test_a_copied_snapshot_is_an_object_of_its_own_deleted_in_either_order(
    provider: LocalProvider, sandbox: SandboxHandle, first: str
) -> None:
    """copy_snapshot (a fork's own copy of its source's snapshot, sandboxes/fork.py): another id, the same
    workspace; a retry finds the first copy; deleting either leaves the other restorable; nothing is left."""
    await provider.execute(sandbox, ToolCall(operation_id="w", type="write_file", args={"path": "a.txt", "contents": "A"}))
    snap = await provider.snapshot(sandbox, operation_id="s")
    copy = await provider.copy_snapshot(snap, operation_id="c")
    assert copy != snap and await provider.copy_snapshot(snap, operation_id="c") == copy
    assert sorted(provider.list_snapshots()) == sorted([snap, copy])
    gone, kept = (snap, copy) if first == "original" else (copy, snap)
    await provider.delete_snapshot(gone)
    restored = await provider.restore(kept, SandboxSpec(), lease_seconds=60)
    assert (provider.workspace_path(restored.id) / "a.txt").read_text() == "A"
    await provider.destroy(restored)
    await provider.delete_snapshot(kept)
    with pytest.raises(ProvisionError, match="does not exist"):
        await provider.copy_snapshot(snap, operation_id="c2")
    await provider.destroy(sandbox)
    assert provider.leftovers() == []


# ------------------------------------------------------------------------------------------ lifecycle


async def test_destroy_is_idempotent_and_leaves_nothing(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    await run(provider, sandbox, "write_file", path="deep/tree/file", contents="x")
    await run(
        provider, sandbox, "shell", command="chmod a-w deep/tree"
    )  # read-only dirs must not block deletion
    await provider.destroy(sandbox)
    await provider.destroy(sandbox)
    assert provider.leftovers() == []
    assert sandbox.id not in provider._env
    with pytest.raises(SandboxGone) as info:
        await run(provider, sandbox, "shell", command="true")
    assert info.value.sandbox_id == sandbox.id


async def test_everything_the_run_owned_is_gone_after_cleanup(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    snap = await provider.snapshot(sandbox, operation_id="s")
    restored = await provider.restore(snap, SandboxSpec(), lease_seconds=60)
    await run(provider, restored, "write_file", path="f", contents="x")
    assert len(provider.leftovers()) == 7  # two workspaces, two leases, two env files, one snapshot
    await provider.destroy(sandbox)
    await provider.destroy(restored)
    await provider.delete_snapshot(snap)
    assert provider.leftovers() == []


async def test_destroy_while_another_delete_of_its_trash_runs(
    provider: LocalProvider, sandbox: SandboxHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every provision and restore sweeps `.trash-*` while other destroys still delete their trash there, so
    two deletes of one tree meet. Made deterministic: the other delete takes a directory away just before this
    delete opens it (a real FileNotFoundError from the real os.open)."""
    await run(provider, sandbox, "write_file", path="deep/tree/file", contents="x")
    real_open = os.open
    taken: list[str] = []

    def open_after_the_other_delete(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == "tree" and dir_fd is not None and not taken:
            other = real_open(path, os.O_RDONLY, dir_fd=dir_fd)
            try:
                os.unlink("file", dir_fd=other)
            finally:
                os.close(other)
            os.rmdir(path, dir_fd=dir_fd)
            taken.append(path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_after_the_other_delete)
    await provider.destroy(sandbox)
    monkeypatch.undo()
    assert taken == ["tree"]  # the race happened
    assert provider.leftovers() == []


@pytest.mark.parametrize("operation", ["execute", "snapshot", "renew_lease", "suspend", "resume"])
async def test_gone_after_destroy_and_after_injected_loss(provider: LocalProvider, operation: str) -> None:
    for kill in (provider.destroy, provider.inject_loss):
        handle = await provider.provision(SandboxSpec(), lease_seconds=60)
        await kill(handle)
        with pytest.raises(SandboxGone) as info:
            if operation == "execute":
                await run(provider, handle, "read_file", path="f")
            elif operation == "snapshot":
                await provider.snapshot(handle, operation_id=f"after-{kill.__name__}")
            elif operation == "renew_lease":
                await provider.renew_lease(handle, 60)
            elif operation == "suspend":
                await provider.suspend(handle)
            else:
                await provider.resume(handle)
        assert info.value.sandbox_id == handle.id
        assert info.value.retryable is False
    assert provider.leftovers() == []


async def test_lost_workspace_is_gone_and_its_lease_cleaned(
    provider: LocalProvider, sandbox: SandboxHandle
) -> None:
    provider.workspace_path(sandbox.id).rename(provider.home / "elsewhere")
    with pytest.raises(SandboxGone, match="workspace is missing"):
        await run(provider, sandbox, "shell", command="true")
    assert provider.leftovers() == []


async def test_foreign_ids_are_gone_and_never_touch_paths(provider: LocalProvider, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    handle = SandboxHandle(id="../../../victim", provider="local")
    with pytest.raises(SandboxGone):
        await run(provider, handle, "shell", command="true")
    await provider.destroy(handle)
    await provider.inject_loss(handle)
    assert victim.is_dir()


async def test_lease_expiry_makes_the_sandbox_gone(
    provider: LocalProvider, sandbox: SandboxHandle, clock: FakeClock
) -> None:
    clock.advance(599)
    assert (await run(provider, sandbox, "shell", command="echo alive")).stdout == "alive\n"
    clock.advance(1)
    with pytest.raises(SandboxGone, match="lease expired"):
        await run(provider, sandbox, "shell", command="echo alive")
    assert provider.leftovers() == []  # reaped as a real provider's expiry would have


async def test_renew_lease_extends_expiry(
    provider: LocalProvider, sandbox: SandboxHandle, clock: FakeClock
) -> None:
    clock.advance(500)
    renewed = await provider.renew_lease(sandbox, 1000)
    assert renewed.id == sandbox.id
    assert renewed.lease_expires_at == clock.now + 1000
    assert renewed.metadata == sandbox.metadata
    clock.advance(999)
    assert (await run(provider, sandbox, "shell", command="echo ok")).exit_code == 0
    clock.advance(1)
    with pytest.raises(SandboxGone):
        await provider.renew_lease(sandbox, 1000)


async def test_renew_lease_rejects_invalid_lengths(provider: LocalProvider, sandbox: SandboxHandle) -> None:
    with pytest.raises(ProviderError) as info:
        await provider.renew_lease(sandbox, 86_401)
    assert info.value.retryable is False
    assert not isinstance(info.value, SandboxGone)


async def test_list_sandboxes_by_owner(provider: LocalProvider, clock: FakeClock) -> None:
    a1 = await provider.provision(SandboxSpec(owner="a"), lease_seconds=100)
    a2 = await provider.provision(SandboxSpec(owner="a"), lease_seconds=1000)
    b = await provider.provision(SandboxSpec(owner="b"), lease_seconds=1000)
    await provider.provision(SandboxSpec(), lease_seconds=1000)
    a3 = await provider.provision(SandboxSpec(owner="a"), lease_seconds=1000)

    assert sorted(h.id for h in await provider.list_sandboxes("a")) == sorted([a1.id, a2.id, a3.id])
    assert [h.id for h in await provider.list_sandboxes("b")] == [b.id]
    assert await provider.list_sandboxes("nobody") == []

    await provider.destroy(a3)
    clock.advance(100)  # a1 expires
    listed = await provider.list_sandboxes("a")
    assert [h.id for h in listed] == [a2.id]
    assert listed[0] == a2


async def test_list_sandboxes_from_a_fresh_provider(
    provider: LocalProvider, sandbox: SandboxHandle, clock: FakeClock
) -> None:
    # A restarted process finds its sandboxes by owner and can use them, with the env the sandbox was made
    # with (it belongs to the sandbox, as E2B's envVars do), though this process never saw the spec.
    fresh = LocalProvider(provider.home, clock=clock)
    (found,) = await fresh.list_sandboxes("run-1")
    assert found == sandbox
    assert (await run(fresh, found, "shell", command='echo "[$SECRET]"')).stdout == f"[{SECRET}]\n"
    # Kept apart from the lease (which tools read), readable by this user only, and gone with the sandbox.
    env_file = provider.env_dir / f"{sandbox.id}.json"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert SECRET not in (provider.leases_dir / f"{sandbox.id}.json").read_text()
    await fresh.destroy(found)
    assert not env_file.exists() and provider.leftovers() == []


async def test_cleanup_expired(provider: LocalProvider, clock: FakeClock) -> None:
    short = await provider.provision(SandboxSpec(owner="o"), lease_seconds=10)
    short2 = await provider.provision(SandboxSpec(owner="o"), lease_seconds=20)
    long = await provider.provision(SandboxSpec(owner="o"), lease_seconds=1000)
    assert await provider.cleanup_expired() == []

    assert sorted(await provider.cleanup_expired(now=clock.now + 20)) == sorted([short.id, short2.id])
    assert not provider.workspace_path(short.id).exists()
    assert not provider.workspace_path(short2.id).exists()
    assert provider.workspace_path(long.id).is_dir()
    assert [h.id for h in await provider.list_sandboxes("o")] == [long.id]
    assert await provider.cleanup_expired(now=clock.now + 20) == []

    clock.advance(1000)
    assert await provider.cleanup_expired() == [long.id]
    assert provider.leftovers() == []


async def test_cleanup_removes_workspaces_left_without_a_lease(provider: LocalProvider) -> None:
    orphan = await provider.provision(SandboxSpec(), lease_seconds=1000)
    (provider.leases_dir / f"{orphan.id}.json").unlink()  # as after a crash part-way through a destroy
    (provider.workspaces_dir / ".trash-lsb-000000000000-abcd").mkdir()
    assert await provider.cleanup_expired() == [orphan.id]
    assert provider.leftovers() == []


async def test_provision_reaps_expired_sandboxes(provider: LocalProvider, clock: FakeClock) -> None:
    old = await provider.provision(SandboxSpec(), lease_seconds=10)
    clock.advance(10)
    await provider.provision(SandboxSpec(), lease_seconds=10)
    assert not provider.workspace_path(old.id).exists()
    assert not (provider.leases_dir / f"{old.id}.json").exists()


async def test_suspend_blocks_execute_until_resume(
    provider: LocalProvider, sandbox: SandboxHandle, clock: FakeClock
) -> None:
    await provider.suspend(sandbox)
    await provider.suspend(sandbox)  # idempotent
    assert json.loads((provider.leases_dir / f"{sandbox.id}.json").read_text())["suspended"] is True
    with pytest.raises(SandboxSuspendedError) as info:
        await run(provider, sandbox, "shell", command="echo hi")
    assert isinstance(info.value, ProviderError)
    assert info.value.retryable is False
    assert str(info.value) == f"Sandbox {sandbox.id} is suspended; resume it before executing tool calls"

    resumed = await provider.resume(sandbox)
    assert resumed == sandbox
    assert json.loads((provider.leases_dir / f"{sandbox.id}.json").read_text())["suspended"] is False
    assert (await run(provider, resumed, "shell", command="echo hi")).stdout == "hi\n"


async def test_a_suspended_sandbox_still_expires(
    provider: LocalProvider, sandbox: SandboxHandle, clock: FakeClock
) -> None:
    await provider.suspend(sandbox)
    clock.advance(600)
    assert await provider.cleanup_expired() == [sandbox.id]
    with pytest.raises(SandboxGone):
        await provider.resume(sandbox)


async def test_missing_shell_is_a_configuration_error(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path, shell="/nonexistent/shell")
    handle = await provider.provision(SandboxSpec(), lease_seconds=60)
    with pytest.raises(ProviderError, match="was not found") as info:
        await run(provider, handle, "shell", command="true")
    assert info.value.retryable is False


# ------------------------------------------------------------------------------------------ contract defaults


class _Minimal(SandboxProvider):
    name = "minimal"


@pytest.mark.parametrize(
    ("capability", "call"),
    [
        ("snapshot", lambda p, h: p.snapshot(h, operation_id="op")),
        ("restore", lambda p, h: p.restore("snap", SandboxSpec(), lease_seconds=60)),
        ("suspend", lambda p, h: p.suspend(h)),
        ("resume", lambda p, h: p.resume(h)),
        ("snapshot_deletion", lambda p, h: p.delete_snapshot("snap")),
        ("lease_reconciliation", lambda p, h: p.list_sandboxes("owner")),
        ("loss_injection", lambda p, h: p.inject_loss(h)),
        ("inventory", lambda p, h: p.inventory_sandboxes("installation")),
        ("inventory", lambda p, h: p.inventory_snapshots("installation")),
        ("process_reset", lambda p, h: p.reset_processes(h)),
    ],
)
async def test_unsupported_capabilities_raise_before_doing_anything(capability: str, call: Any) -> None:
    provider = _Minimal()
    with pytest.raises(UnsupportedCapability) as info:
        await call(provider, SandboxHandle(id="x", provider="minimal"))
    assert str(info.value) == (
        f"Sandbox provider [minimal] does not support [{capability}]; the operation was not attempted."
    )
    assert info.value.retryable is False
    assert info.value.capability == capability
    with pytest.raises(UnsupportedCapability):
        provider.require(Capability(capability))
