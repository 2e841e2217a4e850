"""What a run's error says when a tool call failed it (``failurePolicy``): the reason, the call's command
(or path), and a bounded excerpt of what it printed, so the one line a person reads first (a Workflow's
Failed condition and ``status.error``, ``kubectl describe``, ``dsb inspect``) says what went wrong without
opening the journal. Values of the sandbox's and the call's env are replaced by ``***``: they may be
secrets, and a command that echoes one must not carry it into status or Events."""

from __future__ import annotations

from collections.abc import Iterable

from durable_sandbox.providers.contract import ToolCall, ToolResult
from durable_sandbox.providers.redaction import REDACTED

__all__ = ["COMMAND_LIMIT", "OUTPUT_LIMIT", "failure_message"]

COMMAND_LIMIT = 200  # characters of the command (or path) kept
OUTPUT_LIMIT = 400  # characters of output kept: its end, where a tool prints its error
OUTPUT_LINES = 6


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _tail(text: str) -> str:
    """The last lines of ``text`` joined with `` | ``, cut from the front to ``OUTPUT_LIMIT``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()][-OUTPUT_LINES:]
    joined = " | ".join(lines)
    return joined if len(joined) <= OUTPUT_LIMIT else "…" + joined[-(OUTPUT_LIMIT - 1):]


def _redacted(text: str, secrets: Iterable[str]) -> str:
    for value in sorted({s for s in secrets if s}, key=len, reverse=True):  # longest first: no partial leaks
        text = text.replace(value, REDACTED)
    return text


def failure_message(reason: str, call: ToolCall, result: ToolResult, secrets: Iterable[str] = ()) -> str:
    """``reason`` with the call's command (or path) and the end of its stderr (else stdout)."""
    secrets = list(secrets)
    env = call.args.get("env")
    if isinstance(env, dict):
        secrets.extend(str(v) for v in env.values())
    parts = [reason]
    target = call.args.get("command" if call.type == "shell" else "path")
    if isinstance(target, str) and target:
        parts.append(f"{'command' if call.type == 'shell' else call.type}: {_one_line(target, COMMAND_LIMIT)}")
    for stream, text in (("stderr", result.stderr), ("stdout", result.stdout)):
        if text and text.strip():
            parts.append(f"{stream}: {_tail(text)}")
            break
    return _redacted("; ".join(parts), secrets)
