"""The web view's routes (Starlette): pages, the JSON the run page reads, live streams, and actions.

Pages: ``/runs`` (filters in the query: ``status`` repeatable, ``workflow``, ``label``, ``page``), ``/run?id=``,
``/sandboxes``. Run references travel in the query string (``?id=``), never in the path, so any run id
or Workflow name works as it is. Live updates are server-sent events: ``/api/runs/stream`` (the rows of
the list being shown) and ``/api/timeline/stream`` (a run's timeline items as they change). Actions are
``POST /action/<name>`` with the page's CSRF token; without ``confirmed=yes`` they answer with a page
saying exactly what the action will do and asking to confirm.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from durable_sandbox.cli.errors import CliError
from durable_sandbox.engine import RunNotFound, RunStatus, SignalConflict
from durable_sandbox.ui.live import Timelines
from durable_sandbox.ui.redact import redact
from durable_sandbox.ui.render import BOUND, bounded_json, bounded_text, environment
from durable_sandbox.ui.security import Guard, GuardMiddleware
from durable_sandbox.ui.source import RunQuery, RunSource, label_filters

__all__ = ["create_app"]

KEEPALIVE_SECONDS = 15.0
TROUBLE_SECONDS = 5.0  # after a failed look at the store, a live page waits this long before the next
log = logging.getLogger("durable_sandbox.ui")
PER_PAGE = (20, 50, 100, 200)
STATUSES = [s.value for s in RunStatus]
T = TypeVar("T")


@dataclass
class View:
    source: RunSource
    guard: Guard
    timelines: Timelines

    def __post_init__(self) -> None:
        self.env = environment()
        self.flashes: OrderedDict[str, tuple[str, bool]] = OrderedDict()

    def page(self, name: str, request: Request, status_code: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(self.render(name, request, **context), status_code=status_code)

    def render(self, name: str, request: Request, **context: Any) -> str:
        base = {
            "mode": self.source.mode, "where": self.source.where(), "allow_actions": self.guard.allow_actions,
            "csrf": self.guard.csrf, "path": request.url.path, "now": time.time(),
        }  # fmt: skip
        return self.env.get_template(name).render(**base, **context)

    def flash(self, text: str, ok: bool = True) -> str:
        key = secrets.token_urlsafe(8)
        self.flashes[key] = (text, ok)
        while len(self.flashes) > 200:
            self.flashes.popitem(last=False)
        return key


def query_of(request: Request) -> RunQuery:
    params = request.query_params
    statuses = tuple(s for s in params.getlist("status") if s in STATUSES)
    try:
        page = max(1, int(params.get("page", "1")))
        per_page = int(params.get("per", "50"))
    except ValueError:
        page, per_page = 1, 50
    return RunQuery(
        statuses=statuses, workflow=(params.get("workflow") or "").strip() or None,
        labels=label_filters(params.get("label") or ""), page=page, per_page=per_page if per_page in PER_PAGE else 50,
    )  # fmt: skip


def _ref(request: Request) -> str:
    ref = request.query_params.get("id")
    if not ref:
        raise HTTPException(400, "missing ?id=<run>")
    return ref


async def _found(call: Awaitable[T]) -> T:
    """``call``'s answer; a run that does not exist is a 404 page that says so."""
    try:
        return await call
    except (RunNotFound, LookupError, CliError) as exc:  # CliError: no such Workflow in the namespace
        raise HTTPException(404, str(exc)) from None


