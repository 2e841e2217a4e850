"""What a sandbox session asks of its provider's capabilities, judged in one place: by the session, which
refuses before it provisions anything (``SandboxSession``), and by `dsb run`'s check before a run is even
created (``kube/spec/preflight.py``, which names the Workflow's spec fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from durable_sandbox.providers.contract import Capability, ProviderCapabilities

__all__ = ["Unmet", "unmet"]

Option = Literal["inject_loss_after", "suspend_between_calls", "snapshot_every", "lease_seconds"]


@dataclass(frozen=True)
class Unmet:
    """A session option the provider cannot honour: the capability it lacks (None: ``lease_seconds`` is more
    than ``maximum``, the longest lease it grants)."""

    option: Option
    capability: Capability | None = None
    maximum: int | None = None


def unmet(caps: ProviderCapabilities, *, inject_loss_after: int | None = None, suspend_between_calls: bool = False,
          snapshot_every: int = 0, lease_seconds: int | None = None) -> list[Unmet]:
    """Every option the provider with ``caps`` cannot honour, in the order a session checks them."""
    out = []
    if inject_loss_after is not None and not caps.supports(Capability.LOSS_INJECTION):
        out.append(Unmet("inject_loss_after", Capability.LOSS_INJECTION))
    if suspend_between_calls and not (caps.supports(Capability.SUSPEND) and caps.supports(Capability.RESUME)):
        out.append(Unmet("suspend_between_calls", Capability.SUSPEND))
    if snapshot_every and not caps.supports(Capability.SNAPSHOT):
        out.append(Unmet("snapshot_every", Capability.SNAPSHOT))
    if lease_seconds is not None and lease_seconds > caps.maximum_lease_seconds:
        out.append(Unmet("lease_seconds", maximum=caps.maximum_lease_seconds))
    return out
