"""Which sandbox provider a Workflow's run or a Sandbox gets: the one place that decides it in the cluster.

In order: the provider the operator's own record pinned (a run's stored input once the run was created; a
Sandbox's record once it was reconciled), so a later ``--default-provider`` never moves what is running, and
its cleanup, leftovers and orphan sweep go to the provider that made its sandboxes; else the one the spec
names; else this operator's default (``dsb operator --default-provider``, the chart's ``defaultProvider``).
Never status or labels: anyone granted ``*/status`` writes those.

Then the policy: the local provider only with ``--allow-local-provider`` (named, defaulted or pinned alike),
and a default that this operator cannot build (``configuration_problems``: the chart turned the kubernetes
provider off, E2B has no key) is refused saying what to set, before any run is created.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["DEFAULT_UNAVAILABLE", "LOCAL", "LOCAL_NOT_ALLOWED", "PINNED", "ProviderChoice", "choose_provider",
           "pinned_by_run", "refusal", "sandbox_choice"]

LOCAL = "local"
LOCAL_NOT_ALLOWED = (
    "the local provider is not allowed by this operator (it is no isolation boundary); start "
    "the operator with --allow-local-provider for development, or use another provider"
)
DEFAULT_UNAVAILABLE = "DefaultProviderUnavailable"  # the refusal's reason (the condition's and the Event's)
PINNED = "provider"  # the key of a Sandbox's record (kube/journal/sandbox_records.py) that pins its provider

Source = Literal["pinned", "spec", "default"]


@dataclass(frozen=True)
class ProviderChoice:
    name: str
    source: Source  # where it came from: the operator's record, the spec, the operator's default


def choose_provider(*, pinned: str | None, named: str | None, default: str) -> ProviderChoice:
    """The provider of a run or a Sandbox: pinned, else named, else the default."""
    if pinned:
        return ProviderChoice(pinned, "pinned")
    if named:
        return ProviderChoice(named, "spec")
    return ProviderChoice(default, "default")


def pinned_by_run(run_input: Any) -> str | None:
    """The provider a sandbox-agent run's stored input pins (``sandbox.provider``); None for any other input (an
    entrypoint's code names its own providers, and each sandbox session pins its own when it provisions)."""
    if isinstance(run_input, Mapping) and isinstance(run_input.get("toolCalls"), list):
        sandbox = run_input.get("sandbox")
        provider = sandbox.get("provider") if isinstance(sandbox, Mapping) else None
        return provider if isinstance(provider, str) and provider else None
    return None


def sandbox_choice(record: Mapping[str, Any], named: str | None, default: str) -> ProviderChoice:
    """A Sandbox resource's provider: its record's pin, else its spec's, else the default."""
    pinned = record.get(PINNED)
    return choose_provider(pinned=pinned if isinstance(pinned, str) else None, named=named, default=default)


def refusal(choice: ProviderChoice, *, where: str, allow_local: bool,
            environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(reason, message) when this operator may not run ``choice``; None when it may. ``where`` names the spec
    field (``spec.sandbox.provider``, ``spec.provider``)."""
    if choice.name == LOCAL and not allow_local:
        defaulted = (" (no provider is named, and local is this operator's --default-provider: name one, or start "
                     "the operator with another --default-provider)") if choice.source == "default" else ""
        return "ProviderNotAllowed", f"{where}: {LOCAL_NOT_ALLOWED}{defaulted}"
    if choice.source != "default":
        return None  # a named provider's configuration is checked where it is built (as before)
    problems = _configuration_problems(choice.name, os.environ if environ is None else environ)
    if not problems:
        return None
    return DEFAULT_UNAVAILABLE, (
        f"{where}: no provider is named, and this operator's default provider {choice.name!r} is not available "
        f"here ({'; '.join(problems)}); name a provider in {where}, or give the operator a --default-provider "
        f"it can use (the chart's defaultProvider)"
    )


def _configuration_problems(name: str, environ: Mapping[str, str]) -> list[str]:
    from durable_sandbox.providers.registry import available_providers

    installed = available_providers()  # an entry-point scan: once
    cls = installed.get(name)
    if cls is None:
        return [f"no provider {name!r} is installed (available: {', '.join(sorted(installed))})"]
    return list(cls.configuration_problems(environ))
