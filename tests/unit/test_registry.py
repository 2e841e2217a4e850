"""Provider registry: built-ins, entry-point plugins, and the checks that refuse bad registrations."""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from durable_sandbox.providers import registry
from durable_sandbox.providers.contract import (
    Capability,
    ConfigurationError,
    ProviderCapabilities,
    SandboxProvider,
)
from durable_sandbox.providers.e2b import E2BProvider
from durable_sandbox.providers.kubernetes import KubernetesProvider


class MemoryProvider(SandboxProvider):
    name = "memory"

    def __init__(self, **options: Any) -> None:
        self.options = options


class MisnamedProvider(SandboxProvider):
    name = "something-else"


class FutureProvider(SandboxProvider):
    name = "future"
    contract_version = 2


class BoastingProvider(SandboxProvider):
    name = "boasting"

    def capabilities(self) -> ProviderCapabilities:
        return ProviderCapabilities(supported=frozenset({Capability.RESTORE}))


@dataclass
class StubEntryPoint:
    name: str
    value: str
    loader: Callable[[], Any]

    def load(self) -> Any:
        return self.loader()


def _broken() -> Any:
    raise ImportError("No module named 'dsb_broken'")


def plugins(monkeypatch: pytest.MonkeyPatch, *entries: StubEntryPoint) -> None:
    monkeypatch.setattr(registry, "_entry_points", lambda: list(entries))


def test_builtins_are_available_without_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins(monkeypatch)
    found = registry.available_providers()
    assert found["e2b"] is E2BProvider
    assert found["local"].name == "local"
    assert found["kubernetes"] is KubernetesProvider


def test_pyproject_registers_the_builtins_as_entry_points() -> None:
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
    assert names["e2b"] == "durable_sandbox.providers.e2b:E2BProvider"
    assert names["local"] == "durable_sandbox.providers.local:LocalProvider"
    assert names["kubernetes"] == "durable_sandbox.providers.kubernetes:KubernetesProvider"


def test_unknown_name_lists_the_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins(monkeypatch, StubEntryPoint("memory", "x:MemoryProvider", lambda: MemoryProvider))
    with pytest.raises(ConfigurationError, match=r"Unknown sandbox provider \[nope\]; known providers: agent-sandbox, e2b, kubernetes, local, memory"):
        registry.create_provider("nope")


def test_third_party_provider_is_created_with_options(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins(monkeypatch, StubEntryPoint("memory", "x:MemoryProvider", lambda: MemoryProvider))
    provider = registry.create_provider("memory", size=3)
    assert isinstance(provider, MemoryProvider) and provider.options == {"size": 3}


def test_name_must_match_the_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins(monkeypatch, StubEntryPoint("memory", "x:MisnamedProvider", lambda: MisnamedProvider))
    assert "memory" not in registry.available_providers()
    with pytest.raises(ConfigurationError, match=r"\[memory\] .* refused: its class says name = 'something-else'"):
        registry.create_provider("memory")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (StubEntryPoint("notaclass", "x:f", lambda: len), "is not a SandboxProvider subclass"),
        (StubEntryPoint("future", "x:FutureProvider", lambda: FutureProvider), "speaks contract v2"),
        (StubEntryPoint("broken", "dsb_broken:P", _broken), "failed to load: ImportError: No module named 'dsb_broken'"),
    ],
)
def test_bad_plugins_are_refused_without_hiding_the_others(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture,
                                                          entry: StubEntryPoint, message: str) -> None:
    plugins(monkeypatch, entry, StubEntryPoint("memory", "x:MemoryProvider", lambda: MemoryProvider))
    caplog.set_level(logging.WARNING, logger=registry.__name__)
    found = registry.available_providers()
    assert entry.name not in found and "memory" in found and "e2b" in found
    assert any(message in r.getMessage() for r in caplog.records)
    with pytest.raises(ConfigurationError, match=message):
        registry.create_provider(entry.name)


def test_plugins_cannot_shadow_builtins(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    class FakeE2B(SandboxProvider):
        name = "e2b"

    plugins(monkeypatch, StubEntryPoint("e2b", "evil:FakeE2B", lambda: FakeE2B))
    caplog.set_level(logging.WARNING, logger=registry.__name__)
    assert registry.available_providers()["e2b"] is E2BProvider
    assert "would shadow the built-in provider [e2b]" in caplog.text


def test_duplicate_registrations_keep_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    class Other(SandboxProvider):
        name = "memory"

    plugins(monkeypatch, StubEntryPoint("memory", "a:MemoryProvider", lambda: MemoryProvider),
            StubEntryPoint("memory", "b:Other", lambda: Other))
    assert registry.available_providers()["memory"] is MemoryProvider


def test_inconsistent_capabilities_are_refused_at_creation(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins(monkeypatch, StubEntryPoint("boasting", "x:BoastingProvider", lambda: BoastingProvider))
    with pytest.raises(ConfigurationError, match="declares inconsistent capabilities: restore requires snapshot"):
        registry.create_provider("boasting")


def test_e2b_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins(monkeypatch)
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="needs an API key"):
        registry.create_provider("e2b")
    provider = registry.create_provider("e2b", api_key="k", api_url="http://127.0.0.1:9")
    assert isinstance(provider, E2BProvider) and provider.api_url == "http://127.0.0.1:9"


def test_the_entry_points_are_scanned_once_and_a_refusal_is_warned_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    scans = []

    def entries() -> list[StubEntryPoint]:
        scans.append(1)
        return [StubEntryPoint("dsb-broken", "dsb_broken:Provider", _broken)]

    monkeypatch.setattr(registry, "_entry_points", entries)
    with caplog.at_level("WARNING", logger=registry.__name__):
        for _ in range(3):
            assert "local" in registry.available_providers()
        with pytest.raises(ConfigurationError, match="dsb-broken"):
            registry.create_provider("dsb-broken")
    assert len(scans) == 1, "one scan per process, not one per lookup"
    assert [r.getMessage() for r in caplog.records].count(
        "sandbox provider [dsb-broken] from entry point dsb-broken = dsb_broken:Provider failed to load: "
        "ImportError: No module named 'dsb_broken'") == 1
    # What callers get is theirs to change: the cache is not.
    registry.available_providers().pop("local")
    assert "local" in registry.available_providers()
    # Another search path (a changed sys.path) scans again.
    monkeypatch.setattr(registry.sys, "path", [*registry.sys.path, "/nonexistent-for-the-test"])
    registry.available_providers()
    assert len(scans) == 2
