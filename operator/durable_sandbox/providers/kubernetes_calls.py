"""The kubernetes provider's tool calls: one exec each of a fixed boot command reading its script from stdin
(``kubernetes_scripts.py``), output kept by the journal's head/tail rule, a timeout that kills every process of
the call, and the image probe a new Pod passes before it is used."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from durable_sandbox.providers import kubernetes_scripts as scripts
from durable_sandbox.providers.contract import (
    TOOL_TYPES,
    ProviderError,
    ProvisionError,
    SandboxGone,
    SandboxHandle,
    ToolCall,
    ToolResult,
    file_not_found_result,
    wrote_file_result,
)
from durable_sandbox.providers.dispatch import dispatch, path_arg, shell_args, string_arg
from durable_sandbox.providers.exec_target import ExecTarget, ExecTargets
from durable_sandbox.providers.kubernetes_exec import ExecFailed, ExecRejected, StreamBroken
from durable_sandbox.providers.kubernetes_verification import PodVerification
from durable_sandbox.providers.output import OutputBuffer
from durable_sandbox.providers.streaming import Stream, current_sink

log = logging.getLogger("durable_sandbox.providers.kubernetes")

__all__ = ["TIMEOUT_EXIT_CODE", "PodCalls", "chunks", "read_result"]

TIMEOUT_EXIT_CODE = 124
_KILLED_EXIT_CODES = frozenset({128 + 9, 128 + 15})  # the exec's shell ended by SIGKILL or SIGTERM
_KILL_GRACE_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 60.0  # a read_file sends at most 128 KiB: one past this never got its file


class PodCalls(PodVerification):
    """Runs scripts in a sandbox Pod: calls, the probe."""

    read_timeout: float = READ_TIMEOUT_SECONDS

    async def _run(self, handle: SandboxHandle, script: bytes, *, stdout: Callable[[bytes], Any] | None = None,
                   stderr: Callable[[bytes], Any] | None = None, data: AsyncIterator[bytes] | None = None,
                   what: str, unverified: ExecTarget | None = None) -> int:
        """One exec of ``script`` (then ``data``) in the sandbox; its exit code. Loss is :class:`SandboxGone`.
        ``unverified``: the Pod to exec in without the reads around it; only for a script that carries nothing
        of the sandbox's, whose answer the caller confirms itself (a new Pod's image check, sealed by its uid)."""
        await self._api()
        assert self._exec is not None
        # The exec goes to a Pod *by name*: whoever may delete and create Pods can put another one there. Nothing
        # (the script, a call's env, restored files) is sent before the Pod is known to be the sandbox's own, and
        # nothing that came back is believed unless it still is afterwards (the ExecTargets hook, exec_target.py).
        targets: ExecTargets = self  # the hook (a provider whose sandbox is another Pod overrides both methods)
        target = unverified if unverified is not None else await targets._exec_target(handle, what)

        async def stdin() -> AsyncIterator[bytes]:
            yield script
            if data is not None:
                async for chunk in data:
                    yield chunk

        try:
            outcome = await self._exec.run(target.namespace, target.pod, target.container, scripts.boot_command(script),
                                           stdout=stdout or _discard, stderr=stderr or _discard, stdin=stdin(),
                                           what=f"{what} in sandbox {handle.id}")
        except (ExecRejected, StreamBroken) as exc:
            raise await self._lost(handle, exc) from None
        except ExecFailed as exc:
            lost = await self._lost(handle, exc)
            raise lost from None
        if outcome.exit_code in _KILLED_EXIT_CODES:
            # A Pod deleted or evicted while a call runs stops its container: the exec's shell is killed and
            # the status channel says 137 (or 143) instead of breaking the stream. That is the sandbox lost,
            # not the call's outcome; recorded as a result, a replay after restore could never match it.
            gone = await self._lost(handle, ProviderError(f"{what} in sandbox {handle.id}: killed"))
            if isinstance(gone, SandboxGone):
                raise gone
        if unverified is None:
            await targets._confirm_target(handle, target, what)
        return outcome.exit_code

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        if call.type in TOOL_TYPES:
            await self._require_live(handle)
        return await dispatch(call, {"shell": partial(self._shell, handle), "write_file": partial(self._write_file, handle),
                                     "read_file": partial(self._read_file, handle)})

    async def _shell(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        args = shell_args(call)
        command, timeout, cwd, env = args.command, args.timeout, args.cwd, args.env
        tag = _tag(handle, call)
        out, err = OutputBuffer(), OutputBuffer()
        script = scripts.shell(command, tag=tag, cwd=cwd, env=env, workspace=self.workspace)
        code = await self._tagged(handle, script, tag, timeout, stdout=_teed(out, "stdout"), stderr=_teed(err, "stderr"),
                                  what=f"shell call {call.operation_id}")
        if code is None:
            assert timeout is not None
            text = err.text()
            separator = "\n" if text and not text.endswith("\n") else ""
            return ToolResult(exit_code=TIMEOUT_EXIT_CODE, stdout=out.text(),
                              stderr=f"{text}{separator}Command timed out after {timeout:g} seconds",
                              stdout_size=out.full_size, stderr_size=err.full_size)
        return ToolResult(exit_code=code, stdout=out.text(), stderr=err.text(), stdout_size=out.full_size,
                          stderr_size=err.full_size)

    async def _tagged(self, handle: SandboxHandle, script: bytes, tag: str, timeout: float | None, *,
                      stdout: Callable[[bytes], Any], stderr: Callable[[bytes], Any], what: str) -> int | None:
        """The exit code of ``script``, whose processes carry ``tag``; None when it ran past ``timeout``: then
        every process of it is killed first. Cancelled, it kills them too (nothing of a call outlives it)."""
        task = asyncio.ensure_future(self._run(handle, script, stdout=stdout, stderr=stderr, what=what))
        try:
            done, _ = await asyncio.wait([task], timeout=timeout)
            if not done:
                await self._kill_call(handle, tag)
                with contextlib.suppress(asyncio.TimeoutError, Exception):
                    await asyncio.wait_for(asyncio.shield(task), _KILL_GRACE_SECONDS)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                return None
            return task.result()
        except asyncio.CancelledError:
            # A cancelled step must not leave its command running in the Pod.
            task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.shield(self._kill_call(handle, tag))
            raise

    async def _kill_call(self, handle: SandboxHandle, tag: str) -> None:
        with contextlib.suppress(ProviderError):
            await self._run(handle, scripts.kill_call(tag), what="stop a timed-out call")

    async def _read_file(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        """The file's bytes (bounded in the Pod: ``scripts.read_file``), read within ``read_timeout``: a read that
        never gets its file (a FIFO swapped in by the sandbox's code after the script checked it) is killed there,
        not left holding the Sandbox's turn."""
        path = path_arg(call)
        tag = _tag(handle, call)
        out, err = OutputBuffer(), OutputBuffer(4096)
        code = await self._tagged(handle, scripts.read_file(path, workspace=self.workspace, tag=tag), tag,
                                  self.read_timeout, stdout=out.feed, stderr=err.feed, what=f"read {path}")
        if code is None:
            return ToolResult(exit_code=1, stdout="", stderr=f"Cannot read {path}: it was not read within "
                              f"{self.read_timeout:g}s (not a regular file any more? code in the sandbox may have "
                              "swapped it); read it again, or look at it with a shell call")
        return read_result(code, path, out, err)

    async def _write_file(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        path = path_arg(call)
        data = string_arg(call, "contents").encode("utf-8")
        err = OutputBuffer(4096)
        code = await self._run(handle, scripts.write_file(path, len(data), workspace=self.workspace), stderr=err.feed, data=chunks(data),
                               what=f"write {path}")
        if code == 0:
            return wrote_file_result(path, len(data))
        return _file_failure(code, path, "write", err)

    async def _probe(self, handle: SandboxHandle, *, unverified: ExecTarget | None = None, prefix: bytes = b"") -> None:
        """The image check (``prefix``: a setup script run first in the same exec, its failure the check's)."""
        stderr = OutputBuffer(4096)
        try:
            code = await self._run(handle, prefix + scripts.probe(workspace=self.workspace), stderr=stderr.feed,
                                   what="check the image", unverified=unverified)
        except ExecFailed as exc:
            raise ProvisionError(f"sandbox {handle.id}: the image cannot run /bin/sh ({exc}); a sandbox image needs "
                                 f"a POSIX shell and tar", retryable=False) from None
        if code == scripts.PROBE_MISSING:
            raise ProvisionError(f"sandbox {handle.id}: the image has no {stderr.text().strip()!r}; a sandbox image "
                                 f"needs sh, tar, head, cat, tr, mkdir, mv, rm and readlink (busybox has them)",
                                 retryable=False)
        if code != 0:
            raise ProvisionError(f"sandbox {handle.id}: {stderr.text().strip() or f'the image check exited {code}'}",
                                 retryable=False)

    async def reset_processes(self, handle: SandboxHandle) -> None:
        """Every process in the Pod but the keep-alive (PID 1) ended (kubernetes_scripts.reset_processes)."""
        errors: list[bytes] = []
        if await self._run(handle, scripts.reset_processes(), stderr=errors.append, what="end what earlier calls left"):
            raise ProviderError(f"Sandbox {handle.id}: could not end the processes earlier calls left running "
                                f"({b''.join(errors).decode(errors='replace').strip()[:200]}); no call starts beside them")



def _tag(handle: SandboxHandle, call: ToolCall) -> str:
    """What marks every process of one call (its environment's ``DSB_CALL``), so that all of them can be killed."""
    return hashlib.sha256(f"{handle.id}\0{call.operation_id}\0{secrets.token_hex(8)}".encode()).hexdigest()[:24]


def _teed(buffer: OutputBuffer, stream: Stream) -> Callable[[bytes], None]:
    """``buffer.feed``, and the caller's sink too when it wants the output while the call runs (output_streaming)."""
    sink = current_sink()
    if sink is None:
        return buffer.feed

    def feed(data: bytes) -> None:
        buffer.feed(data)
        sink(stream, data)

    return feed


def _discard(_: bytes) -> None:
    return None



async def chunks(data: bytes, size: int = 256 * 1024) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]



def read_result(code: int, path: str, out: OutputBuffer, err: OutputBuffer) -> ToolResult:
    """The ToolResult of a read_file script (``kubernetes_scripts.read_file``): a file over twice the kept bytes
    comes as its first and last bytes (exit ``TRUNCATED``) and its size (stderr), and is shown like any cut output."""
    if code == scripts.TRUNCATED:
        sent = bytes(out.head + out.tail) if not out.truncated else bytes(out.head) + bytes(out.tail)
        said = err.text().strip()
        size = int(said) if said.isdigit() else len(sent)
        cut = OutputBuffer(out.keep)
        cut.feed(sent[:out.keep])
        cut.skip(size - len(sent))
        cut.feed(sent[out.keep:])
        return ToolResult(exit_code=0, stdout=cut.text(), stderr="", stdout_size=cut.full_size)
    if code == 0:
        return ToolResult(exit_code=0, stdout=out.text(), stderr="", stdout_size=out.full_size)
    return _file_failure(code, path, "read", err)


def _file_failure(code: int, path: str, verb: str, err: OutputBuffer) -> ToolResult:
    if code == scripts.NOT_FOUND:
        if verb == "read":
            return file_not_found_result(path)
        text = f"Cannot write {path}: a parent directory is missing"
    elif code == scripts.IS_DIRECTORY:
        text = f"Cannot {verb} {path}: Is a directory"
    elif code == scripts.OUTSIDE:
        text = f"Unsafe path: {path}: it resolves outside the workspace through a symlink"
    elif code == scripts.NOT_REGULAR:
        text = f"Cannot {verb} {path}: it is not a regular file; only regular files can be {verb}"
    elif code == scripts.NO_DIRECTORY:
        text = f"Cannot {verb} {path}: a parent is not a directory"
    else:
        text = f"Cannot {verb} {path}: {err.text().strip() or f'exit {code}'}"
    return ToolResult(exit_code=1, stdout="", stderr=text)
