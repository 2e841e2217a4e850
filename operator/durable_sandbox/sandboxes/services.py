"""What the process driving runs tells their sandbox sessions: an extension value of the engine."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.providers.contract import SandboxHandle


@dataclass(frozen=True)
class SandboxServices:
    """What the process driving runs tells their sandbox sessions (an extension value of the engine:
    ``Engine(extensions=[SandboxServices(...)])``; `dsb` gives none). The operator serves many Workflows from
    one process, so what differs per run is a function of the run id."""

    # run id -> the owner tag of its sandboxes (``<namespace>/<workflow uid>``; orphans are found by it)
    owner: Callable[[str], str | None] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)  # on every sandbox (the operator's installation)
    # (run id, Sandbox resource name) -> that resource's live sandbox, for a session that attaches to it
    attached: Callable[[str, str], Awaitable[SandboxHandle]] | None = None
    # How many times a sandbox's destroy or a snapshot's deletion is tried before the cleanup fails (the run's
    # cleanup, then the Workflow's finalizer: CleanupBlocked); None: ``retries.CLEANUP_ATTEMPTS``.
    cleanup_attempts: int | None = None

    @staticmethod
    def of(rt: RunRuntime) -> SandboxServices:
        return rt.extensions.get(SandboxServices) or _NO_SERVICES


_NO_SERVICES = SandboxServices()
