"""A shell call's output while it runs: the sink a caller gives, and how a provider reaches it.

A provider that declares ``Capability.OUTPUT_STREAMING`` hands each piece of a shell call's stdout and stderr to
:func:`current_sink` (when one is set) as it arrives, before the call returns, and in order: the pieces of one
stream joined are that stream of the call's result (before the result's cap). A provider without it gives its
output only in the result; callers then have it at the end. The sink is set by whoever wants the output
(:func:`streaming_to`, around one call); a context variable rather than an argument of ``execute`` so that every
provider keeps the one ``execute`` of the contract, and only the call made inside ``streaming_to`` streams (a
replay after a loss, made outside it, never does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Literal, Protocol

__all__ = ["OutputSink", "Stream", "current_sink", "streaming_to"]

Stream = Literal["stdout", "stderr"]


class OutputSink(Protocol):
    """Takes a piece of a call's output (raw bytes, as the process wrote them). Must not block or raise."""

    def __call__(self, stream: Stream, data: bytes) -> None: ...


_SINK: ContextVar[OutputSink | None] = ContextVar("durable_sandbox_output_sink", default=None)


def current_sink() -> OutputSink | None:
    """The sink of the call being made in this context, if its caller wants the output while it runs."""
    return _SINK.get()


@contextlib.contextmanager
def streaming_to(sink: OutputSink | None) -> Iterator[None]:
    """Calls made inside stream their output to ``sink`` (None: to nobody)."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)
