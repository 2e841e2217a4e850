"""A call's answer as server-sent events: its output while it runs, then its result.

A request with ``Accept: text/event-stream`` is answered with a ``text/event-stream`` body of events, each one
JSON ``data`` line:

- ``output``: ``{"stream": "stdout"|"stderr", "text": ...}``, a piece of the call's output as the provider gave it
  (``Capability.OUTPUT_STREAMING``, ``providers/streaming.py``), decoded as UTF-8; up to
  ``Limits.max_streamed_bytes`` per call, then one ``{"stream", "text": "", "cut": true}`` and no more pieces
  (the result still has what the journal keeps). When nothing was streamed (a call answered from the journal,
  a provider that gives its output only at the end) the result's stdout and stderr are sent as ``output`` events at
  once, before it;
- ``result``: the journaled answer, exactly the JSON a request without the header gets (``CallAnswer``);
- ``error``: ``{"error": {...}}``, the refusal a request without the header gets, when the call failed after its
  output began. A refusal before any output (401, 403, 404, 409, 429...) is the plain JSON refusal with its status.

The call runs in a task of its own: a caller that goes away mid-stream leaves it to finish and be journaled, so
sending the same request again (same operationId) answers with the journaled result.
"""

from __future__ import annotations

import asyncio
import codecs
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from durable_sandbox.providers.streaming import OutputSink, Stream
from durable_sandbox.sessions.models import CallAnswer

__all__ = ["EVENT_STREAM", "stream_answer", "wants_events"]

EVENT_STREAM = "text/event-stream"
_Piece = tuple[Stream, str, bool] | None  # (stream, text, cut); None: the call has ended


def wants_events(accept: str | None) -> bool:
    return accept is not None and any(part.split(";")[0].strip() == EVENT_STREAM for part in accept.split(","))


class _Output:
    """The pieces of one call's output, decoded per stream and bounded in total."""

    def __init__(self, limit: int, queue: asyncio.Queue[_Piece]) -> None:
        self.left = limit
        self.queue = queue
        self.decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in ("stdout", "stderr")}
        self.streamed = False
        self.cut = False

    def __call__(self, stream: Stream, data: bytes) -> None:
        if self.cut or not data:
            return
        self.streamed = True
        if len(data) > self.left:
            data, self.cut = data[:self.left], True
        self.left -= len(data)
        text = self.decoders[stream].decode(data)
        if text:
            self.queue.put_nowait((stream, text, False))
        if self.cut:
            self.queue.put_nowait((stream, "", True))

    def rest(self) -> list[tuple[Stream, str]]:
        """What the decoders still hold (a character cut in the middle at the end)."""
        if self.cut:
            return []
        return [(s, text) for s, d in self.decoders.items() if (text := d.decode(b"", final=True))]  # type: ignore[misc]


def _event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def stream_answer(run: Callable[[OutputSink], Awaitable[CallAnswer]],
                        fail: Callable[[Exception], JSONResponse], detached: set[asyncio.Task[Any]],
                        limit: int) -> Response:
    """Run the call (``run(sink)``) and answer with its events; a refusal before any output as plain JSON."""
    queue: asyncio.Queue[_Piece] = asyncio.Queue()
    output = _Output(limit, queue)
    task = asyncio.ensure_future(run(output))
    detached.add(task)  # kept until it ends, whether or not the caller still listens
    task.add_done_callback(detached.discard)
    task.add_done_callback(lambda t: queue.put_nowait(None))
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: a caller gone is no error
    first = await queue.get()
    if first is None and not task.cancelled() and isinstance(task.exception(), Exception):
        return fail(task.exception())  # type: ignore[arg-type]
    return StreamingResponse(_events(first, queue, task, output, fail), media_type=EVENT_STREAM,
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _events(first: _Piece, queue: asyncio.Queue[_Piece], task: asyncio.Future[CallAnswer], output: _Output,
                  fail: Callable[[Exception], JSONResponse]) -> AsyncIterator[bytes]:
    piece = first
    while piece is not None:
        stream, text, cut = piece
        yield _event("output", {"stream": stream, "text": text, **({"cut": True} if cut else {})})
        piece = await queue.get()
    for stream, text in output.rest():
        yield _event("output", {"stream": stream, "text": text})
    if task.cancelled():
        exc: BaseException | None = asyncio.CancelledError("the call was cancelled")
    else:
        exc = task.exception()
    if exc is not None:
        refused = fail(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
        yield _event("error", json.loads(bytes(refused.body)))
        return
    answer = task.result()
    if not output.streamed:  # answered from the journal, or a provider that gives its output at the end
        for stream, text in (("stdout", answer.stdout), ("stderr", answer.stderr)):
            if text:
                yield _event("output", {"stream": stream, "text": text})
    yield _event("result", answer.model_dump(exclude_none=True))
