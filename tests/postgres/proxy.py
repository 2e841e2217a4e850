"""A TCP proxy on loopback between a client and the PostgreSQL test server that cuts a connection exactly where
a test says: the loss injection for "the answer was lost" and "the request never arrived", which a restart
can only hit by chance."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Literal

Cut = Literal["after-answer", "before-request"]


class CuttingProxy:
    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self.cuts = 0
        self._armed: Cut | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def cut_next(self, how: Cut) -> None:
        """Cut the connection that sends the next request: ``after-answer`` forwards the request and drops
        the server's answer; ``before-request`` drops the request. Either way both sides are closed."""
        self._armed = how

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            self._tasks.discard(task)
            return
        cut = asyncio.Event()
        answer_to_drop = asyncio.Event()

        async def client_to_server() -> None:
            while data := await client_r.read(65536):
                if self._armed == "before-request":
                    self._armed = None
                    cut.set()
                    return
                if self._armed == "after-answer":
                    self._armed = None
                    answer_to_drop.set()
                server_w.write(data)
                await server_w.drain()

        async def server_to_client() -> None:
            while data := await server_r.read(65536):
                if answer_to_drop.is_set():
                    cut.set()
                    return
                client_w.write(data)
                await client_w.drain()

        pumps = [asyncio.create_task(client_to_server()), asyncio.create_task(server_to_client())]
        ended = asyncio.create_task(cut.wait())
        try:
            await asyncio.wait([*pumps, ended], return_when=asyncio.FIRST_COMPLETED)
            if cut.is_set():
                self.cuts += 1
        finally:
            for t in (*pumps, ended):
                t.cancel()
            for writer in (client_w, server_w):
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
            self._tasks.discard(task)
