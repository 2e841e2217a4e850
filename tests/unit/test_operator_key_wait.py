"""A starting operator waits for an API server that does not answer while it reads the journal key (a restart),
instead of exiting 1 (the soak's 'soak-op-2 exited 1': restarted while the API server restarted)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from durable_sandbox.cli.commands import operator as operator_cmd


def _flaky(failures: int, exc: Exception) -> Any:
    calls = {"n": 0}

    async def fetch() -> bytes:
        calls["n"] += 1
        if calls["n"] <= failures:
            raise exc
        return b"key"

    return fetch, calls


async def _nobody() -> list[str]:
    return []


def test_a_transient_error_is_waited_out(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(operator_cmd.time, "sleep", slept.append)
    fetch, calls = _flaky(3, aiohttp.ClientConnectionError("Connection reset by peer"))
    assert operator_cmd._read_key(fetch, _nobody, "ops/key") == (b"key", [])
    assert calls["n"] == 4 and slept == [0.5, 1.0, 2.0]


def test_any_other_error_is_raised_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(operator_cmd.time, "sleep", lambda _: pytest.fail("must not wait"))
    fetch, _ = _flaky(1, ValueError("not a key"))
    with pytest.raises(ValueError):
        operator_cmd._read_key(fetch, _nobody, "ops/key")


def test_the_wait_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    now = {"t": 0.0}
    monkeypatch.setattr(operator_cmd.time, "monotonic", lambda: now["t"])
    monkeypatch.setattr(operator_cmd.time, "sleep", lambda s: now.__setitem__("t", now["t"] + s))
    fetch, calls = _flaky(10_000, aiohttp.ClientConnectionError("refused"))
    with pytest.raises(aiohttp.ClientConnectionError):
        operator_cmd._read_key(fetch, _nobody, "ops/key")
    assert now["t"] <= operator_cmd.KEY_WAIT_S and calls["n"] > 3
