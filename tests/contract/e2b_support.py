"""Shared helpers for the e2b tests: a provider wired to the fake server, without real sleeping."""

from __future__ import annotations

from durable_sandbox.providers.e2b import E2BProvider, RetryPolicy
from tests.fakes.e2b_state import FakeState


class RecordingSleep:
    """Stands in for asyncio.sleep: backoff is asserted on, not waited out."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def make_provider(fake: FakeState, *, sleep: RecordingSleep | None = None, retry: RetryPolicy | None = None,
                  **overrides: object) -> E2BProvider:
    options: dict[str, object] = {
        "api_key": fake.api_key,
        "api_url": fake.api_url,
        "sandbox_url": fake.sandbox_url,
        "sleep": sleep or RecordingSleep(),
        "retry": retry,
        "environ": {},
    }
    options.update(overrides)
    return E2BProvider(**options)  # type: ignore[arg-type]
