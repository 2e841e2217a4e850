"""The call API's connections send an answer at once: TCP_NODELAY on each connection start_session_api accepts.

Without it (the listening socket made with proto 0, so asyncio did not set TCP_NODELAY on the connections), uvicorn's
answer, written as headers then body, waited for the client's delayed ACK: ~40 ms of every call on loopback, 58% of
a no-op call's time (docs/benchmarks.md, "One call's path, phase by phase")."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx

from durable_sandbox.sessions.http import start_session_api
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import local_gate, service


async def test_every_connection_the_call_api_accepts_has_tcp_nodelay(tmp_path: Path) -> None:
    svc = service(SqliteStore(tmp_path / "runs.db"), await local_gate(tmp_path / "home"))
    api = await start_session_api(svc, host="127.0.0.1", port=0)
    try:
        async with httpx.AsyncClient() as client:  # kept alive: its connection is still open below
            for _ in range(2):
                assert (await client.get(f"http://127.0.0.1:{api.port}/healthz")).status_code == 200
            connections = list(api.server.server_state.connections)
            assert connections, "the call API holds no open connection of the client"
            for connection in connections:
                sock = connection.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), (
                    "a connection of the call API has Nagle's algorithm on: its answers wait for the client's ACK")
    finally:
        await api.stop()
