"""The pre-run check of what only the provider registry can judge: is the provider configured (its
published :meth:`~durable_sandbox.providers.contract.SandboxProvider.configuration_problems`), and does it
support what the Workflow asks of it (loss injection, snapshots, the lease). `dsb run` calls it before it
creates a run, so a Workflow that could only fail is refused (exit 2) instead of leaving a failed run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from durable_sandbox.providers.contract import ConfigurationError, ProviderCapabilities
from durable_sandbox.providers.registry import available_providers, create_provider
from durable_sandbox.sandboxes.requirements import unmet
from durable_sandbox.workflows.sandbox_agent import SandboxSettings


async def sandbox_problems(
    settings: SandboxSettings,
    *,
    snapshot_every: int = 0,
    inject_loss_after: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """One line per problem (``spec.<field>: <reason>``); empty when the sandbox can be provisioned as asked."""
    name = settings.provider
    provider_class = available_providers().get(name)
    if provider_class is None:
        return []  # an unknown provider is reported by the models (spec.sandbox.provider)
    configuration = provider_class.configuration_problems(os.environ if environ is None else environ)
    if configuration:
        return [f"spec.sandbox.provider: {problem}" for problem in configuration]
    try:
        provider = create_provider(name)
    except ConfigurationError as exc:
        return [f"spec.sandbox.provider: {exc}"]
    except Exception as exc:  # a third-party provider's constructor: the run would fail the same way
        return [f"spec.sandbox.provider: sandbox provider [{name}] cannot be created: {type(exc).__name__}: {exc}"]
    try:
        return _capability_problems(name, provider.capabilities(), settings, snapshot_every, inject_loss_after)
    finally:
        await provider.aclose()


def _capability_problems(
    name: str, caps: ProviderCapabilities, settings: SandboxSettings, snapshot_every: int, inject_loss_after: int | None
) -> list[str]:
    """What the session would refuse (sandboxes/requirements.py), named by the spec field that asks for it."""
    problems = []
    for missing in unmet(caps, inject_loss_after=inject_loss_after, snapshot_every=snapshot_every,
                         lease_seconds=settings.lease_seconds):
        if missing.option == "inject_loss_after":
            problems.append(
                f"spec.injectLossAfterNCalls: sandbox provider [{name}] does not support loss_injection "
                f"(a testing aid of the local and kubernetes providers); remove it or use one of those"
            )
        elif missing.option == "snapshot_every":
            problems.append(f"spec.snapshotEveryNCalls: sandbox provider [{name}] does not support snapshot")
        elif missing.option == "lease_seconds":
            problems.append(
                f"spec.sandbox.leaseSeconds: {settings.lease_seconds} s is more than sandbox provider [{name}] allows "
                f"({missing.maximum} s)"
            )
    return problems


__all__ = ["sandbox_problems"]
