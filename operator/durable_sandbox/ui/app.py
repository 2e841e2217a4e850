"""The web view's application (Starlette): its routes, one module per job, behind its guard.

Pages (:mod:`ui.pages`): ``/runs`` (filters in the query: ``status`` repeatable, ``workflow``, ``label``,
``page``), ``/run?id=``, ``/sandboxes``. Run references travel in the query string (``?id=``), never in the path,
so any run id or Workflow name works as it is. The JSON the run page reads (:mod:`ui.records`):
``/api/timeline``, ``/api/record``. Live updates are server-sent events (:mod:`ui.streams`):
``/api/runs/stream`` (the rows of the list being shown) and ``/api/timeline/stream`` (a run's timeline items as
they change). Actions (:mod:`ui.actions`) are ``POST /action/<name>`` with the page's CSRF token; without
``confirmed=yes`` they answer with a page saying exactly what the action will do and asking to confirm.
"""

from __future__ import annotations

from importlib import resources

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from durable_sandbox.ui.actions import action_routes
from durable_sandbox.ui.live import Timelines
from durable_sandbox.ui.pages import page_routes
from durable_sandbox.ui.records import record_routes
from durable_sandbox.ui.security import Guard, GuardMiddleware
from durable_sandbox.ui.source import RunSource
from durable_sandbox.ui.streams import stream_routes
from durable_sandbox.ui.view import View

__all__ = ["create_app"]


def create_app(source: RunSource, guard: Guard) -> Starlette:
    view = View(source, guard, Timelines(source))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
        return view.page("message.html", request, exc.status_code, title=f"{exc.status_code}", text=str(exc.detail))

    static = resources.files("durable_sandbox.ui") / "static"
    routes: list[BaseRoute] = [
        *page_routes(view), *record_routes(view), *stream_routes(view), *action_routes(view),
        Mount("/static", app=StaticFiles(directory=str(static)), name="static"),
    ]
    middleware = [Middleware(GuardMiddleware, guard=guard), Middleware(GZipMiddleware, minimum_size=2048)]
    return Starlette(routes=routes, middleware=middleware, exception_handlers={HTTPException: http_error})
