"""pytest fixture for the fake E2B server. Import it from a conftest: ``from tests.fakes.fixtures import fake_e2b``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.fakes.e2b_server import FakeE2BServer
from tests.fakes.e2b_state import FakeState

__all__ = ["FakeState", "fake_e2b", "fake_e2b_in_thread"]


@pytest.fixture
async def fake_e2b(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FakeState]:
    """A running fake E2B (API + envd on loopback).

    The yielded object has ``api_url``, ``sandbox_url``, ``api_key``, the fault switches (``kill``, ``expire``,
    ``advance``, ``fail_create``, ``fail_requests``, ``stall_requests``, ``drop_connection_after_snapshot``, ``corrupt_next_stream``,
    ``end_stream_with_error``), the views ``live_sandboxes()``, ``snapshots()`` and ``rejections()``, and the
    ``requests`` log. At teardown the fixture fails the test if any request was rejected as malformed (so
    drift in the adapter cannot hide behind an error handler), unless the test set ``rejections_expected``.
    """
    state = FakeState(root=tmp_path_factory.mktemp("fake-e2b"))
    async with FakeE2BServer(state):
        yield state
    rejected = [r for r in state.rejections() if not state.rejections_expected]
    if rejected:
        pytest.fail(
            "the fake E2B server rejected malformed request(s): "
            + "; ".join(f"{r.method} {r.path}: {r.rejection}" for r in rejected)
        )


@contextlib.contextmanager
def fake_e2b_in_thread(root: Path, host: str = "127.0.0.1") -> Iterator[tuple[FakeState, asyncio.AbstractEventLoop]]:
    """The fake E2B server on an event loop thread of its own, for tests that block (on kubectl, on processes).
    Yields its state and that loop: mutate the state from the loop (``run_coroutine_threadsafe``) while
    requests may be in flight."""
    state = FakeState(root=root)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-e2b", daemon=True)
    thread.start()
    server = FakeE2BServer(state, host=host)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    try:
        yield state, loop
    finally:
        with contextlib.suppress(TimeoutError):  # a command still streaming (a test that failed early)
            asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
