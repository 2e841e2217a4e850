"""The web view's actions (``POST /action/<name>``: signal, cancel, suspend, resume), each only with the page's
CSRF token, only when the server was started with ``--allow-actions``, and only once confirmed: without
``confirmed=yes`` the answer is a page saying exactly what the action will do."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from durable_sandbox.engine import SignalConflict
from durable_sandbox.ui.view import View, found

__all__ = ["action_routes"]


def action_routes(view: View) -> list[Route]:
    source, guard = view.source, view.guard

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
        live = await found(view.timelines.get(ref))
        detail = await found(source.detail(ref, live.journal))
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

    return [Route("/action/{name}", action, methods=["POST"])]


def _field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def _q(text: str) -> str:
    return quote(text, safe="")
