"""Where an exec of a pod-backed provider goes, and how the provider knows it went there: the hook
``kubernetes_calls.PodCalls`` asks before and after every exec, so one implementation of calls and snapshots
(``kubernetes_calls.py``, ``kubernetes_snapshots.py``) serves every provider whose sandbox is a Pod.

* the ``kubernetes`` provider: the Pod named by the handle, verified by its recorded uid or the operator's seal
  (``kubernetes_verification.py``);
* the ``agent-sandbox`` provider: the Pod the recorded SandboxClaim's Sandbox names, verified by the claim's and
  the Pod's recorded uids (``agent_sandbox_binding.py``, ``agent_sandbox_claims.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from durable_sandbox.providers.contract import SandboxHandle

__all__ = ["ExecTarget", "ExecTargets"]


@dataclass(frozen=True)
class ExecTarget:
    """One Pod's container, as verified just before an exec: its namespace, name, uid and container."""

    namespace: str
    pod: str
    uid: str
    container: str


class ExecTargets(Protocol):
    """Which Pod and container an exec for ``handle`` goes to, verified how (a provider implements both)."""

    async def _exec_target(self, handle: SandboxHandle, what: str) -> ExecTarget:
        """The sandbox's Pod and container, returned only once it is known to be the sandbox's own; else
        :class:`SandboxGone` (nothing is sent). ``what`` names the exec in errors."""
        ...

    async def _confirm_target(self, handle: SandboxHandle, target: ExecTarget, what: str) -> None:
        """After the exec: return only if ``target`` is still the sandbox's Pod (the same uid), so that what came
        back ran there; else :class:`SandboxGone` (the result is not used)."""
        ...
