"""The call API's wire format: one pydantic model per call kind, the answer, and the errors.

Every request carries the caller's ``operationId``: the call's identity in the Sandbox's journal, so a request
sent again (a dropped connection, a restarted client) returns the journaled result instead of running twice.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from durable_sandbox.providers.contract import ToolCall, ToolResult

__all__ = ["CALL_KINDS", "CallAnswer", "CallRequest", "ErrorBody", "Limits", "ListRequest", "ReadFileRequest",
           "RewindAnswer", "RewindRequest", "ShellRequest", "SnapshotAnswer", "SnapshotRequest", "WriteFileRequest",
           "request_model"]

# Letters, digits and ``._:-``, up to 128: it becomes part of a journal operation id (``calls/<id>``).
OPERATION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
MAX_CALL_TIMEOUT = 3600.0  # seconds a shell call may ask for


class Limits(BaseModel):
    """What one operator process allows a caller (each refusal is a clear error, never a silent cut)."""

    model_config = ConfigDict(frozen=True)

    max_request_bytes: int = 1 << 20  # a request body (write_file's contents included)
    max_concurrent_calls: int = 4  # per Sandbox, in flight or waiting their turn, in this process
    max_timeout: float = MAX_CALL_TIMEOUT
    max_calls_per_second: float = Field(default=20.0, gt=0)  # per caller (Kubernetes user), in this process
    max_streamed_bytes: int = 16 << 20  # a call's output streamed while it runs (the journal keeps 2 x 64 KiB)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    operationId: str = Field(pattern=OPERATION_ID_PATTERN)
    # What rebuilding the sandbox after a loss does with this call once it completed: run it again (its outcome
    # checked) or skip it (its result stands; for a call whose effect is outside the sandbox). Journaled with it.
    onReplay: Literal["rerun", "skip"] = "rerun"
    # A call that cannot change the workspace (the operator builds it): journaled at its completion only (one
    # write) and never replayed into a rebuilt sandbox; ``onReplay`` does not apply to it.
    read_only: ClassVar[bool] = False

    def tool_call(self) -> ToolCall:
        raise NotImplementedError


class ShellRequest(_Request):
    command: str = Field(min_length=1)
    timeout: float | None = Field(default=None, gt=0, le=MAX_CALL_TIMEOUT)
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)

    def tool_call(self) -> ToolCall:
        args: dict[str, Any] = {"command": self.command}
        if self.timeout is not None:
            args["timeout"] = self.timeout
        if self.cwd is not None:
            args["cwd"] = self.cwd
        if self.env:
            args["env"] = dict(self.env)
        return ToolCall(operation_id=self.operationId, type="shell", args=args)


class WriteFileRequest(_Request):
    path: str = Field(min_length=1)
    contents: str

    def tool_call(self) -> ToolCall:
        return ToolCall(operation_id=self.operationId, type="write_file", args={"path": self.path, "contents": self.contents})


class ReadFileRequest(_Request):
    path: str = Field(min_length=1)
    read_only: ClassVar[bool] = True

    def tool_call(self) -> ToolCall:
        return ToolCall(operation_id=self.operationId, type="read_file", args={"path": self.path})


class ListRequest(_Request):
    path: str = "."
    read_only: ClassVar[bool] = True  # ``ls`` in a directory: it reads only

    def tool_call(self) -> ToolCall:
        # A shell call every provider runs (the contract has no listing call): one entry per line, directories
        # ending in "/"; journaled like any shell call, so its retry answers from the journal too.
        command = f"cd -- {shlex.quote(self.path)} && ls -1Ap"
        return ToolCall(operation_id=self.operationId, type="shell", args={"command": command})


CallRequest = ShellRequest | WriteFileRequest | ReadFileRequest | ListRequest
CALL_KINDS: Final[Mapping[str, type[_Request]]] = {
    "shell": ShellRequest, "write_file": WriteFileRequest, "read_file": ReadFileRequest, "list": ListRequest,
}


def request_model(kind: str) -> type[_Request] | None:
    return CALL_KINDS.get(kind)


class CallAnswer(BaseModel):
    """A call's result as the journal keeps it (streams capped to their first and last 64 KiB; ``stdoutBytes``
    and ``stderrBytes`` give a cut stream's full size). ``replayed``: answered from the journal, not run now."""

    operationId: str
    exitCode: int
    stdout: str = ""
    stderr: str = ""
    stdoutBytes: int | None = None
    stderrBytes: int | None = None
    replayed: bool = False

    @classmethod
    def of(cls, operation_id: str, result: ToolResult, *, replayed: bool) -> CallAnswer:
        return cls(operationId=operation_id, exitCode=result.exit_code, stdout=result.stdout, stderr=result.stderr,
                   stdoutBytes=result.stdout_size, stderrBytes=result.stderr_size, replayed=replayed)


class RewindRequest(BaseModel):
    """``POST .../rewind``: keep the session's first ``toCall`` calls, rewind the rest (sessions/rewind.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    toCall: int = Field(ge=0)


class RewindAnswer(BaseModel):
    """A rewind done: the calls rewound (journaled as such, never deleted), and the live sandbox now holding
    exactly the first ``toCall`` calls (``replayed``: the calls replayed into it after the snapshot it came from)."""

    toCall: int
    rewound: list[str]
    sandboxId: str
    replayed: list[str] = Field(default_factory=list)


class SnapshotRequest(BaseModel):
    """``POST .../snapshot``: a snapshot now, in the Sandbox's order of calls (its id names the request)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    operationId: str = Field(pattern=OPERATION_ID_PATTERN)


class SnapshotAnswer(BaseModel):
    """The snapshot taken (``calls``: the session calls it holds); ``replayed``: taken for an earlier request with
    this operationId, answered from the journal."""

    operationId: str
    snapshotId: str
    calls: int
    replayed: bool = False


class ErrorBody(BaseModel):
    """Every refusal: what was wrong, where (the Sandbox, the field, the limit), and what to do."""

    status: int
    reason: Literal["BadRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict", "PayloadTooLarge",
                    "TooManyRequests", "Unavailable", "Failed"]
    what: str
    where: str
    do: str
    retry: bool = False  # the same request (same operationId) may succeed later: clients retry it themselves
    retryAfter: float | None = None  # seconds to wait first (also the Retry-After header, whole seconds)
