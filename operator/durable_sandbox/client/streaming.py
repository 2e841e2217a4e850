"""A shell call's output while it runs, from the call API's server-sent events (``sessions/streaming.py``).

``stream()`` yields :class:`Output` pieces as the sandbox prints them, then the call's :class:`CallResult` (the
journaled one, as ``run`` returns it). A dropped connection, or a refusal the API marks ``retry``, sends the
same request again with the same operation id (as ``run`` does): the call is not run again when it completed (the
journaled output comes at once), and only the output not yet yielded is yielded (the text after what each stream
gave before), so a printer never prints a line twice.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from durable_sandbox.client.wire import CallResult, SandboxCallError, _error_of, _retry_after, _Target

__all__ = ["Output", "async_events", "sync_events"]

ACCEPT: Final[Mapping[str, str]] = {"Accept": "text/event-stream"}


@dataclass(frozen=True)
class Output:
    """A piece of a call's output: ``stream`` is ``"stdout"`` or ``"stderr"``. ``cut``: the API streams no more of
    this call's output (over its bound); the result has what the journal keeps."""

    stream: str
    text: str
    cut: bool = False


@dataclass
class _Delivered:
    """What each stream has yielded so far, across the attempts of one call."""

    sizes: dict[str, int] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)  # in this attempt

    def restart(self) -> None:
        self.seen = {}

    def new_part(self, stream: str, text: str) -> str:
        before = self.seen.get(stream, 0)
        self.seen[stream] = before + len(text)
        skip = max(self.sizes.get(stream, 0) - before, 0)
        fresh = text[skip:]
        self.sizes[stream] = max(self.sizes.get(stream, 0), self.seen[stream])
        return fresh


def _parse(lines: Iterable[str], pending: dict[str, str]) -> Iterator[tuple[str, Any]]:
    for line in lines:
        if not line:
            if "data" in pending:
                yield pending.get("event", "message"), json.loads(pending["data"])
            pending.clear()
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            pending[key] = value[1:] if value.startswith(" ") else value


def _handle(event: str, data: Any, delivered: _Delivered) -> Output | CallResult | SandboxCallError | None:
    if event == "output":
        text = delivered.new_part(str(data["stream"]), str(data.get("text", "")))
        cut = bool(data.get("cut"))
        return Output(str(data["stream"]), text, cut) if text or cut else None
    if event == "result":
        return CallResult.of(data)
    if event == "error":
        error = data.get("error") or {}
        return SandboxCallError(int(error.get("status", 500)), error)
    return None


async def async_events(http: httpx.AsyncClient, target: _Target, body: dict[str, Any],
                       retry_for: float) -> AsyncIterator[Output | CallResult]:
    """The events of one shell call (``body`` with its operationId), retried as the module says."""
    started, attempt, delivered = time.monotonic(), 0, _Delivered()
    refused: SandboxCallError | None = None
    while True:
        delivered.restart()
        outcome: httpx.Response | Exception
        try:
            async with http.stream("POST", target.path("shell"), json=body, headers={**target.headers(), **ACCEPT}) as answer:
                if answer.status_code >= 400:
                    await answer.aread()
                    outcome = answer
                else:
                    pending: dict[str, str] = {}
                    async for line in answer.aiter_lines():
                        for item in _line_items(line, pending, delivered):
                            yield item
                            if isinstance(item, CallResult):
                                return
                    outcome = httpx.RemoteProtocolError("the event stream ended before the call's result")
        except httpx.TransportError as exc:
            outcome, refused = exc, getattr(exc, "refused", refused)
        wait = _retry_after(outcome, attempt, started, retry_for)
        if wait is None:
            raise _error_of(outcome) if isinstance(outcome, httpx.Response) else refused or outcome
        await asyncio.sleep(wait)
        attempt += 1


class _RetryAfterOutput(httpx.RemoteProtocolError):
    """The call failed after its output began, and may be asked again: the same request is sent again."""

    def __init__(self, refused: SandboxCallError) -> None:
        super().__init__(str(refused))
        self.refused = refused


def _line_items(line: str, pending: dict[str, str], delivered: _Delivered) -> Iterator[Output | CallResult]:
    """What one line of the event stream completes: output not yielded before, or the call's result. A refusal
    raises: a final one as itself, one that may be retried as a transport error that carries it."""
    for event, data in _parse([line], pending):
        item = _handle(event, data, delivered)
        if isinstance(item, SandboxCallError):
            if not item.error.get("retry"):
                raise item
            raise _RetryAfterOutput(item)
        if item is not None:
            yield item


def sync_events(http: httpx.Client, target: _Target, body: dict[str, Any],
                retry_for: float) -> Iterator[Output | CallResult]:
    """:func:`async_events`, blocking."""
    started, attempt, delivered = time.monotonic(), 0, _Delivered()
    refused: SandboxCallError | None = None
    while True:
        delivered.restart()
        outcome: httpx.Response | Exception
        try:
            with http.stream("POST", target.path("shell"), json=body, headers={**target.headers(), **ACCEPT}) as answer:
                if answer.status_code >= 400:
                    answer.read()
                    outcome = answer
                else:
                    pending: dict[str, str] = {}
                    for line in answer.iter_lines():
                        for item in _line_items(line, pending, delivered):
                            yield item
                            if isinstance(item, CallResult):
                                return
                    outcome = httpx.RemoteProtocolError("the event stream ended before the call's result")
        except httpx.TransportError as exc:
            outcome, refused = exc, getattr(exc, "refused", refused)
        wait = _retry_after(outcome, attempt, started, retry_for)
        if wait is None:
            raise _error_of(outcome) if isinstance(outcome, httpx.Response) else refused or outcome
        time.sleep(wait)
        attempt += 1
