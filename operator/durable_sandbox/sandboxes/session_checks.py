"""What a session refuses before it provisions anything (pure: options and the journal's provider in, errors out)."""

from __future__ import annotations

from collections.abc import Sequence

from durable_sandbox.providers.contract import ConfigurationError, SandboxProvider, UnsupportedCapability
from durable_sandbox.sandboxes import journal
from durable_sandbox.sandboxes.journal import reserved_operation_id
from durable_sandbox.sandboxes.requirements import unmet


def check_session(sid: str, run_id: str, provider: SandboxProvider, *, journaled_provider: str | None,
                  operation_ids: Sequence[str | None], inject_loss_after: int | None, suspend_between_calls: bool,
                  snapshot_every: int, lease_seconds: int) -> None:
    """Raise what is wrong with session ``sid``'s options: a capability the provider lacks, a lease over its
    maximum, a reserved or repeated operation id, another provider than the one the run's journal names."""
    for missing in unmet(provider.capabilities(), inject_loss_after=inject_loss_after,
                         suspend_between_calls=suspend_between_calls, snapshot_every=snapshot_every,
                         lease_seconds=lease_seconds):
        if missing.capability is not None:
            raise UnsupportedCapability(provider.name, missing.capability)
        raise ConfigurationError(
            f"Sandbox {sid!r}: lease of {lease_seconds} s exceeds provider "
            f"[{provider.name}]'s maximum of {missing.maximum} s"
        )
    check_operation_ids(sid, operation_ids)
    if journaled_provider is not None and journaled_provider != provider.name:
        raise ConfigurationError(
            f"Sandbox {sid!r} of run {run_id!r} was provisioned with provider "
            f"[{journaled_provider}]; a run keeps its provider for its whole life (asked for [{provider.name}])"
        )


def check_operation_ids(sid: str, operation_ids: Sequence[str | None]) -> None:
    """The operation ids given to a session's calls: none reserved, none given twice."""
    seen: dict[str, int] = {}
    for i, given in enumerate(operation_ids):
        if given is None:
            continue
        if reserved_operation_id(given):
            raise ValueError(
                f"Sandbox {sid!r}: operation id {given!r} (call {i}) is reserved for the session's own "
                f"records ({', '.join(sorted(journal.RESERVED_HEADS))}); choose another id"
            )
        if given in seen:
            raise ValueError(
                f"Sandbox {sid!r}: operation id {given!r} is given to calls {seen[given]} and {i}; "
                f"operation ids must be unique (rejected before provisioning)"
            )
        seen[given] = i
