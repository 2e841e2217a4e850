"""The errors a sandbox session raises into the run (each says what was wrong and what to do)."""

from __future__ import annotations

from typing import Any

from durable_sandbox.engine.errors import DurableError
from durable_sandbox.providers.contract import SandboxHandle, ToolResult
from durable_sandbox.sandboxes import journal


class ReconstructionError(DurableError):
    def __init__(self, op_id: str, recorded: ToolResult, replayed: ToolResult) -> None:
        self.op_id = op_id
        super().__init__(
            f"Reconstruction operation {op_id} produced a different outcome. Recorded exit {recorded.exit_code}, "
            f"replayed exit {replayed.exit_code}"
            + ("; stdout differs" if recorded.stdout != replayed.stdout else "")
            + ("; stderr differs" if recorded.stderr != replayed.stderr else "")
            + ". The sandbox cannot be rebuilt faithfully (the calls are not deterministic); the run fails "
            "rather than continue on a different workspace."
        )


class RecoveryBudgetExhausted(DurableError):
    def __init__(self, session: str, budget: int) -> None:
        super().__init__(
            f"Sandbox session {session!r} was lost again after {budget} recoveries (the budget per run); "
            f"giving up. Check the provider's health or raise the sandbox lease."
        )


class CleanupFailed(DurableError):
    retryable = True


class AttachedSandboxLost(DurableError):
    """The live sandbox of the Sandbox resource a session attached to is gone: its controller re-creates it (a
    Sandbox's own session calls wait for that and rebuild, ``sessions/rebuild.py``; a Workflow's run fails)."""

    def __init__(self, message: str, lost: SandboxHandle | None) -> None:
        super().__init__(message)
        self.sandbox_id = lost.id if lost is not None else None


class ToolCallFailed(DurableError):
    """A tool call's outcome failed the run under its failure policy (not retried within the run)."""


class ReplayAnswerInvalid(DurableError):
    """An ``ask`` call's replay callback was answered with something else than rerun or skip."""

    def __init__(self, ask: str, value: Any) -> None:
        super().__init__(
            f"Callback {ask!r} was answered {value!r}; the answers are {' or '.join(repr(a) for a in journal.ANSWERS)} "
            f"(rerun: execute the call again into the rebuilt sandbox; skip: keep its journaled result). A signal "
            f"cannot be changed once given, so the run fails; re-create the Workflow (or run the manifest again "
            f"under a new run id) and answer rerun or skip."
        )
