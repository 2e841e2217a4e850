"""What every route of the web view shares: the :class:`View` (the run source, the guard, the live timelines,
the templates, the flash messages) and reading a request (its run reference, the runs list's filters)."""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse

from durable_sandbox.engine import RunNotFound, RunStatus
from durable_sandbox.runs.errors import CliError
from durable_sandbox.ui.live import Timelines
from durable_sandbox.ui.render import environment
from durable_sandbox.ui.security import Guard
from durable_sandbox.ui.source import RunQuery, RunSource, label_filters

__all__ = ["PER_PAGE", "STATUSES", "View", "found", "query_of", "ref_of"]

PER_PAGE = (20, 50, 100, 200)
STATUSES: Final[Sequence[str]] = [s.value for s in RunStatus]
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


def ref_of(request: Request) -> str:
    ref = request.query_params.get("id")
    if not ref:
        raise HTTPException(400, "missing ?id=<run>")
    return ref


async def found(call: Awaitable[T]) -> T:
    """``call``'s answer; a run that does not exist is a 404 page that says so."""
    try:
        return await call
    except (RunNotFound, LookupError, CliError) as exc:  # CliError: no such Workflow in the namespace
        raise HTTPException(404, str(exc)) from None
