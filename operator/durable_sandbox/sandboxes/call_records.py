"""How a session's calls are named and kept in the journal: derived op ids, redacted arguments, capped results."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from durable_sandbox.providers.contract import SandboxHandle, ToolResult
from durable_sandbox.providers.redaction import REDACTED


def derived_operation_id(run_id: str, session: str, index: int) -> str:
    digest = hashlib.sha256(f"{run_id}\0{session}\0{index}".encode()).hexdigest()
    return "dsv1_" + digest[:40]


def journaled_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """A call's arguments as the journal keeps them: env values replaced by a marker (they may be
    secrets, and the journal is stored and shown); the names stay, so `dsb history` says what was set."""
    env = args.get("env")
    if not isinstance(env, Mapping) or not env:
        return dict(args)
    return {**args, "env": dict.fromkeys(env, REDACTED)}


def result_json(result: ToolResult) -> dict[str, Any]:
    """What the journal keeps of a result: output capped to its first and last 64 KiB per stream, with
    the full size of a truncated stream (``stdoutBytes``/``stderrBytes``)."""
    result = result.capped()
    data: dict[str, Any] = {"exitCode": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}
    if result.stdout_size is not None:
        data["stdoutBytes"] = result.stdout_size
    if result.stderr_size is not None:
        data["stderrBytes"] = result.stderr_size
    return data


def result_from(data: Mapping[str, Any]) -> ToolResult:
    return ToolResult(exit_code=int(data["exitCode"]), stdout=data.get("stdout", ""), stderr=data.get("stderr", ""),
                      stdout_size=data.get("stdoutBytes"), stderr_size=data.get("stderrBytes"))


def handle_json(handle: SandboxHandle) -> dict[str, Any]:
    return handle.model_dump(mode="json")
