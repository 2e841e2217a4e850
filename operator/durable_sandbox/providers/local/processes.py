"""Shell calls and the supervision of their processes: each call runs ``<shell> -lc <command>`` in its own process
group under a small supervisor process (``providers/_call_supervisor.py``) that kills the group and every
descendant when the call ends (exit, timeout, cancellation, destroy) or the worker dies."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable_sandbox.providers.contract import ConfigurationError, ProviderError, SandboxGone, ToolResult
from durable_sandbox.providers.local.arguments import ENV_NAME, Refused, parse_args, resolve_inside
from durable_sandbox.providers.output import OutputBuffer
from durable_sandbox.providers.streaming import OutputSink, current_sink

TIMEOUT_EXIT_CODE = 124
# How long to keep reading output after a call's process group was killed. Only a process that escaped
# the group (setsid) can still hold the pipes open; its output is not worth hanging the call for.
_DRAIN_GRACE_SECONDS = 1.0
# How long a call's supervisor may take to kill the call's processes before it is killed itself.
_STOP_GRACE_SECONDS = 5.0
_SUPERVISOR = Path(__file__).parent.parent / "_call_supervisor.py"
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


async def discard_spawn(spawn: asyncio.Future[tuple[asyncio.SubprocessTransport, CallProtocol]]) -> None:
    """Let a spawn that the caller stopped waiting for finish, then kill what it started."""
    try:
        transport, _ = await spawn
    except Exception:
        return  # nothing was started
    stop_call(transport.get_pid())
    transport.close()


class CallProtocol(asyncio.SubprocessProtocol):
    """Collects a call's output and reports process exit and pipe closure separately."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sink: OutputSink | None = None) -> None:
        self.sink = sink  # the caller's, when it wants the output while the call runs (providers/streaming.py)
        # Bounded: a call printing gigabytes costs 2 x 64 KiB per stream here (providers/output.py).
        self.stdout = OutputBuffer()
        self.stderr = OutputBuffer()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.pipes_closed: asyncio.Future[None] = loop.create_future()
        self._open_pipes = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        (self.stdout if fd == 1 else self.stderr).feed(data)
        if self.sink is not None:
            self.sink("stdout" if fd == 1 else "stderr", data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open_pipes.discard(fd)
        if not self._open_pipes and not self.pipes_closed.done():
            self.pipes_closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


def stop_call(supervisor: int) -> None:
    """Ask a call's supervisor to kill every process of the call and exit (it does so at once)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(supervisor, signal.SIGTERM)


async def finish_call(supervisor: int, protocol: CallProtocol) -> None:
    """Make sure nothing of a call is left running, then collect what remains of its output."""
    if not protocol.exited.done():
        stop_call(supervisor)
        done, _ = await asyncio.wait([protocol.exited], timeout=_STOP_GRACE_SECONDS)
        if not done:  # the supervisor is stuck: kill it; its shell then dies by its parent-death signal
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(supervisor, signal.SIGKILL)
    await asyncio.wait([protocol.exited, protocol.pipes_closed], timeout=_DRAIN_GRACE_SECONDS)


class ShellCalls:
    """The shell calls of one provider, and the supervisors of those in flight (by sandbox)."""

    def __init__(self, shell: str, running: dict[str, set[int]], sandbox_env: Callable[[str], dict[str, str]],
                 exists: Callable[[str], bool]) -> None:
        self.shell = shell
        # Process groups of calls in flight, so a destroy or loss kills them instead of leaving them
        # running in a deleted directory.
        self.running = running
        self._sandbox_env = sandbox_env
        self._exists = exists

    def stop(self, sandbox_id: str) -> None:
        """End the calls of ``sandbox_id`` still in flight."""
        for supervisor in self.running.pop(sandbox_id, set()):
            stop_call(supervisor)

    async def call(self, sandbox_id: str, workspace: Path, args: dict[str, Any]) -> ToolResult:
        command, timeout, cwd, call_env = parse_args(
            "shell",
            args,
            required={"command": str},
            optional={"timeout": (int, float), "cwd": str, "env": dict},
        )
        if not command:
            raise Refused("Invalid arguments for shell: 'command' must be a non-empty string")
        if timeout is not None and (isinstance(timeout, bool) or not math.isfinite(timeout) or timeout <= 0):
            raise Refused("Invalid arguments for shell: 'timeout' must be a positive number of seconds")
        run_dir = workspace
        if cwd is not None:
            run_dir = resolve_inside(workspace, cwd)
            if not run_dir.is_dir():
                raise Refused(f"Invalid arguments for shell: cwd {cwd} is not a directory in the workspace")
        env = self._env(sandbox_id, workspace, call_env)
        shell = shutil.which(self.shell)
        if shell is None:
            raise ConfigurationError(f"The local provider's shell {self.shell!r} was not found")
        transport, protocol = await self._spawn(sandbox_id, run_dir, shell, command, env, current_sink())
        supervisor = transport.get_pid()
        self.running.setdefault(sandbox_id, set()).add(supervisor)
        if not self._exists(sandbox_id):
            # Destroyed while the process was starting, before destroy could know of it.
            stop_call(supervisor)
        try:
            done, _ = await asyncio.wait([protocol.exited], timeout=timeout)
            timed_out = not done
        finally:
            # Also on cancellation: a cancelled step must not leave its command running.
            running = self.running.get(sandbox_id)
            if running is not None:
                running.discard(supervisor)
                if not running:
                    self.running.pop(sandbox_id, None)
            try:
                await finish_call(supervisor, protocol)
            finally:
                transport.close()
        return _result(sandbox_id, transport, protocol, timeout if timed_out else None)

    def _env(self, sandbox_id: str, workspace: Path, call_env: dict[Any, Any] | None) -> dict[str, str]:
        """The call's environment: a minimal base, the sandbox's env, then the call's own (checked)."""
        env = {
            "PATH": os.environ.get("PATH", _DEFAULT_PATH),
            "HOME": str(workspace),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        env.update(self._sandbox_env(sandbox_id))
        if call_env is not None:
            for key, value in call_env.items():
                if (
                    not isinstance(key, str)
                    or not ENV_NAME.fullmatch(key)
                    or not isinstance(value, str)
                    or "\0" in value
                ):
                    raise Refused(
                        f"Invalid arguments for shell: env entry {key!r} must map a name to a string"
                    )
            env.update(call_env)
        return env

    async def _spawn(self, sandbox_id: str, run_dir: Path, shell: str, command: str,
                     env: dict[str, str], sink: OutputSink | None) -> tuple[asyncio.SubprocessTransport, CallProtocol]:
        loop = asyncio.get_running_loop()
        # A protocol rather than asyncio.subprocess.Process: Process.wait() also waits for the pipes to
        # close, so a backgrounded child holding stdout would stall the call until it exited.
        # The call runs under a supervisor (see _call_supervisor.py) that kills every process of the
        # call when the call ends, and when this worker dies, even processes that left its group.
        spawn = asyncio.ensure_future(
            loop.subprocess_exec(
                lambda: CallProtocol(loop, sink),
                sys.executable,
                "-I",
                "-S",
                str(_SUPERVISOR),
                str(os.getpid()),
                shell,
                "-lc",
                command,
                cwd=run_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a terminal's Ctrl-C reaches the worker, which stops the call
            )
        )
        try:
            # Shielded: cancelling subprocess_exec while it connects the pipes can hang forever on
            # CPython 3.11 (its cleanup waits for pipes that never connect).
            return await asyncio.shield(spawn)
        except asyncio.CancelledError:
            await discard_spawn(spawn)
            raise
        except FileNotFoundError as e:
            if not run_dir.is_dir():  # noqa: ASYNC240 - one stat, only when the spawn failed
                raise SandboxGone(sandbox_id, "its workspace is missing") from e
            raise ConfigurationError(f"The local provider's shell {self.shell!r} was not found") from e


def _result(sandbox_id: str, transport: asyncio.SubprocessTransport, protocol: CallProtocol,
            timed_out_after: float | None) -> ToolResult:
    """What the call returns: its output, and its exit code (124 and a message on a timeout)."""
    out, err = protocol.stdout.text(), protocol.stderr.text()
    sizes = {"stdout_size": protocol.stdout.full_size, "stderr_size": protocol.stderr.full_size}
    if timed_out_after is not None:
        message = f"Command timed out after {timed_out_after:g} seconds"
        separator = "\n" if err and not err.endswith("\n") else ""
        err = f"{err}{separator}{message}"
        return ToolResult(exit_code=TIMEOUT_EXIT_CODE, stdout=out, stderr=err, **sizes)
    code = transport.get_returncode()
    if code is None:  # unreachable after SIGKILL unless the kernel is very slow; never report success
        raise ProviderError(f"The shell of {sandbox_id} did not exit after being killed")
    # Report death by signal the way a shell does (128 + signal), not as a negative number.
    return ToolResult(exit_code=code if code >= 0 else 128 - code, stdout=out, stderr=err, **sizes)
