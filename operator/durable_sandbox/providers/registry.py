"""Which providers exist: the built-ins plus third-party ones from the ``durable_sandbox.providers``
entry-point group.

A provider is only accepted when it is a :class:`SandboxProvider` subclass whose ``name`` equals the name it
is registered under (otherwise a journal could record one name and a resume load another provider) and
whose contract version this package speaks. Built-ins cannot be shadowed by a plugin.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from durable_sandbox.providers.contract import CONTRACT_VERSION, ConfigurationError, SandboxProvider

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "durable_sandbox.providers"
BUILTIN_PROVIDERS: Final[Mapping[str, str]] = {
    "local": "durable_sandbox.providers.local:LocalProvider",
    "e2b": "durable_sandbox.providers.e2b:E2BProvider",
    "kubernetes": "durable_sandbox.providers.kubernetes:KubernetesProvider",
    "agent-sandbox": "durable_sandbox.providers.agent_sandbox:AgentSandboxProvider",
}


def _entry_points() -> Iterable[importlib.metadata.EntryPoint]:
    return importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)


def _import(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


def _validate(name: str, obj: Any, origin: str) -> type[SandboxProvider]:
    if not (isinstance(obj, type) and issubclass(obj, SandboxProvider)):
        raise ConfigurationError(f"sandbox provider [{name}] from {origin} is not a SandboxProvider subclass")
    if obj.name != name:
        raise ConfigurationError(
            f"sandbox provider [{name}] from {origin} refused: its class says name = {obj.name!r}; "
            "a provider must be registered under its own name"
        )
    if obj.contract_version != CONTRACT_VERSION:
        raise ConfigurationError(
            f"sandbox provider [{name}] from {origin} speaks contract v{obj.contract_version}; this package speaks v{CONTRACT_VERSION}"
        )
    return obj


_Discovered = tuple[dict[str, type[SandboxProvider]], dict[str, str]]
# One scan per process: reading every installed distribution's entry points costs about 10 ms, and the
# operator asks at every admission (measured: 1.0 s of a 6.6 s throughput run). Keyed by where the scan looks
# (the entry-point source, which tests replace, and sys.path), so a changed search path scans again; a plugin
# installed into a running process's environment is seen after a restart, as with any Python import.
_cache: dict[tuple[Callable[[], Iterable[importlib.metadata.EntryPoint]], tuple[str, ...]], _Discovered] = {}


def _discover() -> _Discovered:
    """All providers that load, and the reason each one that does not was refused (scanned once; see _cache)."""
    key = (_entry_points, tuple(sys.path))
    if key not in _cache:
        _cache.clear()
        _cache[key] = _scan()
    found, refused = _cache[key]
    return dict(found), dict(refused)


def _scan() -> _Discovered:
    found: dict[str, type[SandboxProvider]] = {}
    refused: dict[str, str] = {}
    for name, target in BUILTIN_PROVIDERS.items():
        try:
            found[name] = _validate(name, _import(target), f"built-in {target}")
        except (ImportError, AttributeError, ConfigurationError) as exc:
            refused[name] = str(exc)
    for ep in _entry_points():
        origin = f"entry point {ep.name} = {ep.value}"
        if ep.name in BUILTIN_PROVIDERS:
            if ep.value != BUILTIN_PROVIDERS[ep.name]:  # our own distribution registers the built-ins too
                log.warning("ignoring %s: it would shadow the built-in provider [%s]", origin, ep.name)
            continue
        if ep.name in found or ep.name in refused:
            log.warning("ignoring %s: provider [%s] is registered more than once", origin, ep.name)
            continue
        try:
            found[ep.name] = _validate(ep.name, ep.load(), origin)
        except ConfigurationError as exc:
            refused[ep.name] = str(exc)
        except Exception as exc:  # a broken plugin must not take every other provider down with it
            refused[ep.name] = f"sandbox provider [{ep.name}] from {origin} failed to load: {type(exc).__name__}: {exc}"
    for reason in refused.values():
        log.warning("%s", reason)
    return found, refused


def available_providers() -> dict[str, type[SandboxProvider]]:
    """Provider classes by name (the ones that load and pass the registration checks)."""
    return _discover()[0]


def create_provider(name: str, **options: Any) -> SandboxProvider:
    """Instantiate the provider registered as ``name`` with ``options`` passed to its constructor."""
    found, refused = _discover()
    if name in refused:
        raise ConfigurationError(refused[name])
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        raise ConfigurationError(f"Unknown sandbox provider [{name}]; known providers: {known}")
    provider = found[name](**options)
    problems = provider.capabilities().consistency_problems()
    if problems:
        raise ConfigurationError(f"sandbox provider [{name}] declares inconsistent capabilities: {'; '.join(problems)}")
    return provider
