"""The e2b provider's tool calls: ``write_file`` and ``read_file`` through envd's ``/files``, ``shell`` through
envd's Connect process stream (as E2B's SDK starts commands: a login bash), with envd enforcing a call's timeout
(exit 124 and the output so far), retried only when the failure proves the command did not start."""

from __future__ import annotations

import base64
import logging
from functools import partial
from typing import Any

import httpx

from durable_sandbox.providers.contract import (
    ProviderError,
    SandboxHandle,
    ToolCall,
    ToolResult,
    file_not_found_result,
    safe_relative_path,
    wrote_file_result,
)
from durable_sandbox.providers.dispatch import dispatch, path_arg, shell_args, string_arg
from durable_sandbox.providers.e2b_connect import (
    ConnectProtocolError,
    ConnectStreamError,
    ConnectStreamTruncated,
    encode_envelope,
    read_process_stream,
)
from durable_sandbox.providers.e2b_envd import ENVD_USER, HOME, E2BEnvd
from durable_sandbox.providers.e2b_http import Transient, retry_after

log = logging.getLogger("durable_sandbox.providers.e2b")

__all__ = ["KEEPALIVE_PING_SECONDS", "TIMEOUT_EXIT_CODE", "E2BCalls"]

KEEPALIVE_PING_SECONDS = 50  # asks envd for keepalive events, so idle proxies keep long commands' streams open
TIMEOUT_EXIT_CODE = 124  # what coreutils' timeout(1) reports, so scripts can recognise it


class E2BCalls(E2BEnvd):
    """Tool calls: files through envd's ``/files``, shell commands through its Connect process stream."""

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        return await dispatch(call, {"shell": partial(self._shell, handle), "write_file": partial(self._write_file, handle),
                                     "read_file": partial(self._read_file, handle)})

    async def _write_file(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        path = path_arg(call)
        data = string_arg(call, "contents").encode()
        op = f"write {path} in sandbox {handle.id}"
        base, headers = await self._envd(handle)
        response = await self._request(
            op, "POST", f"{base}/files", params=self._files_params(handle, path),
            files={"file": (safe_relative_path(path), data, "application/octet-stream")}, headers=headers,
        )
        if response.status_code != 200:
            self._envd_fail(op, response, handle)
        return wrote_file_result(path, len(data))

    async def _read_file(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        path = path_arg(call)
        op = f"read {path} in sandbox {handle.id}"
        base, headers = await self._envd(handle)
        response = await self._request(op, "GET", f"{base}/files", params=self._files_params(handle, path),
                                       headers=headers)
        if response.status_code == 200:
            return ToolResult(exit_code=0, stdout=response.content.decode("utf-8", errors="replace"), stderr="")
        # envd's 404 for a missing path says so; any other 404 comes from the proxy: the sandbox is gone.
        if response.status_code == 404 and "does not exist" in self._server_message(response):
            return file_not_found_result(path)
        if response.status_code == 400 and "directory" in self._server_message(response):
            return ToolResult(exit_code=1, stdout="", stderr=f"Is a directory: {path}")
        self._envd_fail(op, response, handle)

    async def _shell(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        args = shell_args(call)
        command, timeout, env = args.command, args.timeout, args.env
        cwd = f"{HOME}/{args.cwd}" if args.cwd is not None else None
        # As the SDK starts commands: a login bash with -l -c; cwd only when asked (envd defaults to home).
        process: dict[str, Any] = {"cmd": "/bin/bash", "args": ["-l", "-c", command]}
        if env:
            process["envs"] = env
        if cwd is not None:
            process["cwd"] = cwd
        base, headers = await self._envd(handle)
        headers = {
            **headers,
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            "Keepalive-Ping-Interval": str(KEEPALIVE_PING_SECONDS),
        }
        if self._explicit_user(handle):
            headers["Authorization"] = "Basic " + base64.b64encode(f"{ENVD_USER}:".encode()).decode()
        if timeout is not None:
            headers["Connect-Timeout-Ms"] = str(max(1, round(timeout * 1000)))
        body = encode_envelope({"process": process, "tag": call.operation_id, "stdin": False})
        op = f"run shell call {call.operation_id} in sandbox {handle.id}"
        attempt = 0
        await self._hold_back()
        while True:
            try:
                return await self._stream_process(op, f"{base}/process.Process/Start", body, headers, handle, timeout)
            except Transient as failure:  # only failures that prove the command did not start
                if not await self._backoff(attempt, failure):
                    raise self._gave_up(failure, attempt + 1) from None
                attempt += 1

    async def _stream_process(self, op: str, url: str, body: bytes, headers: dict[str, str],
                              handle: SandboxHandle, command_timeout: float | None) -> ToolResult:
        request = self._client.build_request("POST", url, content=body, headers=headers,
                                             timeout=httpx.Timeout(self._client.timeout.connect, read=None))
        try:
            response = await self._client.send(request, stream=True)
        except httpx.ConnectError:
            raise Transient(f"{op}: could not connect to the sandbox") from None
        except httpx.TransportError as exc:
            raise ProviderError(f"{op}: {type(exc).__name__}; the command may have run") from None
        try:
            log.debug("e2b POST /process.Process/Start -> %s", response.status_code)
            if response.status_code != 200:
                await response.aread()
                if response.status_code in (429, 503):
                    raise Transient(f"{op}: E2B answered {response.status_code}",
                                     retry_after(response, self._clock()), rate_limited=response.status_code == 429)
                self._envd_fail(op, response, handle)
            content_type = response.headers.get("Content-Type", "")
            if content_type.split(";")[0].strip() != "application/connect+json":
                raise ConnectProtocolError(f"{op}: expected a Connect stream (application/connect+json), got {content_type!r}")
            try:
                outcome = await read_process_stream(response.aiter_raw())
            except ConnectStreamError as exc:
                if exc.code == "deadline_exceeded" and command_timeout is not None:
                    return _timed_out(exc, command_timeout)
                raise ConnectStreamError(exc.code, self._redact(exc.server_message), context=op) from None
            except (ConnectProtocolError, ConnectStreamTruncated) as exc:
                raise type(exc)(f"{op}: {self._redact(str(exc))}") from None
            except httpx.TransportError as exc:
                raise ConnectStreamTruncated(
                    f"{op}: the connection broke mid-stream ({type(exc).__name__}); the command may or may not have finished"
                ) from None
        finally:
            await response.aclose()
        if outcome.end_error:
            log.debug("e2b process %s ended with error text %r", outcome.pid, self._redact(outcome.end_error))
        return ToolResult(
            exit_code=outcome.exit_code if outcome.exit_code is not None else 1,
            stdout=outcome.stdout.decode("utf-8", errors="replace"),
            stderr=outcome.stderr.decode("utf-8", errors="replace"),
        )



def _timed_out(exc: ConnectStreamError, seconds: float) -> ToolResult:
    """The deadline we asked envd to enforce passed: the command ran and was killed, as with the local
    provider (exit 124, the output so far, and the reason appended to stderr)."""
    out = exc.partial.stdout.decode("utf-8", errors="replace") if exc.partial else ""
    err = exc.partial.stderr.decode("utf-8", errors="replace") if exc.partial else ""
    separator = "\n" if err and not err.endswith("\n") else ""
    return ToolResult(exit_code=TIMEOUT_EXIT_CODE, stdout=out,
                      stderr=f"{err}{separator}Command timed out after {seconds:g} seconds")