def create_app(source: RunSource, guard: Guard) -> Starlette:
    view = View(source, guard, Timelines(source))

    # ------------------------------------------------------------------ pages

    async def runs_page(request: Request) -> Response:
        query = query_of(request)
        page = await source.list_runs(query)
        kept = [(k, v) for k, v in request.query_params.multi_items() if k != "page"]

        def page_link(n: int) -> str:
            return "/runs?" + urlencode([*kept, ("page", str(n))])

        return view.page("runs.html", request, page=page, query=query, statuses=STATUSES, per_page=PER_PAGE,
                         label_text=request.query_params.get("label", ""), qs=request.url.query, page_link=page_link)

    async def run_page(request: Request) -> Response:
        ref = _ref(request)
        # The live timeline first: the header is built from the journal it read (a long run's is read once).
        live = await _found(view.timelines.get(ref))
        detail = await _found(source.detail(ref, live.journal))
        flash = view.flashes.get(request.query_params.get("flash", ""))
        return view.page("run.html", request, d=detail, flash=flash)

    async def sandboxes_page(request: Request) -> Response:
        rows, note = await source.sandboxes()
        show_all = request.query_params.get("all") == "1"
        shown = rows if show_all else [r for r in rows if r.kind == "resource" or r.state not in ("finalized", "none")]
        return view.page("sandboxes.html", request, rows=shown, hidden=len(rows) - len(shown), note=note,
                         show_all=show_all)  # fmt: skip

    # ------------------------------------------------------------------ the runs list, live

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

    # ------------------------------------------------------------------ a run's timeline

    async def timeline(request: Request) -> Response:
        ref = _ref(request)
        live = await _found(view.timelines.get(ref))
        await view.timelines.refresh(live)
        head = await _found(source.head(ref))
        tl = live.timeline
        progress = request.query_params.get("progress") == "1"
        return JSONResponse({
            "gen": live.gen, "v": len(live.log), "base": tl.base, "lanes": [lane.to_json() for lane in tl.lanes],
            "items": [i.to_json(tl.base) for i in tl.sorted_items(progress=progress)], "status": head.status,
            "terminal": head.terminal, "live": head.live,
        })  # fmt: skip

    async def timeline_stream(request: Request) -> Response:
        ref = _ref(request)
        live = await _found(view.timelines.get(ref))
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
            # The first look always sends the header: the page's own may be older than this stream (the run moved
            # between rendering the page and opening the stream, or the stream reconnected).
            version: Any = object()
            quiet = 0.0

            async def look() -> dict[str, Any]:
                nonlocal position, lanes, version
                await view.timelines.refresh(live)
                changed = live.log[position:]
                position = len(live.log)
                out: dict[str, Any] = {}
                items = [i.to_json(live.timeline.base) for i in _unique(changed) if progress or i.kind != "progress"]
                if items:
                    out["items"] = items
                if len(live.timeline.lanes) != lanes:
                    lanes = len(live.timeline.lanes)
                    out["lanes"] = [lane.to_json() for lane in live.timeline.lanes]
                now_version = await _found(source.version(ref))
                if now_version != version:
                    fresh = await _found(source.detail(ref, live.journal))
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

    async def record(request: Request) -> Response:
        """The records behind one timeline item: every journal row of its operation (each attempt), or
        the event; values masked (:mod:`ui.redact`) and bounded."""
        ref = _ref(request)
        key = request.query_params.get("key", "")
        live = await _found(view.timelines.get(ref))
        item = live.timeline.items.get(key)
        if item is None:
            raise HTTPException(404, f"no item {key!r} in the timeline of {ref}")
        out: dict[str, Any] = {"key": key, "kind": item.kind, "label": item.label, "outcome": item.outcome,
                               "note": item.note, "op": item.op, "attempt": item.attempt}  # fmt: skip
        if item.op is not None:
            rows = live.rows.get(item.op, [])
            if item.outcome != "replayed":
                # This segment's rows only: each attempt of a step is an item of its own.
                rows = [r for r in rows if (r.attempt, r.epoch) == (item.attempt, item.epoch)] or rows
            out["rows"] = [_row_json(r) for r in rows]
            if item.of is not None:
                out["replayOf"] = item.of
        elif key in live.events:
            ev = live.events[key]
            out["event"] = bounded_json(ev.to_json())
        elif key in live.object_events:
            out["event"] = bounded_json(live.object_events[key])
        return JSONResponse(out)

    # ------------------------------------------------------------------ actions

    async def action(request: Request) -> Response:
        name = request.path_params["name"]
        form = await request.form()
        if not guard.allow_actions:
            return view.page("message.html", request, 403, title="Read-only",
                             text="This web view was started read-only; start it with `dsb ui --allow-actions` "
                                  "to signal, cancel, suspend or resume runs from it.")  # fmt: skip
        if not guard.csrf_ok(_field(form, "csrf")):
            return view.page("message.html", request, 403, title="Refused",
                             text="The form did not carry this server's CSRF token (it was not made by these pages, "
                                  "or the server was restarted since): reload the run's page and try again.")
        ref = _field(form, "id") or ""
        live = await _found(view.timelines.get(ref))
        detail = await _found(source.detail(ref, live.journal))
        spec = next((a for a in detail.actions if a.name == name), None)
        if spec is None:
            raise HTTPException(404, f"no action {name!r}")
        back = f"/run?id={_q(ref)}"
        if not spec.enabled:
            return view.page("message.html", request, 409, title=f"{spec.label}: not possible",
                             text=f"{spec.label} is not possible for run {ref}: {spec.why_not}.", back=back)
        callback = _field(form, "callback") or ""
        value: Any = None
        value_text = _field(form, "value") or ""
        if name == "signal":
            if not callback:
                return view.page("message.html", request, 400, title="Signal: no callback",
                                 text="Choose the callback to signal.", back=back)
            try:
                value = json.loads(value_text) if value_text.strip() else None
            except json.JSONDecodeError as exc:
                return view.page("message.html", request, 400, title="Signal: not JSON",
                                 text=f"The value is not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}). "
                                      f'A string needs quotes: "yes".', back=back)
        resume = _field(form, "resume") == "yes"
        reason = (_field(form, "reason") or "").strip() or "cancelled from the web view"
        if _field(form, "confirmed") != "yes":
            return view.page("confirm.html", request, d=detail, action=spec, callback=callback, value=value,
                             value_text=value_text, resume=resume, reason=reason)  # fmt: skip
        perform: dict[str, Callable[[], Awaitable[str]]] = {
            "signal": lambda: source.signal(ref, callback, value, resume=resume),
            "cancel": lambda: source.cancel(ref, reason),
            "suspend": lambda: source.suspend(ref),
            "resume": lambda: source.resume(ref),
        }
        try:
            text = await perform[name]()
            ok = True
        except (ValueError, SignalConflict) as exc:
            text, ok = str(exc), False
        return RedirectResponse(f"{back}&flash={view.flash(text, ok)}", status_code=303)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def root(request: Request) -> Response:
        return RedirectResponse("/runs", status_code=303)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
        return view.page("message.html", request, exc.status_code, title=f"{exc.status_code}", text=str(exc.detail))

    static = resources.files("durable_sandbox.ui") / "static"
    routes = [
        Route("/", root),
        Route("/healthz", healthz),
        Route("/runs", runs_page),
        Route("/run", run_page),
        Route("/sandboxes", sandboxes_page),
        Route("/api/runs/stream", runs_stream),
        Route("/api/timeline", timeline),
        Route("/api/timeline/stream", timeline_stream),
        Route("/api/record", record),
        Route("/action/{name}", action, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(static)), name="static"),
    ]
    middleware = [Middleware(GuardMiddleware, guard=guard), Middleware(GZipMiddleware, minimum_size=2048)]
    return Starlette(routes=routes, middleware=middleware, exception_handlers={HTTPException: http_error})


