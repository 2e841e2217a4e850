"""A tool call's arguments checked before anything runs: their names and types (a typo fails instead of being
ignored), paths that must stay inside the workspace, env names. A refusal is a failed call (exit 1), not an
exception of the provider."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from durable_sandbox.providers.contract import safe_relative_path
from durable_sandbox.providers.dispatch import InvalidCall

ENV_NAME = re.compile(r"[^=\0]+")


class Refused(InvalidCall):
    """A tool call that fails as a result (exit 1, this stderr) rather than as an exception (the shared
    dispatch, ``providers/dispatch.py``, makes it one)."""

    def __init__(self, stderr: str) -> None:
        super().__init__(stderr)
        self.stderr = stderr


def parse_args(
    tool: str,
    args: dict[str, Any],
    *,
    required: dict[str, type],
    optional: dict[str, type | tuple[type, ...]] | None = None,
) -> list[Any]:
    """Check a call's arguments; a typo (``content`` for ``contents``) fails instead of being ignored."""
    optional = optional or {}
    unexpected = sorted(set(args) - set(required) - set(optional))
    if unexpected:
        raise Refused(
            f"Invalid arguments for {tool}: unexpected argument(s) {', '.join(map(repr, unexpected))}"
        )
    values: list[Any] = []
    for key, kind in required.items():
        if key not in args:
            raise Refused(f"Invalid arguments for {tool}: missing required argument {key!r}")
        if not isinstance(args[key], kind):
            raise Refused(f"Invalid arguments for {tool}: {key!r} must be a {kind.__name__}")
        values.append(args[key])
    for key, kinds in optional.items():
        value = args.get(key)
        if value is not None and not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
            raise Refused(f"Invalid arguments for {tool}: {key!r} must be a {names}")
        values.append(value)
    return values


def resolve_inside(workspace: Path, path: str) -> Path:
    """The real location of ``path`` in ``workspace``; refuses anything that ends up outside it."""
    try:
        relative = safe_relative_path(path)
    except ValueError as e:
        prefix = f"unsafe path {path!r}: "
        message = str(e)
        raise Refused(f"Unsafe path: {path}: {message.removeprefix(prefix)}") from e
    root = workspace.resolve()
    try:
        target = (root / relative).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise Refused(f"Unsafe path: {path}: it cannot be resolved ({e})") from e
    if not target.is_relative_to(root):
        raise Refused(f"Unsafe path: {path}: it resolves outside the workspace through a symlink")
    return target
