"""A run's timeline as JSON (``/api/timeline``) and the journal records behind one of its items (``/api/record``),
values masked (:mod:`ui.redact`) and bounded."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from durable_sandbox.ui.redact import redact
from durable_sandbox.ui.render import BOUND, bounded_json, bounded_text
from durable_sandbox.ui.view import View, found, ref_of

__all__ = ["record_routes"]


def record_routes(view: View) -> list[Route]:
    source = view.source

    async def timeline(request: Request) -> Response:
        ref = ref_of(request)
        live = await found(view.timelines.get(ref))
        await view.timelines.refresh(live)
        head = await found(source.head(ref))
        tl = live.timeline
        progress = request.query_params.get("progress") == "1"
        return JSONResponse({
            "gen": live.gen, "v": len(live.log), "base": tl.base, "lanes": [lane.to_json() for lane in tl.lanes],
            "items": [i.to_json(tl.base) for i in tl.sorted_items(progress=progress)], "status": head.status,
            "terminal": head.terminal, "live": head.live, "omitted": tl.omitted,
        })  # fmt: skip

    async def record(request: Request) -> Response:
        """The records behind one timeline item: every journal row of its operation (each attempt), or
        the event; values masked (:mod:`ui.redact`) and bounded."""
        ref = ref_of(request)
        key = request.query_params.get("key", "")
        live = await found(view.timelines.get(ref))
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
            out["rows"] = [row_json(r) for r in rows]
            if item.of is not None:
                out["replayOf"] = item.of
        elif key in live.events:
            ev = live.events[key]
            out["event"] = bounded_json(ev.to_json())
        elif key in live.object_events:
            out["event"] = bounded_json(live.object_events[key])
        return JSONResponse(out)

    return [Route("/api/timeline", timeline), Route("/api/record", record)]


def row_json(row: Any) -> dict[str, Any]:
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
