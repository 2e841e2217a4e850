"""The web view's live updates, as server-sent events: the rows of the runs list being shown
(``/api/runs/stream``) and a run's timeline items and header as they change (``/api/timeline/stream``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from durable_sandbox.ui.view import View, found, query_of, ref_of

__all__ = ["stream_routes"]

KEEPALIVE_SECONDS = 15.0
TROUBLE_SECONDS = 5.0  # after a failed look at the store, a live page waits this long before the next
log = logging.getLogger("durable_sandbox.ui")


def stream_routes(view: View) -> list[Route]:
    return [Route("/api/runs/stream", _runs_stream(view)), Route("/api/timeline/stream", _timeline_stream(view))]


def _runs_stream(view: View) -> Callable[[Request], Awaitable[Response]]:
    source = view.source

    async def runs_stream(request: Request) -> Response:
        query = query_of(request)

        async def rows() -> AsyncIterator[str]:
            last = None
            quiet = 0.0
            while not await request.is_disconnected():
                try:
                    page = await source.list_runs(query)
                except Exception as exc:  # the store out of reach: say so, go on
                    log.warning("live update of the runs list failed: %s: %s", type(exc).__name__, exc)
                    yield _sse("trouble", {"why": f"{type(exc).__name__}: {exc}"[:500]})
                    await asyncio.sleep(TROUBLE_SECONDS)
                    continue
                html = view.render("_runs_rows.html", request, page=page)
                if html != last:
                    last = html
                    quiet = 0.0
                    yield _sse("rows", {"html": html, "total": page.total, "pages": page.pages})
                else:
                    quiet += source.poll_seconds * 4
                    if quiet >= KEEPALIVE_SECONDS:
                        quiet = 0.0
                        yield ": keep-alive\n\n"
                await asyncio.sleep(source.poll_seconds * 4)

        return _stream(rows())

    return runs_stream


def _timeline_stream(view: View) -> Callable[[Request], Awaitable[Response]]:
    source = view.source

    async def timeline_stream(request: Request) -> Response:
        ref = ref_of(request)
        live = await found(view.timelines.get(ref))
        gen = request.query_params.get("gen", "")
        try:
            position = int(request.query_params.get("v", "0"))
        except ValueError:
            position = 0
        progress = request.query_params.get("progress") == "1"

        async def deltas() -> AsyncIterator[str]:
            nonlocal position
            if live.gen != gen:
                yield _sse("reset", {"why": "the timeline was rebuilt"})
                return
            lanes = len(live.timeline.lanes)
            omitted = live.timeline.omitted
            # The first look always sends the header: the page's own may be older than this stream (the run moved
            # between rendering the page and opening the stream, or the stream reconnected).
            version: Any = object()
            quiet = 0.0

            async def look() -> dict[str, Any]:
                nonlocal position, lanes, version, omitted
                await view.timelines.refresh(live)
                changed = live.log[position:]
                position = len(live.log)
                out: dict[str, Any] = {}
                items = [i.to_json(live.timeline.base) for i in _unique(changed) if progress or i.kind != "progress"]
                if items:
                    out["items"] = items
                if live.timeline.omitted != omitted:  # a Sandbox's long session: older items dropped meanwhile
                    out["omitted"] = omitted = live.timeline.omitted
                if len(live.timeline.lanes) != lanes:
                    lanes = len(live.timeline.lanes)
                    out["lanes"] = [lane.to_json() for lane in live.timeline.lanes]
                now_version = await found(source.version(ref))
                if now_version != version:
                    fresh = await found(source.detail(ref, live.journal))
                    version = now_version
                    out["header"] = view.render("_run_header.html", request, d=fresh)
                    out["status"], out["terminal"], out["live"] = fresh.state.status, fresh.terminal, fresh.live
                return out

            while not await request.is_disconnected():
                try:
                    out = await look()
                except HTTPException as exc:  # the run is gone: deleted (in a cluster, with its Workflow)
                    yield _sse("gone", {"why": str(exc.detail)})
                    return
                except Exception as exc:  # the store out of reach (an API server restarting): say so, go on
                    log.warning("live update of %s failed: %s: %s", ref, type(exc).__name__, exc)
                    yield _sse("trouble", {"why": f"{type(exc).__name__}: {exc}"[:500]})
                    await asyncio.sleep(TROUBLE_SECONDS)
                    continue
                if out:
                    out["v"] = position
                    quiet = 0.0
                    yield _sse("delta", out)
                else:
                    quiet += source.poll_seconds
                    if quiet >= KEEPALIVE_SECONDS:
                        quiet = 0.0
                        yield ": keep-alive\n\n"
                await asyncio.sleep(source.poll_seconds)

        return _stream(deltas())

    return timeline_stream


def _unique(items: list[Any]) -> list[Any]:
    seen: dict[str, Any] = {}
    for item in items:
        seen[item.key] = item
    return list(seen.values())


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n"


def _stream(body: AsyncIterator[str]) -> StreamingResponse:
    async def guarded() -> AsyncIterator[str]:
        with contextlib.suppress(asyncio.CancelledError):
            async for chunk in body:
                yield chunk

    return StreamingResponse(guarded(), media_type="text/event-stream",
                             headers={"cache-control": "no-store", "x-accel-buffering": "no"})