def _row_json(row: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"seq": row.seq, "status": row.status, "attempt": row.attempt, "ts": row.ts,
                           "kind": row.kind, "name": row.name, "inputDigest": row.input_digest}  # fmt: skip
    if row.meta:
        out["meta"] = bounded_json(row.meta)
    if row.error is not None:
        out["error"] = redact(row.error.to_json())
    if row.status == "completed" and row.result is not None:
        result = row.result
        if row.kind == "sandbox.call" and isinstance(result, dict):
            out["exitCode"] = result.get("exitCode")
            for stream in ("stdout", "stderr"):
                out[stream] = bounded_text(result.get(stream) or "", BOUND)
        else:
            out["result"] = bounded_json(result)
    return out


def _unique(items: list[Any]) -> list[Any]:
    seen: dict[str, Any] = {}
    for item in items:
        seen[item.key] = item
    return list(seen.values())


def _field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def _q(text: str) -> str:
    return quote(text, safe="")


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n"


def _stream(body: AsyncIterator[str]) -> StreamingResponse:
    async def guarded() -> AsyncIterator[str]:
        with contextlib.suppress(asyncio.CancelledError):
            async for chunk in body:
                yield chunk

    return StreamingResponse(guarded(), media_type="text/event-stream",
                             headers={"cache-control": "no-store", "x-accel-buffering": "no"})
