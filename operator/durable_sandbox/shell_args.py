"""The arguments of a ``shell`` tool call, as every provider reads them (``command``; optional ``timeout``, ``cwd``,
``env``). One builder for whoever sends one: the engine's sandbox session and the Sandbox client; it imports
nothing, so the light client can use it without the provider contract."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["shell_args"]


def shell_args(command: str, timeout: float | None = None, cwd: str | None = None,
               env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``command`` with the options that were given (an empty ``env`` is no option: the sandbox's own stands)."""
    args: dict[str, Any] = {"command": command}
    if timeout is not None:
        args["timeout"] = timeout
    if cwd is not None:
        args["cwd"] = cwd
    if env:
        args["env"] = dict(env)
    return args
