"""One tool call to the provider's handler of its type: the dispatch every provider shares (``shell``,
``write_file``, ``read_file``), and the argument checks the remote providers share (kubernetes, e2b).

A call's type and arguments come from the Workflow's author; a type the provider has no handler for, or
arguments a handler cannot run with (:class:`InvalidCall`), are a *failed result* (exit 1, saying what is
wrong), as a command that fails is, never an exception: the run records it and goes on, and a retry could not
change it. The messages are the local provider's (``Invalid arguments for <tool>: ...``), so a call fails
the same way whichever provider runs it."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from durable_sandbox.providers.contract import (
    ToolCall,
    ToolResult,
    safe_relative_path,
    unsupported_tool_result,
)

__all__ = ["Handler", "InvalidCall", "ShellArgs", "dispatch", "path_arg", "shell_args", "string_arg"]

Handler = Callable[[ToolCall], Awaitable[ToolResult]]
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHELL_ARGS = frozenset({"command", "timeout", "cwd", "env"})


class InvalidCall(Exception):
    """Arguments a call cannot run with: a failed result (exit 1, this text)."""


async def dispatch(call: ToolCall, handlers: Mapping[str, Handler]) -> ToolResult:
    """The result of ``call`` by the handler of its type; an unknown type or :class:`InvalidCall` is a failed
    result."""
    handler = handlers.get(call.type)
    if handler is None:
        return unsupported_tool_result(call.type)
    try:
        return await handler(call)
    except InvalidCall as exc:
        return ToolResult(exit_code=1, stdout="", stderr=str(exc))


@dataclass(frozen=True, slots=True)
class ShellArgs:
    command: str
    timeout: float | None  # seconds
    cwd: str | None  # relative to the workspace, normalised
    env: dict[str, str]


def _relative(path: str) -> str:
    try:
        return safe_relative_path(path)
    except ValueError as exc:
        raise InvalidCall(f"Unsafe path: {path}: {str(exc).removeprefix(f'unsafe path {path!r}: ')}") from None


def path_arg(call: ToolCall) -> str:
    """The call's ``path``, normalised inside the workspace."""
    path = call.args.get("path")
    if not isinstance(path, str):
        raise InvalidCall(f"Invalid arguments for {call.type}: 'path' must be a str")
    return _relative(path)


def string_arg(call: ToolCall, key: str) -> str:
    value = call.args.get(key)
    if not isinstance(value, str):
        raise InvalidCall(f"Invalid arguments for {call.type}: {key!r} must be a str")
    return value


def shell_args(call: ToolCall) -> ShellArgs:
    """A shell call's arguments checked: no unknown one (a typo fails instead of being ignored), a command, a
    finite positive timeout, a cwd inside the workspace, env names a shell accepts and values without NUL."""
    args = call.args
    unexpected = sorted(set(args) - _SHELL_ARGS)
    if unexpected:
        raise InvalidCall(f"Invalid arguments for shell: unexpected argument(s) {', '.join(map(repr, unexpected))}")
    command = args.get("command")
    if not isinstance(command, str) or not command:
        raise InvalidCall("Invalid arguments for shell: 'command' must be a non-empty string")
    timeout = args.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
                                or timeout == float("inf")):
        raise InvalidCall("Invalid arguments for shell: 'timeout' must be a positive number of seconds")
    cwd = args.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise InvalidCall("Invalid arguments for shell: 'cwd' must be a str")
    env = args.get("env") or {}
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and _ENV_NAME.fullmatch(k) and isinstance(v, str) and "\0" not in v
            for k, v in env.items()):
        raise InvalidCall("Invalid arguments for shell: 'env' must map variable names to strings")
    return ShellArgs(command=command, timeout=float(timeout) if timeout is not None else None,
                     cwd=_relative(cwd) if cwd is not None else None, env=dict(env))
