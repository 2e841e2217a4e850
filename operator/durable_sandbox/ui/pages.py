"""The web view's pages: the runs list, a run, the sandboxes; and the root and health check."""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from durable_sandbox.ui.view import PER_PAGE, STATUSES, View, found, query_of, ref_of

__all__ = ["page_routes"]


def page_routes(view: View) -> list[Route]:
    source = view.source

    async def runs_page(request: Request) -> Response:
        query = query_of(request)
        page = await source.list_runs(query)
        kept = [(k, v) for k, v in request.query_params.multi_items() if k != "page"]

        def page_link(n: int) -> str:
            return "/runs?" + urlencode([*kept, ("page", str(n))])

        return view.page("runs.html", request, page=page, query=query, statuses=STATUSES, per_page=PER_PAGE,
                         label_text=request.query_params.get("label", ""), qs=request.url.query, page_link=page_link)

    async def run_page(request: Request) -> Response:
        ref = ref_of(request)
        # The live timeline first: the header is built from the journal it read (a long run's is read once).
        live = await found(view.timelines.get(ref))
        detail = await found(source.detail(ref, live.journal))
        flash = view.flashes.get(request.query_params.get("flash", ""))
        return view.page("run.html", request, d=detail, flash=flash)

    async def sandboxes_page(request: Request) -> Response:
        rows, note = await source.sandboxes()
        show_all = request.query_params.get("all") == "1"
        shown = rows if show_all else [r for r in rows if r.kind == "resource" or r.state not in ("finalized", "none")]
        return view.page("sandboxes.html", request, rows=shown, hidden=len(rows) - len(shown), note=note,
                         show_all=show_all)  # fmt: skip

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def root(request: Request) -> Response:
        return RedirectResponse("/runs", status_code=303)

    return [
        Route("/", root),
        Route("/healthz", healthz),
        Route("/runs", runs_page),
        Route("/run", run_page),
        Route("/sandboxes", sandboxes_page),
    ]
